"""Several runs side by side: the tables behind an ablation (``ppo-train --compare DIR...``).

Each ``DIR`` is a run directory (``ppo-train`` output) or a report folder (``ppo-train --report``
output: ``eval_before.jsonl.gz`` and ``eval_after.jsonl.gz`` beside ``metrics.jsonl``). From the files
alone it computes, as Markdown:

- one row per run: its algorithm, greedy accuracy before -> after with the exact McNemar test,
  training reward, sampled and greedy response length, KL to the reference;
- every pair of runs after training, on the same problems: the exact McNemar test of run A's
  outcomes against run B's (which problems one solves and the other does not);
- greedy response length split by outcome, before and after: the length-bias question of
  GRPO vs Dr. GRPO (handout.md section 8) is about how the length of *wrong* answers moves.

The figure of reward, length and KL per step is ``runlog.compare_runs``'s.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path
from typing import Any

from assignment.trainer.report import AFTER, BEFORE, eval_pair
from assignment.trainer.runlog import METRICS, REWARD_WINDOW, RunFileError, read_jsonl, run_label
from assignment.trainer.stats import McNemar, mcnemar_exact


def evaluations(folder: Path) -> tuple[list[dict], list[dict]]:
    """The per-problem greedy records before and after training of a report folder or a run
    directory (the same problems, in order). Raises FileNotFoundError where there are none, and
    RunFileError where a file is empty or unreadable."""
    for before, after in ((folder / BEFORE, folder / AFTER),
                          (folder / "eval_before.jsonl", folder / "eval_after.jsonl")):  # a folder of an older version
        if before.is_file() and after.is_file():
            records = read_jsonl(before), read_jsonl(after)
            if not all(records):
                raise RunFileError(f"{before if not records[0] else after} holds no evaluation records")
            return records
    first, last, *_ = eval_pair(folder)
    return first, last


def mean_or_none(values: list[float]) -> float | None:
    """The mean of ``values``; None for none."""
    return sum(values) / len(values) if values else None


def window_mean(metrics: list[dict], key: str, last: bool) -> float | None:
    """The mean of metric ``key`` over a run's first (or, with ``last``, last) REWARD_WINDOW steps;
    None where those steps did not log it."""
    rows = metrics[-REWARD_WINDOW:] if last else metrics[:REWARD_WINDOW]
    return mean_or_none([m[key] for m in rows if key in m])


def _length_by_outcome(records: list[dict], correct: bool) -> tuple[float | None, int]:
    lengths = [r["length"] for r in records if bool(r["correct"]) == correct and "length" in r]
    return mean_or_none(lengths), len(lengths)


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``; 'n/a' for None."""
    return "n/a" if value is None else format(value, spec)


def _p(test: McNemar) -> str:
    return f"{test.p_value:.2g}"


def compare_tables(folders: list[Path]) -> str:
    """The three Markdown tables above for ``folders`` (each a run directory or report folder)."""
    runs: list[dict[str, Any]] = []
    for folder in folders:
        metrics = read_jsonl(folder / METRICS)
        if not metrics:
            raise FileNotFoundError(f"{folder} holds no {METRICS}: not a run directory or report folder")
        before, after = evaluations(folder)
        runs.append({"label": run_label(folder), "metrics": metrics, "before": before, "after": after,
                     "test": mcnemar_exact([r["correct"] for r in before], [r["correct"] for r in after])})

    w = REWARD_WINDOW
    lines = [f"| run | greedy accuracy (n) | improved / regressed, McNemar p | training reward, first / last {w} steps "
             f"| sampled length, first / last {w} | greedy length before -> after | greedy answers cut at the limit, "
             f"after | KL nats/seq, last {w} (max) |", "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        m, t, after = run["metrics"], run["test"], run["after"]
        kl_max = max((x["rollout/kl"] for x in m if "rollout/kl" in x), default=None)
        lengths = [mean_or_none([r["length"] for r in records if "length" in r]) for records in (run["before"], after)]
        cut = sum(not r.get("finished", True) for r in after) / len(after)
        lines.append(
            f"| {run['label']} | {t.before / t.n:.1%} -> {t.after / t.n:.1%} ({t.n}) | {t.c} / {t.b}, p = {_p(t)} "
            f"| {fmt(window_mean(m, 'rollout/reward_mean', False), '.3f')} / {fmt(window_mean(m, 'rollout/reward_mean', True), '.3f')} "
            f"| {fmt(window_mean(m, 'rollout/response_length', False), '.0f')} / {fmt(window_mean(m, 'rollout/response_length', True), '.0f')} "
            f"| {fmt(lengths[0], '.0f')} -> {fmt(lengths[1], '.0f')} | {cut:.1%} "
            f"| {fmt(window_mean(m, 'rollout/kl', True), '.1f')} ({fmt(kl_max, '.1f')}) |")

    lines += ["", "Cut at the limit: greedy answers that reached rollout.max_new_tokens before an EOS. The reward "
              "still reads the last answer marker of what was written, so a cut answer can be right: where answers "
              "need the whole budget (the synthetic task's 4 tokens), nearly all are cut."]
    levels = [(run["label"], run["metrics"][-1].get("rollout/max_operand")) for run in runs]
    if any(level is not None for _, level in levels):  # the synthetic task's curriculum (data.curriculum_*)
        lines += ["", "Curriculum at the last step (rollout/max_operand: training sums use operands up to it; greedy "
                  "evaluation always uses the full range): " + ", ".join(f"{label} {fmt(level, 'g')}" for label, level
                                                                          in levels) + ". Runs that reached different "
                  "levels trained on different sums: compare their curves with that in mind."]
    lines += ["", "After training, run A against run B on the same problems (exact McNemar test):", "",
              "| A | B | A right, B wrong | A wrong, B right | p |", "|---|---|---|---|---|"]
    for a, b in combinations(runs, 2):
        if [r["question"] for r in a["after"]] != [r["question"] for r in b["after"]]:
            lines.append(f"| {a['label']} | {b['label']} | not the same problems | | |")
            continue
        t = mcnemar_exact([r["correct"] for r in b["after"]], [r["correct"] for r in a["after"]])
        lines.append(f"| {a['label']} | {b['label']} | {t.c} | {t.b} | {_p(t)} |")

    lines += ["", "Greedy response length (tokens) by outcome, before -> after training (how many answers):", "",
              "| run | correct answers | wrong answers |", "|---|---|---|"]
    for run in runs:
        cells = []
        for correct in (True, False):
            (l0, n0), (l1, n1) = (_length_by_outcome(run[k], correct) for k in ("before", "after"))
            cells.append(f"{fmt(l0, '.0f')} ({n0}) -> {fmt(l1, '.0f')} ({n1})")
        lines.append(f"| {run['label']} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"

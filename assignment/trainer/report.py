"""Turn a run directory into a Markdown report and a folder of the files behind every figure
(``ppo-train --report RUN_DIR --report-out OUT.md``).

``OUT.md`` holds the headline figures, the commands and machine with the wall time of
each invocation, a table of training metrics (mean of the first and last ``REWARD_WINDOW`` PPO
steps), the reward curve (``OUT.png``), greedy evaluation before and after training
with the exact McNemar test on the paired outcomes, and samples of problems that improved,
regressed and stayed the same. The folder ``OUT`` holds ``summary.json`` (every headline figure),
``eval_before.jsonl.gz`` and ``eval_after.jsonl.gz`` (gzip-compressed JSONL, one record per
problem: question, reference, response, answer, correct, ...; ``runlog.read_jsonl`` reads them,
as does ``zcat``), ``eval_step_N.jsonl.gz`` for each evaluation between them (``eval.every``: a
longer run's earlier model, tabled beside the first and the last and paired with both),
``metrics.jsonl``, ``config.yaml`` and ``run.json``: each figure of the summary can be
recomputed from these files (``summarize``). When the final evaluation was stopped unfinished,
both evaluation files hold the problems it reached, in order, and ``eval_before_all.jsonl.gz``
the whole first evaluation.

Wall time: each invocation's entry in ``run.json`` is kept current as the run goes
(``runlog.Progress``), so an invocation killed from outside still counts up to its last
finished step or evaluation batch; an entry from before that bookkeeping, killed, has no time
at all, and the report says so. Staging (copying the model and data to the device) happens
outside the run: pass its seconds as ``--staging-seconds``.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from assignment.trainer.runlog import (EVAL_RECORDS, EVALS, METRICS, REWARD_WINDOW, eval_step_of, eval_records_path, plot_run,
                                       read_jsonl, write_gz)
from assignment.trainer.stats import mcnemar_exact

# The *_first keys are the first minibatch's alone (ppo.FIRST_MINIBATCH_KEYS), 0 in a correct
# run: beside the step means they show at a glance that the update's ratio started at 1. A run
# logged before they existed simply has no row for them.
TRAINING_KEYS = ["rollout/reward_mean", "rollout/correct_rate", "rollout/format_rate", "rollout/response_length",
                 "rollout/length_correct", "rollout/length_wrong",
                 "rollout/truncated_rate", "rollout/kl", "rollout/kl_coeff", "stats/approx_kl",
                 "stats/approx_kl_first", "stats/policy_clipfrac", "stats/policy_clipfrac_first",
                 "stats/advantage_max", "loss/value", "time/rollout", "time/update", "memory/peak_memory_gib"]
BUNDLE_FILES = ("metrics.jsonl", "config.yaml", "run.json")
# A report folder's per-problem evaluations (gzip-compressed: ``runlog.write_gz``).
# Each evaluation between the first and the last: eval_step_N.jsonl.gz.
BEFORE, AFTER, BEFORE_ALL = "eval_before.jsonl.gz", "eval_after.jsonl.gz", "eval_before_all.jsonl.gz"


class ReportError(ValueError):
    """A run folder whose evaluations cannot be paired: the CLI prints it, without a traceback."""


def _mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else float("nan")


def _max(rows: list[dict], *keys: str) -> float | None:
    """The largest value of any of ``keys`` over ``rows`` (None where no row has one)."""
    values = [r[key] for r in rows for key in keys if key in r]
    return max(values) if values else None


def _block(text: str) -> str:
    return "```\n" + text.strip().replace("```", "'''") + "\n```"


def eval_pair(run_dir: Path) -> tuple[list[dict], list[dict], int, int, int]:
    """The per-problem records of the first finished evaluation and of the last evaluation, their
    steps, and how many problems the first one holds.

    The last evaluation may be unfinished (its invocation was stopped inside it and never
    resumed): its records file then holds the problems it reached, in order, and both lists are cut
    to those problems, so the pairs stay the same problems before and after."""
    steps = [e["step"] for e in read_jsonl(run_dir / EVALS)]
    if not steps:
        raise FileNotFoundError(f"{run_dir} has no finished evaluation in {EVALS}")
    started = [p for p in (run_dir / EVAL_RECORDS).glob("step_*.jsonl") if p.stat().st_size > 0]
    last = max((eval_step_of(p) for p in started), default=steps[-1])
    if last <= steps[0]:
        raise FileNotFoundError(f"{run_dir} has no evaluation after step {steps[0]}")
    before, after = (read_jsonl(eval_records_path(run_dir, step)) for step in (steps[0], last))
    _check_same_problems(run_dir, (steps[0], before), (last, after))
    return before[:len(after)], after, steps[0], last, len(before)


def evals_between(run_dir: Path, before: list[dict], step_before: int, step_after: int) -> dict[int, list[dict]]:
    """The per-problem records of each finished evaluation strictly between the steps of
    ``eval_pair``: {step: records}, each list in ``before``'s order and as long (cut to the
    problems an unfinished last evaluation reached). Raises ReportError for an evaluation that
    holds fewer problems or other ones."""
    between = {}
    for step in (e["step"] for e in read_jsonl(run_dir / EVALS)):
        if step_before < step < step_after:
            records = read_jsonl(eval_records_path(run_dir, step))[:len(before)]
            if len(records) < len(before):
                raise ReportError(f"{run_dir}: the evaluation at step {step} holds {len(records)} problems, "
                                  f"fewer than the {len(before)} the report pairs")
            _check_same_problems(run_dir, (step_before, before), (step, records))
            between[step] = records
    return between


def _check_same_problems(run_dir: Path, old: tuple[int, list[dict]], new: tuple[int, list[dict]]) -> None:
    """Raise ReportError unless the records of ``new`` (step, records) are the first problems of
    ``old``'s, in the same order: the only outcomes a paired test may compare."""
    (step_old, records_old), (step_new, records_new) = old, new
    if [r["question"] for r in records_new] != [r["question"] for r in records_old[:len(records_new)]]:
        raise ReportError(f"{run_dir}: the evaluations at steps {step_old} and {step_new} are not the same problems")


def _paired(old: list[dict], new: list[dict]) -> dict[str, Any]:
    """The exact McNemar test from ``old`` to ``new`` (records of the same problems, in order):
    improved = wrong in ``old`` and right in ``new``, regressed the reverse, and the two-sided p."""
    test = mcnemar_exact([r["correct"] for r in old], [r["correct"] for r in new])
    return {"improved": test.c, "regressed": test.b, "mcnemar_p": test.p_value}


def _eval_figures(records: list[dict]) -> dict[str, Any]:
    n = len(records)
    markers = [r.get("marker") for r in records]
    return {"accuracy": sum(bool(r["correct"]) for r in records) / n,
            "answer_rate": sum(r["answer"] is not None for r in records) / n,
            "boxed_rate": markers.count("boxed") / n,
            # an answer cut by the token limit has usually not been given yet: tells a model that
            # got worse at arithmetic from one that got wordier
            "finished_rate": sum(bool(r["finished"]) for r in records) / n,
            "response_length": sum(r["length"] for r in records) / n if all("length" in r for r in records) else None}


def _wall_time(runs: list[dict], staging_seconds: float | None) -> dict[str, Any]:
    """Seconds per part of the run, summed over invocations from what ``run.json`` recorded."""
    wall = sum(r.get("seconds", 0.0) for r in runs)
    train, evaluation = (sum(r.get(f"{kind}_seconds", 0.0) for r in runs) for kind in ("train", "eval"))
    unrecorded = sum("seconds" not in r for r in runs)
    return {"staging": staging_seconds, "training": train, "evaluation": evaluation,
            "other": wall - train - evaluation, "wall": wall, "invocations": len(runs),
            "invocations_without_time": unrecorded}


def summarize(run_dir: Path, staging_seconds: float | None = None, pair: tuple | None = None) -> dict[str, Any]:
    """The headline figures of the run in ``run_dir``, each computed from its files alone
    (``pair``: what ``eval_pair(run_dir)`` returns, when the caller has read it already)."""
    from assignment.trainer.config import load_config

    runs = json.loads((run_dir / "run.json").read_text())
    metrics = read_jsonl(run_dir / METRICS)
    if not metrics:
        raise FileNotFoundError(f"{run_dir} has no {METRICS}: not a run")
    cfg = load_config(run_dir / "config.yaml")
    before, after, step_before, step_after, planned = pair or eval_pair(run_dir)
    test = mcnemar_exact([r["correct"] for r in before], [r["correct"] for r in after])
    fig_before, fig_after = _eval_figures(before), _eval_figures(after)
    first, last = metrics[:REWARD_WINDOW], metrics[-REWARD_WINDOW:]
    seconds = _wall_time(runs, staging_seconds)
    between = [{"step": step, **_eval_figures(records), "from_before": _paired(before, records),
                "to_after": _paired(records, after)}
               for step, records in evals_between(run_dir, before, step_before, step_after).items()]
    return {
        "card": " / ".join(dict.fromkeys(r["device"] for r in runs)),
        "world_size": max(_world_size(r) for r in runs), "algorithm": cfg.algorithm, "n": test.n, "n_planned": planned,
        "steps": len(metrics), "eval_steps": [step_before, step_after],
        "accuracy_before": fig_before["accuracy"], "accuracy_after": fig_after["accuracy"],
        "improved": test.c, "regressed": test.b, "mcnemar_p": test.p_value, "evals_between": between,
        "answer_rate_before": fig_before["answer_rate"], "answer_rate_after": fig_after["answer_rate"],
        "boxed_rate_before": fig_before["boxed_rate"], "boxed_rate_after": fig_after["boxed_rate"],
        "finished_rate_before": fig_before["finished_rate"], "finished_rate_after": fig_after["finished_rate"],
        "response_length_before": fig_before["response_length"], "response_length_after": fig_after["response_length"],
        "reward_first10": _mean(first, "rollout/reward_mean"), "reward_last10": _mean(last, "rollout/reward_mean"),
        "correct_rate_first10": _mean(first, "rollout/correct_rate"), "correct_rate_last10": _mean(last, "rollout/correct_rate"),
        "sampled_length_first10": _mean(first, "rollout/response_length"),
        "sampled_length_last10": _mean(last, "rollout/response_length"),
        "kl_final": metrics[-1]["rollout/kl"], "kl_last10": _mean(last, "rollout/kl"),
        "kl_max": max(m["rollout/kl"] for m in metrics),
        "kl_budget": {"adaptive": cfg.kl.adaptive, "target": cfg.kl.target,
                      "coeff_start": metrics[0].get("rollout/kl_coeff"), "coeff_end": metrics[-1].get("rollout/kl_coeff"),
                      "horizon": cfg.kl.horizon, "ppo_target_kl": cfg.ppo.target_kl},
        "early_stops": int(sum(m.get("stats/early_stop", 0) for m in metrics)),
        "skipped_updates": int(sum(m.get("stats/update_skipped", 0) for m in metrics)),
        "answer_format": cfg.reward.answer_format, "seconds": seconds,
        # what the training reward paid for (reward.kind: correct, or a control), and the random control's p
        "reward_kind": cfg.reward.kind, "reward_random_p": cfg.reward.random_p if cfg.reward.kind == "random" else None,
        # who decoded the greedy evaluations: the policy's own weights (null) or its 16-bit sampler copy
        "eval_model": cfg.eval.model,
        "eval_dtype": cfg.rollout.generation_dtype if cfg.eval.model == "sampler" else cfg.model.dtype,
        # None where the run logged no GPU memory (CPU runs, runs from before it was logged)
        "peak_memory_gib_step": _max(metrics, "memory/peak_memory_gib"),
        "peak_memory_gib_eval": _max(read_jsonl(run_dir / EVALS), "eval/peak_memory_gib"),
        "peak_reserved_gib": _max(metrics + read_jsonl(run_dir / EVALS), "memory/peak_reserved_gib", "eval/peak_reserved_gib"),
        # train.max_gpu_memory_gib of every invocation (None: no cap), as run.json records it
        "memory_cap_gib": [r.get("max_gpu_memory_gib") for r in runs],
        "seconds_per_step_median": statistics.median(m["time/rollout"] + m["time/update"] for m in metrics),
        "gpu_seconds": seconds["wall"] + (staging_seconds or 0.0),
    }


def _invocation_line(run: dict) -> str:
    """One invocation: command, machine, versions, and how long it ran (and how it ended)."""
    status = run.get("status")
    if "seconds" not in run:
        time_text = "no end time recorded (killed before it could write one, e.g. by a command limit)"
    elif status == "running":
        time_text = f"killed: at least {run['seconds']:.0f} s (to its last finished step or eval batch)"
    else:
        time_text = f"wall time {run['seconds']:.0f} s" + (f", {status}" if status else "")
    parts = [f"{run[k]:.0f} s {k.removesuffix('_seconds')}" for k in ("train_seconds", "eval_seconds") if k in run]
    detail = f" ({', '.join(parts)})" if parts else ""
    machine = _machine(run["device"], _world_size(run))
    return (f"- `{run['command']}`{' (resumed)' if run['resume'] else ''}: {machine}, torch {run['torch']}, "
            f"transformers {run['transformers']}, started {run['started']}, {time_text}{detail}")


def _world_size(run: dict) -> int:
    """The processes of one invocation (a run.json written before world_size was recorded: 1)."""
    return run.get("world_size", 1)


def _machine(card: str, world_size: int) -> str:
    """The card, and for a data-parallel job its processes, one per card (run.json's command is the
    trainer's own, without the launcher around it)."""
    return card if world_size == 1 else f"{world_size} data-parallel processes, one {card} each"


def _headline(summary: dict, run_dir: Path) -> list[str]:
    s, t = summary, summary["seconds"]
    staging = f"{t['staging']:.0f} s" if t["staging"] is not None else "not given (pass --staging-seconds)"
    budget = s["kl_budget"]
    target = (f"{'steered to' if budget['adaptive'] else 'fixed coefficient, budget'} {budget['target']:g} "
              "nats/sequence")
    missing = (f" ({t['invocations_without_time']} invocation(s) recorded no time: the sum misses them)"
               if t["invocations_without_time"] else "")
    algorithm = {"ppo": "PPO", "grpo": "GRPO", "dr_grpo": "Dr. GRPO"}[s.get("algorithm", "ppo")]
    return [f"# {algorithm} run report: {run_dir.name}", "", f"**Card: {_machine(s['card'], s['world_size'])}.** Every figure below is computed from the "
            "files of the folder beside this report (`summary.json` lists them).", "", *_control_note(s),
            "| figure | value |", "|---|---|",
            f"| greedy accuracy, {_problems(s)} | {s['accuracy_before']:.4f} -> {s['accuracy_after']:.4f} "
            f"({s['improved']} improved, {s['regressed']} regressed; exact McNemar p = {s['mcnemar_p']:.3g}) |",
            f"| answer rate ({s['answer_format']}) | {s['answer_rate_before']:.4f} -> {s['answer_rate_after']:.4f} |",
            f"| greedy responses ended before the token limit | {s['finished_rate_before']:.4f} -> {s['finished_rate_after']:.4f} |",
            f"| greedy response length (tokens) | {_num(s['response_length_before'])} -> {_num(s['response_length_after'])} |",
            f"| training reward, first / last {REWARD_WINDOW} steps | {s['reward_first10']:.4f} -> {s['reward_last10']:.4f} |",
            f"| KL to the reference (nats/sequence), last step / max | {s['kl_final']:.2f} / {s['kl_max']:.2f}; {target}, "
            f"coefficient {_num(budget['coeff_start'], 4)} -> {_num(budget['coeff_end'], 4)} |",
            f"| updates stopped early (target_kl) / skipped (no reward spread) | {s['early_stops']} / {s['skipped_updates']} of {s['steps']} |",
            f"| peak GPU memory (torch allocator{', process 0' if s['world_size'] > 1 else ''}), training step / "
            f"evaluation | {_num(s['peak_memory_gib_step'])} GiB / "
            f"{_num(s['peak_memory_gib_eval'])} GiB{_cap(s)} |",
            f"| seconds per PPO step (median of rollout + update) | {s['seconds_per_step_median']:.1f} |",
            f"| wall time | staging {staging}; training {t['training']:.0f} s; evaluation {t['evaluation']:.0f} s; "
            f"other (loading, checkpoints) {t['other']:.0f} s; run total {t['wall']:.0f} s{missing} |", ""]


def _control_note(s: dict) -> list[str]:
    """For a run trained under a reward control (reward.kind), what its training reward paid for;
    nothing for the task's reward (a summary from before the kind was recorded: the task's)."""
    kind = s.get("reward_kind", "correct")
    if kind == "correct":
        return []
    paid = {"random": f"a coin of probability {s.get('reward_random_p')} drawn from the seed, the step and the "
                      "response's place in the batch, whatever the response said",
            "format": "any answer found, whatever its value"}[kind]
    return [f"**Reward control: `reward.kind={kind}`.** The training reward paid for {paid}; the sampled correct rate "
            "and every greedy accuracy below are the true outcomes.", ""]


def _cap(s: dict) -> str:
    """The memory cap of the run's invocations (train.max_gpu_memory_gib) and the most the
    allocator reserved under it; nothing for a run without a cap."""
    caps = set(s.get("memory_cap_gib") or [None])
    if caps == {None}:
        return ""
    cap = "none in some invocations" if None in caps else " / ".join(f"{c:g} GiB" for c in sorted(caps))
    return f"; reserved at most {_num(s.get('peak_reserved_gib'))} GiB under a cap of {cap} (train.max_gpu_memory_gib)"


def _problems(s: dict) -> str:
    if s["n"] == s["n_planned"]:
        return f"{s['n']} test problems"
    return (f"the first {s['n']} of {s['n_planned']} test problems (the evaluation after training stopped there; "
            "both columns are over those problems)")


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _training_table(metrics: list[dict]) -> list[str]:
    first, last = metrics[:REWARD_WINDOW], metrics[-REWARD_WINDOW:]
    lines = [f"## Training (mean of the first and last {REWARD_WINDOW} steps)", "",
             "| metric | first | last | last / first |", "|---|---|---|---|"]
    for key in TRAINING_KEYS:
        first_mean, last_mean = _mean(first, key), _mean(last, key)
        if first_mean != first_mean:  # nan: the run did not log this key
            continue
        ratio = f"{last_mean / first_mean:.2f}" if first_mean != 0.0 else "n/a"
        lines.append(f"| {key} | {first_mean:.4f} | {last_mean:.4f} | {ratio} |")
    return lines + [""]


def _findings(s: dict) -> list[str]:
    """What the model learned and what it did not, as the numbers say it (no judgement added)."""
    significant = s["mcnemar_p"] < 0.05
    change = (f"rose from {s['accuracy_before']:.1%} to" if s["accuracy_after"] > s["accuracy_before"] else
              f"fell from {s['accuracy_before']:.1%} to" if s["accuracy_after"] < s["accuracy_before"] else "stayed at")
    lines = ["## What changed", "",
             f"- Greedy accuracy {change} {s['accuracy_after']:.1%}: "
             f"{s['improved']} problems went from wrong to right, {s['regressed']} from right to wrong; "
             + ("a change unlikely under no effect (p < 0.05)." if significant else
                "not distinguishable from no change at the 5% level (p >= 0.05)."),
             f"- Answers found: {s['answer_rate_before']:.1%} -> {s['answer_rate_after']:.1%} of responses "
             f"(\\boxed: {s['boxed_rate_before']:.1%} -> {s['boxed_rate_after']:.1%}).",
             f"- Sampled correct rate during training: {s['correct_rate_first10']:.3f} (first {REWARD_WINDOW} steps) -> "
             f"{s['correct_rate_last10']:.3f} (last {REWARD_WINDOW}); sampled length "
             f"{s['sampled_length_first10']:.0f} -> {s['sampled_length_last10']:.0f} tokens."]
    budget = s["kl_budget"]
    held = "held" if s["kl_last10"] <= budget["target"] else "did not hold"
    lines.append(f"- KL to the reference: {s['kl_last10']:.1f} nats/sequence over the last {REWARD_WINDOW} steps "
                 f"(at most {s['kl_max']:.1f}) against the config's budget of {budget['target']:g}: the budget {held}.")
    return lines + [""]


def _eval_section(summary: dict, before: list[dict], after: list[dict], steps: tuple[int, int]) -> list[str]:
    lines = [f"## Greedy evaluation (answers read as the reward reads them: {summary['answer_format']})", ""]
    if summary.get("eval_model") == "sampler":
        lines += [f"Decoded by the run's {summary['eval_dtype']} copy of the policy (`eval.model=sampler`), before and "
                  "after alike: these accuracies compare with each other, not with a run evaluated by its float32 "
                  "weights.", ""]
    lines += ["| | step | n | accuracy | answer rate | response length |", "|---|---|---|---|---|---|"]
    rows = [("before", steps[0], summary["accuracy_before"], summary["answer_rate_before"], summary["response_length_before"])]
    rows += [("during", e["step"], e["accuracy"], e["answer_rate"], e["response_length"]) for e in summary["evals_between"]]
    rows += [("after", steps[1], summary["accuracy_after"], summary["answer_rate_after"], summary["response_length_after"])]
    lines += [f"| {name} | {step} | {summary['n']} | {accuracy:.4f} | {answers:.4f} | {_num(length)} |"
              for name, step, accuracy, answers, length in rows]
    lines += ["", f"Exact McNemar test on the {summary['n']} paired outcomes: {summary['improved']} improved, "
              f"{summary['regressed']} regressed, two-sided p = {summary['mcnemar_p']:.3g} (binomial test of the "
              "discordant pairs; the same problems before and after).", ""]
    for e in summary["evals_between"]:
        lines += [f"Step {e['step']}, paired the same way: from step {steps[0]}, {_pair_text(e['from_before'])}; "
                  f"to step {steps[1]}, {_pair_text(e['to_after'])}.", ""]
    return lines + _samples(before, after)


def _pair_text(pair: dict) -> str:
    """One ``_paired`` result as the report's prose."""
    return f"{pair['improved']} improved, {pair['regressed']} regressed, p = {pair['mcnemar_p']:.3g}"


def _samples(before: list[dict], after: list[dict], per_kind: int = 2) -> list[str]:
    """The first problems that improved, regressed, stayed right and stayed wrong."""
    kinds = [("Improved (wrong -> right)", False, True), ("Regressed (right -> wrong)", True, False),
             ("Unchanged, right", True, True), ("Unchanged, wrong", False, False)]
    lines = ["## Samples (greedy, the first test problems of each kind)", ""]
    for title, was, now in kinds:
        pairs = [(old, new) for old, new in zip(before, after) if bool(old["correct"]) == was and bool(new["correct"]) == now]
        lines += [f"### {title}: {len(pairs)} problems", ""]
        for old, new in pairs[:per_kind]:
            lines += [f"**Question** (reference answer {old['reference']}):", "", _block(old["question"]), "",
                      f"Before (answer {old['answer']}, correct: {old['correct']}):", "", _block(old["response"]), "",
                      f"After (answer {new['answer']}, correct: {new['correct']}):", "", _block(new["response"]), ""]
    return lines


def render(run_dir: Path, image_name: str, summary: dict, pair: tuple) -> str:
    """The report's Markdown for ``run_dir`` (``pair``: its ``eval_pair``); the reward curve is
    linked as ``image_name``."""
    runs = json.loads((run_dir / "run.json").read_text())
    before, after, step_before, step_after, _ = pair
    lines = _headline(summary, run_dir) + ["## Command and machine", ""]
    lines += [_invocation_line(run) for run in runs] + [""]
    lines += _training_table(read_jsonl(run_dir / METRICS)) + [f"![reward curve]({image_name})", ""]
    lines += _findings(summary) + _eval_section(summary, before, after, (step_before, step_after))
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path, out: Path | None = None, staging_seconds: float | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.md``), the reward-curve
    PNG beside it, and the folder ``out`` without its suffix: summary.json, eval_before.jsonl.gz,
    eval_after.jsonl.gz, eval_step_N.jsonl.gz of each evaluation between them, metrics.jsonl,
    config.yaml, run.json."""
    out = out or run_dir / "report.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    pair = eval_pair(run_dir)
    summary = summarize(run_dir, staging_seconds, pair)
    bundle = out.with_suffix("")
    bundle.mkdir(exist_ok=True)
    for stale in bundle.glob("eval_*.jsonl*"):  # an earlier report's, or an older version's plain files
        stale.unlink()
    for name in BUNDLE_FILES:
        _copy(run_dir / name, bundle / name)
    before, after = (eval_records_path(run_dir, step) for step in summary["eval_steps"])
    _compress(after, bundle / AFTER)
    if summary["n"] < summary["n_planned"]:  # an unfinished final evaluation: the figures pair its problems
        _compress(before, bundle / BEFORE_ALL)  # and the whole first one is kept beside
    _compress(before, bundle / BEFORE, summary["n"])
    for e in summary["evals_between"]:
        _compress(eval_records_path(run_dir, e["step"]), bundle / f"eval_step_{e['step']}.jsonl.gz", summary["n"])
    (bundle / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    curve = run_dir / "reward_curve.png"
    if not curve.is_file():
        plot_run(run_dir)
    image = out.with_suffix(".png")
    _copy(curve, image)
    out.write_text(render(run_dir, image.name, summary, pair))
    return out


def _compress(source: Path, target: Path, n: int | None = None) -> None:
    """``source``'s bytes as they are, or only its lines up to its ``n``-th record (the problems
    the figures pair), gzip-compressed into ``target``."""
    data = source.read_bytes()
    if n is not None:
        lines = data.splitlines(keepends=True)
        starts = [i for i, line in enumerate(lines) if line.strip()]  # where each record's line is
        data = b"".join(lines[:starts[n]]) if n < len(starts) else data
    write_gz(data, target)


def _copy(source: Path, target: Path) -> None:
    if source.resolve() != target.resolve():
        shutil.copyfile(source, target)

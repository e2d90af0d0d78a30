"""Turn a finished run directory into a Markdown report (``ppo-train --report RUN_DIR``).

The report holds the command and the machine (from ``run.json``), the wall time, a table of
training metrics (mean of the first and last ``REWARD_WINDOW`` PPO steps), greedy evaluation before and after
training with a two-proportion z-test, the reward curve, and sample generations for the same
test problems before and after. Every number is read from the run's own files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from assignment.trainer.runlog import EVALS, METRICS, REWARD_WINDOW, plot_run, read_jsonl
from assignment.trainer.stats import two_proportion_z_test

TRAINING_KEYS = ["rollout/reward_mean", "rollout/correct_rate", "rollout/format_rate", "rollout/reasoning_rate",
                 "rollout/response_length", "rollout/truncated_rate", "rollout/kl", "stats/approx_kl",
                 "stats/policy_clipfrac", "loss/value", "time/rollout", "time/update"]
NUM_SAMPLES = 3


def _mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else float("nan")


def _block(text: str) -> str:
    return "```\n" + text.strip().replace("```", "'''") + "\n```"


def render(run_dir: Path, image_name: str) -> str:
    """The report's Markdown for ``run_dir``; the reward curve is linked as ``image_name``."""
    runs = json.loads((run_dir / "run.json").read_text())
    metrics, evals = read_jsonl(run_dir / METRICS), read_jsonl(run_dir / EVALS)
    if not metrics:
        raise FileNotFoundError(f"{run_dir} has no {METRICS}: not a finished run")
    first, last = metrics[:REWARD_WINDOW], metrics[-REWARD_WINDOW:]
    seconds = sum(r.get("seconds", 0.0) for r in runs)
    lines = [f"# PPO run report: {run_dir.name}", "",
             "## Command and machine", ""]
    for invocation in runs:
        lines.append(f"- `{invocation['command']}`{' (resumed)' if invocation['resume'] else ''}: "
                     f"{invocation['device']}, torch {invocation['torch']}, "
                     f"transformers {invocation['transformers']}, started {invocation['started']}, "
                     f"wall time {invocation.get('seconds', float('nan')):.0f} s")
    lines += ["", f"Total wall time: {seconds:.0f} s ({seconds / 60:.1f} min) for {len(metrics)} PPO steps, "
              "model loading and evaluations included.", "",
              f"## Training (mean of the first and last {REWARD_WINDOW} PPO steps)", "",
              "| metric | first | last | last / first |", "|---|---|---|---|"]
    for key in TRAINING_KEYS:
        first_mean, last_mean = _mean(first, key), _mean(last, key)
        ratio = f"{last_mean / first_mean:.2f}" if first_mean not in (0.0,) and first_mean == first_mean else "n/a"
        lines.append(f"| {key} | {first_mean:.4f} | {last_mean:.4f} | {ratio} |")
    lines += ["", f"![reward curve]({image_name})", ""]
    if len(evals) >= 2:
        before, after = evals[0], evals[-1]
        test = two_proportion_z_test(int(before["eval/correct"]), int(before["eval/n"]),
                                  int(after["eval/correct"]), int(after["eval/n"]))
        lines += ["## Greedy evaluation (strict: the answer must be on a `#### <number>` line)", "",
                  "| | step | n | strict accuracy | format rate | response length |", "|---|---|---|---|---|---|"]
        for name, record in (("before", before), ("after", after)):
            lines.append(f"| {name} | {record['step']} | {record['eval/n']} | {record['eval/accuracy']:.4f} | "
                         f"{record['eval/format_rate']:.4f} | {record['eval/response_length']:.1f} |")
        lines += ["", f"Two-proportion z-test, after vs before: difference {test.diff:+.4f} "
                  f"(95% CI {test.ci_low:+.4f} to {test.ci_high:+.4f}), z = {test.z:.3f}, "
                  f"two-sided p = {test.p_value:.3g}. "
                  "The same test problems are used before and after, so the samples are paired and this "
                  "test is conservative.", ""]
        lines += _samples(run_dir, before["step"], after["step"])
    return "\n".join(lines) + "\n"


def _samples(run_dir: Path, before_step: int, after_step: int) -> list[str]:
    before = read_jsonl(run_dir / "eval_samples" / f"step_{before_step}.jsonl")
    after = read_jsonl(run_dir / "eval_samples" / f"step_{after_step}.jsonl")
    lines = ["## Sample generations (greedy, the first test problems)", ""]
    for old, new in list(zip(before, after))[:NUM_SAMPLES]:
        lines += [f"**Question** (reference answer {old['reference']}):", "", _block(old["question"]), "",
                  f"Before (correct: {old['correct']}, formatted: {old['formatted']}):", "",
                  _block(old["response"]), "",
                  f"After (correct: {new['correct']}, formatted: {new['formatted']}):", "",
                  _block(new["response"]), ""]
    return lines


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.md``), with the
    reward-curve PNG copied beside it."""
    out = out or run_dir / "report.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    curve = run_dir / "reward_curve.png"
    if not curve.is_file():
        plot_run(run_dir)
    image = out.with_suffix(".png")
    if image.resolve() != curve.resolve():
        shutil.copyfile(curve, image)
    out.write_text(render(run_dir, image.name))
    return out

"""Recompute the ranges of handout.md section 6 ("Reading the training metrics") from measured runs.

    python -m course.metric_ranges                # the course's measured runs (DEFAULT_RUNS)
    python -m course.metric_ranges RUN_DIR ...    # any run folders holding a metrics.jsonl

For every run and every metric of the handout's table it prints, over the run's PPO steps: the
median and the 10th-90th percentile, the value at step 1, the mean of the first and of the last
REWARD_WINDOW steps, and where it matters the share of steps below 0 or above the handout's old
1e-2 approx_kl band; for the 0/1 flags (early stop, skipped update), how many steps had them.
The handout cites these numbers by run name (reports/ is not shipped to students); rerun this
after a new measured run and update the table from its output.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import yaml

from assignment.trainer.runlog import METRICS, REWARD_WINDOW, level_changes, read_jsonl

ROOT = Path(__file__).resolve().parent.parent
# name in the handout -> folder with the run's metrics.jsonl
DEFAULT_RUNS = {
    "CPU demo, seed 0 (400 steps)": ROOT / "reports/cpu_synthetic_metrics/seed0",
    "CPU demo, seed 1 (400 steps)": ROOT / "reports/cpu_synthetic_metrics/seed1",
    "CPU demo, seed 2 (400 steps)": ROOT / "reports/cpu_synthetic_metrics/seed2",
    "SmolLM2-135M GSM8K run 1 (80 steps, lr 3e-6)": ROOT / "reports/gsm8k_smollm2_run1",
    "SmolLM2-135M GSM8K run 2 (80 steps, lr 1e-5)": ROOT / "reports/gsm8k_smollm2_run2",
    "Qwen2.5-Coder-0.5B GSM8K run 1 (48 steps, KL target 10)": ROOT / "reports/gsm8k_qwen_coder_run1",
    "Qwen2.5-Coder-0.5B GSM8K run 2 (48 steps, KL target 30)": ROOT / "reports/gsm8k_qwen_coder_run2",
    "Qwen2.5-Coder-0.5B GSM8K run 3 (48 steps of 256, value head at 2e-6)": ROOT / "reports/gsm8k_qwen_coder_run3",
    "Qwen2.5-Coder-0.5B GSM8K shipped config (48 steps of 256, value head at 5e-5)": ROOT / "reports/gsm8k_qwen_coder",
}
# Derived per step: the value loss over what a critic that knew nothing would score, 0.5 * the
# variance of the final rewards (with gamma = lam = 1 every token's return is its response's
# reward, minus KL terms): near 1, the critic explains none of the reward; well below, it does.
# Why: loss/value alone grows with the reward's spread, so its raw size says little. Only for
# runs with gamma = lam = 1: with lam < 1 the returns bootstrap from the critic itself.
CRITIC_RATIO = "derived/value_loss_over_half_reward_var"
# The table's rows, in its order.
KEYS = ["rollout/reward_mean", "stats/approx_kl_first", "stats/policy_clipfrac_first", "stats/approx_kl",
        "stats/policy_clipfrac", "loss/value", CRITIC_RATIO, "stats/value_clipfrac", "loss/entropy", "stats/grad_norm",
        "rollout/kl", "rollout/kl_coeff"]
FLAGS = ["stats/early_stop", "stats/update_skipped"]


def with_derived(metrics: list[dict], run_dir: Path) -> list[dict]:
    """``metrics`` with CRITIC_RATIO added where the step had an update and a reward spread, if
    the run's config.yaml has gamma = lam = 1."""
    ppo = yaml.safe_load((run_dir / "config.yaml").read_text())["ppo"]
    if not ppo["gamma"] == ppo["lam"] == 1.0:
        return metrics
    out = []
    for m in metrics:
        half_var = 0.5 * m.get("rollout/reward_std", 0.0) ** 2
        out.append({**m, CRITIC_RATIO: m["loss/value"] / half_var} if "loss/value" in m and half_var > 0 else m)
    return out


def ranges(metrics: list[dict], key: str) -> dict[str, float] | None:
    """The figures of one metric over a run's steps, or None when the run did not log it."""
    rows = [m for m in metrics if key in m]
    if not rows:
        return None
    values = np.array([m[key] for m in rows], dtype=np.float64)
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return {"steps": len(values), "step1": rows[0][key] if rows[0]["step"] == 1 else float("nan"),
            "first10": values[:REWARD_WINDOW].mean(), "last10": values[-REWARD_WINDOW:].mean(),
            "median": median, "p10": p10, "p90": p90, "min": values.min(), "max": values.max(),
            "below0": float((values < 0).mean()), "above1e-2": float((values > 1e-2).mean())}


def report(name: str, run_dir: Path) -> list[str]:
    """Markdown lines for one run."""
    metrics = with_derived(read_jsonl(run_dir / METRICS), run_dir)
    lines = [f"### {name}: {run_dir.name}, {len(metrics)} steps", "",
             f"| metric | median | p10 - p90 | step 1 | first {REWARD_WINDOW} | last {REWARD_WINDOW} | min / max "
             "| < 0 | > 1e-2 |", "|---|---|---|---|---|---|---|---|---|"]
    for key in KEYS:
        r = ranges(metrics, key)
        if r is None:
            lines.append(f"| {key} | not logged{' (or lam < 1)' if key == CRITIC_RATIO else ''} | | | | | | | |")
            continue
        lines.append(f"| {key} | {r['median']:.4g} | {r['p10']:.4g} - {r['p90']:.4g} | {r['step1']:.4g} | "
                     f"{r['first10']:.4g} | {r['last10']:.4g} | {r['min']:.3g} / {r['max']:.3g} | "
                     f"{r['below0']:.0%} | {r['above1e-2']:.0%} |")
    for key in FLAGS:
        logged = [m[key] for m in metrics if key in m]
        lines.append(f"| {key} | " + (f"{int(sum(logged))} of {len(logged)} steps |" if logged else "not logged |")
                     + " | | | | | | |")
    changes = level_changes(metrics)
    if changes:
        lines += ["", f"Curriculum level changes, with the mean training reward of the {REWARD_WINDOW} steps before "
                  f"and the {REWARD_WINDOW} steps from the change on:"]
        for step, level in changes:
            before = [m["rollout/reward_mean"] for m in metrics if step - REWARD_WINDOW <= m["step"] < step]
            after = [m["rollout/reward_mean"] for m in metrics if step <= m["step"] < step + REWARD_WINDOW]
            lines.append(f"- step {step}, operands 0-{level}: reward {np.mean(before):.3f} -> {np.mean(after):.3f}")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run folders (default: the course's measured runs)")
    args = parser.parse_args(argv)
    runs = {path.name: path for path in args.runs} if args.runs else DEFAULT_RUNS
    for name, run_dir in runs.items():
        print("\n".join(report(name, run_dir)))


if __name__ == "__main__":
    main()

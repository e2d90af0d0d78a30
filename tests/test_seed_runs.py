"""The committed runs of the recipe on 4 GPUs, one per seed, hold what docs/results.md and
reports/multi_gpu.md claim of them.

reports/gsm8k_qwen_coder_4gpu_seed{0,1,2}/ are whole runs of configs/gsm8k_qwen_coder.yaml under
DDP on 4 processes with train.seed 0, 1 and 2. Everything checked here is recomputed from the
committed files: greedy accuracy and the exact McNemar test from the per-problem evaluations.
Each seed's gain is significant (p < 0.01); the goal of +8 points for every seed is not met by
seed 1 (+6.8), and the pages say so with the numbers this file recomputes.
"""

import json
import statistics
from pathlib import Path

import pytest
from report_runs import RUN_CONTROL, changed_keys, joined, rescored

from assignment.trainer.runlog import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)
FOLDERS = {seed: ROOT / "reports" / f"gsm8k_qwen_coder_4gpu_seed{seed}" for seed in SEEDS}

pytestmark = pytest.mark.skipif(not all(folder.is_dir() for folder in FOLDERS.values()),
                                reason="the 4-GPU seed runs are not committed yet")


@pytest.fixture(scope="module")
def figures() -> dict:
    """Per seed: the exact McNemar test and the summary, from the committed files."""
    return {seed: rescored(FOLDERS[seed]) for seed in SEEDS}


def missed(figures: dict) -> list[str]:
    """How the pages must state each seed under the +8-point goal."""
    return [f"seed {seed} reaches {100 * test.diff:+.1f}" for seed, (test, _) in figures.items() if test.diff < 0.08]


@pytest.mark.parametrize("seed", SEEDS)
def test_each_seed_is_a_whole_4_process_run_that_learns_significantly(seed):
    test, summary = rescored(FOLDERS[seed])
    assert test.after > test.before and test.p_value < 0.01, (test.diff, test.p_value)
    assert len(read_jsonl(FOLDERS[seed] / "metrics.jsonl")) == summary["steps"] == 48
    runs = json.loads((FOLDERS[seed] / "run.json").read_text())
    assert [(r["world_size"], r["status"]) for r in runs] == [(4, "finished")]


@pytest.mark.parametrize("seed", SEEDS)
def test_each_seed_ran_the_shipped_recipe(monkeypatch, seed):
    changed, ran = changed_keys(FOLDERS[seed], "configs/gsm8k_qwen_coder.yaml", monkeypatch)
    assert ran["train.seed"] == seed
    assert changed <= RUN_CONTROL | {"train.seed"}  # and the seed it was asked


def test_the_results_page_states_the_spread_across_seeds(figures):
    befores = {test.before for test, _ in figures.values()}
    assert len(befores) == 1  # the same model and problems: one "before" for all three
    gains = [100 * test.diff for test, _ in figures.values()]
    walls = [summary["seconds"]["wall"] for _, summary in figures.values()]
    expected = (f"{befores.pop() / 1319:.1%} -> " + ", ".join(f"{t.after / 1319:.1%}" for t, _ in figures.values()),
                "(" + ", ".join(f"{g:+.1f}" for g in gains) + f" points; mean {statistics.mean(gains):+.1f}",
                f"p <= {max(test.p_value for test, _ in figures.values()):.1e}", f"{min(walls):.0f}-{max(walls):.0f} s")
    results = joined(ROOT / "docs" / "results.md")
    for text in (*expected, *missed(figures)):
        assert text in results, text


def test_the_multi_gpu_page_tables_each_seed_and_states_the_miss(figures):
    page = (ROOT / "reports" / "multi_gpu.md").read_text()
    for seed, (test, summary) in figures.items():
        steps = read_jsonl(FOLDERS[seed] / "metrics.jsonl")[1:]
        per_step = statistics.median(m["time/rollout"] + m["time/update"] for m in steps)
        row = (f"| {seed} | {test.before / 1319:.1%} -> {test.after / 1319:.1%} | {100 * test.diff:+.1f} | "
               f"{test.c} / {test.b} | {test.p_value:.1e} | {summary['kl_final']:.1f} | {per_step:.2f} | "
               f"{summary['seconds']['wall']:.0f} |")
        assert row in page, row
    gains = [100 * test.diff for test, _ in figures.values()]
    minutes = [summary["seconds"]["wall"] / 60 for _, summary in figures.values()]
    for text in (*missed(figures), f"by {statistics.mean(gains):+.1f} points on average",
                 f"p <= {max(test.p_value for test, _ in figures.values()):.1e}",
                 f"{min(minutes):.1f}-{max(minutes):.1f} minutes"):
        assert text in joined(ROOT / "reports" / "multi_gpu.md"), text

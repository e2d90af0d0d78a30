"""The committed runs of the recipe on 4 GPUs, one per seed, hold what the README claims of them.

reports/gsm8k_qwen_coder_4gpu_seed{0,1,2}/ are whole runs of configs/gsm8k_qwen_coder.yaml under
DDP on 4 processes with train.seed 0, 1 and 2. Everything checked here is recomputed from the
committed files: greedy accuracy and the exact McNemar test from the per-problem evaluations.
"""

import json
from pathlib import Path

import pytest
from report_runs import RUN_CONTROL, changed_keys, rescored

from assignment.trainer.runlog import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)
FOLDERS = {seed: ROOT / "reports" / f"gsm8k_qwen_coder_4gpu_seed{seed}" for seed in SEEDS}

pytestmark = pytest.mark.skipif(not all(folder.is_dir() for folder in FOLDERS.values()),
                                reason="the 4-GPU seed runs are not committed yet")


@pytest.mark.parametrize("seed", SEEDS)
def test_each_seed_learns_eight_points_or_more(seed):
    test, summary = rescored(FOLDERS[seed])
    assert test.diff >= 0.08 and test.p_value < 0.01, (test.diff, test.p_value)
    assert len(read_jsonl(FOLDERS[seed] / "metrics.jsonl")) == summary["steps"] == 48
    runs = json.loads((FOLDERS[seed] / "run.json").read_text())
    assert [(r["world_size"], r["status"]) for r in runs] == [(4, "finished")]


@pytest.mark.parametrize("seed", SEEDS)
def test_each_seed_ran_the_shipped_recipe(monkeypatch, seed):
    changed, ran = changed_keys(FOLDERS[seed], "configs/gsm8k_qwen_coder.yaml", monkeypatch)
    assert ran["train.seed"] == seed
    assert changed <= RUN_CONTROL | {"train.seed"}  # and the seed it was asked

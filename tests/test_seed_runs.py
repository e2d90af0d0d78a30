"""The committed runs of the recipe on 4 GPUs, one per seed, hold what the README claims of them.

reports/gsm8k_qwen_coder_4gpu_seed{0,1,2}/ are whole runs of configs/gsm8k_qwen_coder.yaml under
DDP on 4 processes with train.seed 0, 1 and 2. Everything checked here is recomputed from the
committed files: greedy accuracy and the exact McNemar test from the per-problem evaluations.
"""

import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from assignment.trainer.config import load_config
from assignment.trainer.runlog import read_jsonl
from assignment.trainer.stats import mcnemar_exact

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)
FOLDERS = {seed: ROOT / "reports" / f"gsm8k_qwen_coder_4gpu_seed{seed}" for seed in SEEDS}
# Where the run was, not what it computed (as in test_small_card_runs), and the seed it was asked.
RUN_CONTROL = {"train.output_dir", "train.time_limit_s", "train.final_checkpoint", "model.name", "model.gguf_file",
               "data.local_dir", "train.seed"}

pytestmark = pytest.mark.skipif(not all(folder.is_dir() for folder in FOLDERS.values()),
                                reason="the 4-GPU seed runs are not committed yet")


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


def rescored(seed: int):
    before = read_jsonl(FOLDERS[seed] / "eval_before.jsonl")
    after = read_jsonl(FOLDERS[seed] / "eval_after.jsonl")
    assert len(before) == len(after) == 1319 and all(b["question"] == a["question"] for b, a in zip(before, after))
    return mcnemar_exact([r["correct"] for r in before], [r["correct"] for r in after])


@pytest.mark.parametrize("seed", SEEDS)
def test_each_seed_learns_eight_points_or_more(seed):
    test = rescored(seed)
    assert test.diff >= 0.08 and test.p_value < 0.01, (test.diff, test.p_value)
    summary = json.loads((FOLDERS[seed] / "summary.json").read_text())
    assert (summary["improved"], summary["regressed"], summary["mcnemar_p"]) == (test.c, test.b, test.p_value)
    assert (summary["accuracy_before"], summary["accuracy_after"]) == (test.before / 1319, test.after / 1319)
    assert len(read_jsonl(FOLDERS[seed] / "metrics.jsonl")) == summary["steps"] == 48
    runs = json.loads((FOLDERS[seed] / "run.json").read_text())
    assert [(r["world_size"], r["status"]) for r in runs] == [(4, "finished")]


@pytest.mark.parametrize("seed", SEEDS)
def test_each_seed_ran_the_shipped_recipe(monkeypatch, seed):
    for name in ("MODEL_DIR", "MODEL_GGUF", "GSM8K_DIR"):
        monkeypatch.delenv(name, raising=False)
    ran = flat(yaml.safe_load((FOLDERS[seed] / "config.yaml").read_text()))
    shipped = flat(OmegaConf.to_container(OmegaConf.structured(load_config("configs/gsm8k_qwen_coder.yaml"))))
    assert ran.keys() == shipped.keys() and ran["train.seed"] == seed
    assert {k for k in ran if ran[k] != shipped[k]} <= RUN_CONTROL

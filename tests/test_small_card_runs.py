"""The committed learning runs of the small-card profiles hold what the README claims of them.

reports/gsm8k_qwen_coder_{24gb,16gb}/ are the whole runs of configs/gsm8k_qwen_coder_{24gb,16gb}.yaml
(one GPU each, under the profile's memory cap). Everything checked here is recomputed from the
committed files: greedy accuracy and the exact McNemar test from the per-problem evaluations, the
peak from every step's metrics, the speed against the recipe's run made on the same machine at
the same time (reports/performance/small_cards/h200_runs/recipe/metrics.jsonl).
"""

import json
import statistics
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from assignment.trainer.config import load_config
from assignment.trainer.runlog import read_jsonl
from assignment.trainer.stats import mcnemar_exact

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
RECIPE_RUN = REPORTS / "performance" / "small_cards" / "h200_runs" / "recipe"
# profile: (its memory cap in GiB, the most seconds per step it may take against the recipe's)
PROFILES = {"24gb": (20, 1.3), "16gb": (14, 2.0)}
# Where the run was, not what it computed: the device's paths and how the run was split into calls.
RUN_CONTROL = {"train.output_dir", "train.time_limit_s", "train.final_checkpoint", "model.name", "model.gguf_file",
               "data.local_dir"}


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


def seconds_per_step(run: Path) -> float:
    """The median of rollout + update over the steps after the first (which compiles)."""
    steps = read_jsonl(run / "metrics.jsonl")[1:]
    return statistics.median(m["time/rollout"] + m["time/update"] for m in steps)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_profile_run_learns_under_its_cap(profile):
    cap, _ = PROFILES[profile]
    bundle = REPORTS / f"gsm8k_qwen_coder_{profile}"
    summary = json.loads((bundle / "summary.json").read_text())
    before, after = read_jsonl(bundle / "eval_before.jsonl"), read_jsonl(bundle / "eval_after.jsonl")
    assert len(before) == len(after) == 1319 and all(b["question"] == a["question"] for b, a in zip(before, after))
    test = mcnemar_exact([r["correct"] for r in before], [r["correct"] for r in after])
    assert test.diff >= 0.08 and test.p_value < 0.01, (test.diff, test.p_value)
    assert (summary["improved"], summary["regressed"], summary["mcnemar_p"]) == (test.c, test.b, test.p_value)
    metrics = read_jsonl(bundle / "metrics.jsonl")
    assert len(metrics) == summary["steps"] == 48
    assert max(m["memory/peak_memory_gib"] for m in metrics) <= cap
    run = json.loads((bundle / "run.json").read_text())
    assert [r["max_gpu_memory_gib"] for r in run] == [cap] and {r["status"] for r in run} == {"finished"}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_profile_run_is_the_shipped_profile(monkeypatch, profile):
    """The run's config is the profile's file as committed, but for where the run put its files."""
    for name in ("MODEL_DIR", "MODEL_GGUF", "GSM8K_DIR"):
        monkeypatch.delenv(name, raising=False)
    ran = flat(yaml.safe_load((REPORTS / f"gsm8k_qwen_coder_{profile}" / "config.yaml").read_text()))
    shipped = flat(OmegaConf.to_container(OmegaConf.structured(load_config(f"configs/gsm8k_qwen_coder_{profile}.yaml"))))
    assert ran.keys() == shipped.keys()
    assert {k for k in ran if ran[k] != shipped[k]} <= RUN_CONTROL


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_profile_run_is_within_its_speed_target(profile):
    """Seconds per PPO step against the recipe's run on another card of the same machine, same time."""
    _, most = PROFILES[profile]
    bundle = REPORTS / f"gsm8k_qwen_coder_{profile}"
    cards = {json.loads((run / "run.json").read_text())[0]["device"] for run in (bundle, RECIPE_RUN)}
    assert len(cards) == 1
    assert seconds_per_step(bundle) <= most * seconds_per_step(RECIPE_RUN)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_card_estimate_reproduces_the_measured_card_and_never_speeds_up(profile):
    """benchmarks/card_estimate.py on the H200 it was measured on gives back the measured step (every
    ratio 1), and no listed card comes out faster than that card."""
    from assignment.trainer.impl import load_module

    estimate = load_module(ROOT / "benchmarks" / "card_estimate.py", "card_estimate")
    small = REPORTS / "performance" / "small_cards"
    bench, recipe = (json.loads((small / name).read_text()) for name in (f"profile_{profile}_h200.json", "recipe_h200.json"))
    summary = json.loads((REPORTS / f"gsm8k_qwen_coder_{profile}" / "summary.json").read_text())
    own = estimate.estimate(bench, recipe, summary["seconds"], summary["steps"], bench["card"])
    measured = estimate.medians(bench)
    assert own["step"] == pytest.approx(sum(measured.values()))
    for card in estimate.CARDS:
        guess = estimate.estimate(bench, recipe, summary["seconds"], summary["steps"], card)
        assert guess["step"] >= own["step"] and guess["run"] >= own["run"]  # every ratio >= 1, exactly 1 for itself

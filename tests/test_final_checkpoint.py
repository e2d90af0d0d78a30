"""train.final_checkpoint=false: no checkpoint after the last step; --resume stays exact from a
periodic one and refuses clearly where there is none."""

from pathlib import Path

import pytest
import torch

from assignment.trainer import cli
from assignment.trainer.config import load_config
from assignment.trainer.impl import load_impl
from assignment.trainer.loop import train

REFERENCE = Path(__file__).resolve().parents[1] / "solutions" / "exercises.py"
SOLUTION = load_impl(str(REFERENCE))
TINY = ["model.hidden_size=32", "rollout.batch_size=8", "ppo.minibatch_size=4", "ppo.epochs=2",
        "rollout.max_new_tokens=4", "eval.size=8", "train.progress=false", "train.tensorboard=false",
        "train.cpu_threads=1"]


def tiny_cfg(out: Path, *extra: str):
    return load_config(None, [*TINY, f"train.output_dir={out}", *extra])


def test_without_the_final_checkpoint_a_run_resumes_exactly_from_its_periodic_one(tmp_path):
    straight = train(tiny_cfg(tmp_path / "a", "train.steps=4"), SOLUTION)
    cfg = tiny_cfg(tmp_path / "b", "train.steps=4", "train.checkpoint_every=2", "train.final_checkpoint=false")
    train(cfg, SOLUTION)
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["step"] == 2  # step 4's was skipped
    resumed = train(cfg, SOLUTION, resume=True)  # redoes steps 3 and 4 as a killed run would
    assert [m["step"] for m in resumed.metrics] == [1, 2, 3, 4]
    for a, b in zip(straight.metrics, resumed.metrics):
        assert a["rollout/reward_mean"] == b["rollout/reward_mean"]
        assert a["loss/total"] == pytest.approx(b["loss/total"], abs=1e-6)
    assert straight.evals == resumed.evals


def test_a_run_without_any_checkpoint_refuses_resume_and_says_why(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["--impl", str(REFERENCE), *TINY, "train.steps=1", "eval.size=0", "train.final_checkpoint=false",
                     f"train.output_dir={run}"]) == 0
    assert (run / "metrics.jsonl").is_file() and not (run / "checkpoint.pt").exists()
    config = (run / "config.yaml").read_text()
    capsys.readouterr()
    assert cli.main(["--resume", str(run), "train.steps=2"]) == 2
    assert "train.final_checkpoint=false, which saves none after the last step" in capsys.readouterr().err
    assert (run / "config.yaml").read_text() == config  # refused before the run folder is touched

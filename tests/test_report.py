"""The run report: every section is filled from a real (tiny) run's files."""

from pathlib import Path

from assignment.trainer import cli
from assignment.trainer.config import load_config
from assignment.trainer.impl import load_impl
from assignment.trainer.loop import train

REFERENCE = Path(__file__).resolve().parents[1] / "solutions" / "exercises.py"


def test_report_of_a_tiny_run(tmp_path, capsys):
    cfg = load_config(None, ["model.hidden_size=32", "rollout.batch_size=8", "ppo.minibatch_size=4", "eval.size=6",
                             "train.steps=2", "train.progress=false", "train.tensorboard=false", "train.cpu_threads=1",
                             f"train.output_dir={tmp_path / 'run'}"])
    train(cfg, load_impl(str(REFERENCE)), command="ppo-train tiny")
    out = tmp_path / "reports" / "tiny.md"
    assert cli.main(["--report", str(tmp_path / "run"), "--report-out", str(out)]) == 0
    text = out.read_text()
    assert "`ppo-train tiny`" in text and "wall time" in text
    assert "| rollout/reward_mean |" in text and "![reward curve](tiny.png)" in text
    assert (tmp_path / "reports" / "tiny.png").stat().st_size > 1000
    assert "Two-proportion z-test" in text and "| before | 0 | 6 |" in text and "| after | 2 | 6 |" in text
    assert text.count("**Question**") == 3 and "What is" in text

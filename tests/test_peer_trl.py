"""benchmarks/peer_trl.py on the CPU: TRL's GRPOTrainer trains on the Qwen config's model layout
(a tiny qwen2 GGUF of the staged file's name), prompts and reward, and the figures it writes
count what happened: one reward call per generation batch, every completion's tokens, and as
many batches as asked for."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("gguf")
from gguf_models import write_tiny_qwen2_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GGUF_NAME = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("peer_trl", ROOT / "benchmarks" / "peer_trl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_peer_benchmark_runs_trl_on_the_qwen_config(tmp_path, monkeypatch, capsys):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    write_tiny_qwen2_gguf(model_dir / GGUF_NAME)
    monkeypatch.setenv("MODEL_DIR", str(model_dir))
    monkeypatch.setenv("MODEL_GGUF", str(model_dir / GGUF_NAME))
    monkeypatch.setenv("GSM8K_DIR", str(ROOT / "tests" / "data" / "gsm8k"))
    monkeypatch.chdir(tmp_path)
    metrics = tmp_path / "metrics.jsonl"  # a PPO run's first steps, for the side-by-side reward
    metrics.write_text("".join(json.dumps({"step": s, "rollout/reward_mean": r}) + "\n"
                               for s, r in ((1, 0.25), (2, 0.5), (3, 1.0))))
    out = tmp_path / "peer.json"
    # 8 completions a batch (4 prompts x 2), micro-batches of 2, an optimizer step every 2: 2 steps a batch
    overrides = ["rollout.batch_size=8", "ppo.minibatch_size=2", "ppo.grad_accum_steps=2", "rollout.max_new_tokens=5",
                 "train.cpu_threads=1"]
    bench = load_benchmark()
    assert bench.main(["--cpu", "--group-size", "2", "--generations", "2", "--ppo-metrics", str(metrics),
                       "--out", str(out), *overrides]) == 0
    result = json.loads(out.read_text())
    assert result["completions_per_batch"] == 8 and result["optimizer_steps_per_batch"] == 2
    assert len(result["seconds_per_batch"]) == 2 and len(result["reward_per_batch"]) == 2
    # each batch: 8 completions of 1 to 5 tokens
    assert all(8 <= tokens <= 40 for tokens in result["tokens_per_batch"]), result["tokens_per_batch"]
    assert result["ppo_reward_per_step"] == [0.25, 0.5]  # the first --generations steps only
    printed = capsys.readouterr().out
    assert "| PPO (this trainer), mean reward over its first 2 steps | 0.375 |" in printed

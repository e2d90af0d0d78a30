"""configs/fsdp_qwen7b_shape.yaml: FSDP2 for a model one card cannot train (Qwen2.5-7B's shape,
random weights). On CPU: the shape's arithmetic, model.random_init, and the config's run through
benchmarks/scaling.py under FSDP on 2 gloo processes, with a tiny Qwen2 in place of the 7B one."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

from assignment.trainer.config import ConfigError, ModelConfig, load_config
from assignment.trainer.impl import load_module
from assignment.trainer.loading import ModelError, load_lm, load_tokenizer
from assignment.trainer.runlog import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "fsdp_qwen7b_shape.yaml"
H100_GIB = 80e9 / 2**30  # an 80 GB card, before the CUDA context takes its share


def tiny_qwen2(folder: Path, vocab_size: int = 256) -> Path:
    """A Qwen2 config.json of the 7B config's family, small enough for CPU tests."""
    Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False).save_pretrained(folder)
    return folder


def test_the_7b_shape_does_not_fit_one_card_and_its_four_shards_do():
    cfg = load_config(CONFIG)
    assert cfg.model.random_init and cfg.model.dtype == "float32" and cfg.ppo.grad_accum_steps == 1
    with torch.device("meta"):  # the shape alone, no memory
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ROOT / cfg.model.name))
    parameters = sum(p.numel() for p in lm.parameters())
    assert parameters == 7_615_616_512  # Qwen2.5-7B's
    state_gib = 16 * parameters / 2**30  # float32 weights and gradients, AdamW's two float32 moments
    assert state_gib > H100_GIB and state_gib / 4 < H100_GIB / 2


def test_random_init_draws_the_configs_model_from_the_seed(tmp_path):
    folder = tiny_qwen2(tmp_path / "tiny")
    cfg = ModelConfig(name=str(folder), random_init=True, tokenizer="synthetic")
    tokenizer = load_tokenizer(cfg)
    first, again, other = (load_lm(cfg, tokenizer, seed) for seed in (0, 0, 1))
    assert type(first).__name__ == "Qwen2ForCausalLM" and first.config.vocab_size == 256 > len(tokenizer)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    assert not torch.equal(first.lm_head.weight, other.lm_head.weight)
    with pytest.raises(ModelError, match="vocabulary of 8, fewer than the tokenizer's 25 tokens"):
        load_lm(ModelConfig(name=str(tiny_qwen2(tmp_path / "small", 8)), random_init=True, tokenizer="synthetic"),
                tokenizer, 0)
    with pytest.raises(ModelError, match="cannot read the model config"):
        load_lm(ModelConfig(name=str(tmp_path / "absent"), random_init=True, tokenizer="synthetic"), tokenizer, 0)
    with pytest.raises(ConfigError, match="model.random_init builds model.name's config.json"):
        load_config(None, ["model.random_init=true"])


@pytest.mark.slow
def test_the_config_trains_a_tiny_qwen2_under_fsdp_on_two_processes(tmp_path):
    """The GPU command's path (benchmarks/scaling.py, fsdp:2) with the config as shipped but the model."""
    scaling = load_module(ROOT / "benchmarks" / "scaling.py")
    folder, runs, out = tiny_qwen2(tmp_path / "tiny"), tmp_path / "runs", tmp_path / "scaling.json"
    assert scaling.main(["--config", str(CONFIG), "--launches", "fsdp:2", "--steps", "6", "--runs-dir", str(runs),
                         "--out", str(out), f"model.name={folder}", "train.cpu_threads=1",
                         "train.tensorboard=false"]) == 0
    metrics = read_jsonl(runs / "fsdp_2" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert all(m["stats/grad_norm"] > 0 and m["stats/minibatches"] == 1 for m in metrics)  # one call a process
    assert json.loads((runs / "fsdp_2" / "run.json").read_text())[0]["world_size"] == 2
    [record] = scaling.read(out, paired=False)
    assert (record["launch"], record["gpus"]) == ("fsdp", 2)

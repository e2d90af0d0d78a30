"""A dry run of the GPU run on CPU: configs/gsm8k_qwen_coder.yaml exactly as the device plan
runs it (the CLI, the environment device-stage's env.sh exports, the solution's exercises),
with the model swapped for a tiny qwen2-architecture GGUF of the real file's name and layout
(ChatML template, Qwen's special tokens, q/k/v biases) and tiny sizes. What it exercises: GGUF
loading and dequantization, the chat template and the \\boxed prompt, the committed GSM8K sample,
the rollout, reward, fixed KL penalty, bfloat16 sampler, advantage guard, update with gradient accumulation,
checkpointing and target_kl bound, the time limit after every step and evaluation batch, resume
until finished, the evaluation records and the report with its folder.

The one deviation besides the sizes: ppo.min_reward_std=0. A random tiny model never earns a
reward, so the run's guard would skip every update; the skip itself is tested in test_trainer.
"""

import dataclasses
import json
import os
from pathlib import Path

import pytest

from assignment.trainer import cli
from assignment.trainer.config import ALGORITHM_NAMES, load_config
from assignment.trainer.loading import load_tokenizer
from assignment.trainer.rollout import render_prompts
from assignment.trainer.runlog import read_jsonl

pytest.importorskip("gguf")
from gguf_models import write_tiny_qwen2_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "gsm8k_qwen_coder.yaml"
GGUF_NAME = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"  # the staged file's name
TINY = ["train.steps=2", "eval.size=4", "eval.batch_size=2", "rollout.batch_size=8", "ppo.minibatch_size=2",
        "rollout.max_new_tokens=6", "rollout.forward_batch_size=2", "train.time_limit_s=0", "train.sample_every=1",
        "train.cpu_threads=1", "ppo.min_reward_std=0"]


@pytest.fixture()
def staged(tmp_path, monkeypatch):
    """The environment of env.sh: MODEL_DIR, MODEL_GGUF (a path) and GSM8K_DIR (here the sample)."""
    model_dir = tmp_path / "ppo-stage" / "model"
    model_dir.mkdir(parents=True)
    write_tiny_qwen2_gguf(model_dir / GGUF_NAME)
    monkeypatch.setenv("MODEL_DIR", str(model_dir))
    monkeypatch.setenv("MODEL_GGUF", str(model_dir / GGUF_NAME))
    monkeypatch.setenv("GSM8K_DIR", str(ROOT / "tests" / "data" / "gsm8k"))
    monkeypatch.chdir(tmp_path)  # the run dir and the report land here, as in the repo root on the device
    return tmp_path


def test_the_qwen_config_runs_end_to_end_in_time_limited_calls(staged, capsys):
    run = staged / "runs" / "gsm8k_qwen_coder"
    argv = ["--config", str(CONFIG), "--impl", str(ROOT / "solutions" / "exercises.py"), *TINY]
    assert cli.main(argv) == 0
    calls, logs = 1, [capsys.readouterr().out]
    while "status: time_limit" in logs[-1] and calls < 12:
        assert cli.main(["--resume", str(run)]) == 0  # each device call after the first
        calls, logs = calls + 1, logs + [capsys.readouterr().out]
    assert "continue with: ppo-train --resume runs/gsm8k_qwen_coder" in logs[0] and "status: finished (2 PPO steps)" in logs[-1]
    assert "[eval step 0] 2/4 problems" in logs[0] and "[step 1] reward 0.000 correct 0.000" in logs[1]
    runs = json.loads((run / "run.json").read_text())
    # Each call stops after the first step or eval batch past the limit (here 0 s): eval batch 1;
    # eval batch 2 and step 1; step 2 and final eval batch 1; final eval batch 2.
    assert calls == 4 and [r["status"] for r in runs] == ["time_limit"] * 3 + ["finished"]
    assert [r["step"] for r in runs if "step" in r] == [1, 2]
    assert all(r["resume"] for r in runs[1:]) and "--impl" in runs[0]["command"]

    cfg = load_config(run / "config.yaml")
    assert cfg.model.gguf_file == os.environ["MODEL_GGUF"] and cfg.data.local_dir == os.environ["GSM8K_DIR"]
    prompt = render_prompts(load_tokenizer(cfg.model), ["Q"], cfg.data)[0]
    assert prompt.startswith("<|im_start|>system\n") and "Q\nPlease reason step by step, and put your final answer within \\boxed{}" in prompt

    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["stats/minibatches"] > 0 for m in metrics)
    # a fixed coefficient; the rollout ran the fast path (a bfloat16 sampler; nothing compiles on CPU)
    assert [m["rollout/kl_coeff"] for m in metrics] == [0.001, 0.001]
    assert cfg.kl.adaptive is False and cfg.rollout.generation_dtype == "bfloat16" and cfg.rollout.compile
    for step in (0, 2):
        records = read_jsonl(run / "eval_samples" / f"step_{step}.jsonl")
        assert len(records) == 4 and all({"question", "reference", "response", "answer", "correct"} <= set(r) for r in records)

    out = staged / "reports" / "gsm8k_qwen_coder.md"
    assert cli.main(["--report", str(run), "--report-out", str(out), "--staging-seconds", "95"]) == 0
    bundle = out.with_suffix("")
    assert {p.name for p in bundle.iterdir()} == {"summary.json", "eval_before.jsonl.gz", "eval_after.jsonl.gz", "metrics.jsonl",
                                                  "config.yaml", "run.json"}
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["n"] == 4 and summary["steps"] == 2 and summary["seconds"]["invocations"] == 4
    assert summary["kl_budget"]["target"] == 30.0 and summary["seconds"]["staging"] == 95.0
    assert "staging 95 s" in out.read_text() and out.with_suffix(".png").is_file()


def test_the_rollout_benchmark_runs_on_the_qwen_config(staged):
    """benchmarks/rollout_speed.py as the device plan runs it on the Qwen config (tiny sizes):
    every variant, the update, the report file."""
    from assignment.trainer.impl import load_module

    bench = load_module(ROOT / "benchmarks" / "rollout_speed.py", "rollout_speed_qwen")
    out = staged / "performance.md"
    assert bench.main(["--config", str(CONFIG), "--repeats", "1", "--out", str(out), "rollout.batch_size=8",
                       "ppo.minibatch_size=2", "rollout.max_new_tokens=6", "rollout.forward_batch_size=2",
                       "train.cpu_threads=1"]) == 0
    assert all(f"| {name} |" in out.read_text() for name in bench.VARIANTS)


def test_the_recompile_probe_runs_the_whole_schedule(capsys):
    """benchmarks/eval_recompiles.py on CPU (nothing compiles there): every call of its schedule,
    the compiled path's and the eager evaluation's, runs through the trainer's generate."""
    from assignment.trainer.impl import load_module

    probe = load_module(ROOT / "benchmarks" / "eval_recompiles.py", "eval_recompiles")
    assert probe.main(["--eval-batch", "3", "--rollout-batch", "2", "--prompt-tokens", "6", "--new-tokens", "3",
                       "--gradient-checkpointing"]) == 0
    printed = capsys.readouterr().out
    calls = [line for line in printed.splitlines() if line.endswith(" recompile messages")]
    assert len(calls) == 5 and calls[-1].startswith("eval, eager dynamic cache"), printed


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo"])
def test_the_grpo_configs_keep_the_ppo_budget_and_run_on_cpu(staged, capsys, algorithm):
    """Part II's GSM8K configs: PPO's 256 responses a step as 64 prompts x 4, the same
    minibatches, accumulation, lr, answer limit and fast rollout; a tiny CPU run finishes."""
    config = ROOT / "configs" / f"gsm8k_qwen_coder_{algorithm}.yaml"
    ppo, cfg = load_config(CONFIG), load_config(config)
    assert cfg.algorithm == algorithm and cfg.rollout.group_size == 4
    assert cfg.rollout.batch_size // cfg.rollout.group_size == 64
    assert (cfg.rollout.batch_size, cfg.ppo.minibatch_size, cfg.ppo.grad_accum_steps, cfg.ppo.epochs, cfg.ppo.lr,
            cfg.rollout.max_new_tokens) == (ppo.rollout.batch_size, ppo.ppo.minibatch_size, ppo.ppo.grad_accum_steps,
                                            ppo.ppo.epochs, ppo.ppo.lr, ppo.rollout.max_new_tokens)
    fast = ("cache_implementation", "compile", "generation_dtype")
    assert [getattr(cfg.rollout, k) for k in fast] == [getattr(ppo.rollout, k) for k in fast]
    # every other key as the PPO config has it: the copies cannot drift from the recipe they match
    flat = lambda c: {f"{part}.{k}": v for part, sub in dataclasses.asdict(c).items()  # noqa: E731
                      for k, v in (sub.items() if isinstance(sub, dict) else [("", sub)])}
    differ = {k for k, v in flat(cfg).items() if flat(ppo)[k] != v}
    assert differ <= {"algorithm.", "rollout.group_size", "ppo.vf_coeff", "ppo.value_head_lr", "train.output_dir"}, differ
    tiny = [t for t in TINY if not t.startswith("train.time_limit_s")] + ["train.time_limit_s=null"]
    argv = ["--config", str(config), "--impl", str(ROOT / "solutions" / "exercises.py"), *tiny]
    assert cli.main(argv) == 0
    assert f"status: finished (2 {ALGORITHM_NAMES[algorithm]} steps)" in capsys.readouterr().out
    metrics = read_jsonl(staged / "runs" / f"gsm8k_qwen_coder_{algorithm}" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["stats/minibatches"] > 0 and "loss/kl" in m for m in metrics)


@pytest.mark.parametrize("profile", ["24gb", "16gb"])
def test_the_small_card_profiles_run_on_cpu_and_report_their_cap(staged, capsys, profile):
    """configs/gsm8k_qwen_coder_{24gb,16gb,16gb_float16}.yaml as the device plan runs them (tiny
    sizes; 2 accumulation steps where the profiles' 16 and 32 would not divide 4 minibatches): the
    8-bit optimizer, the 16-bit working copy (float16 with its loss scale), the 16-bit reference,
    the chunked scoring logits and the evaluation by the sampler on the staged GGUF layout; the cap
    is recorded in run.json (a no-op on CPU: nothing to cap) and the report names it."""
    config = ROOT / "configs" / f"gsm8k_qwen_coder_{profile}.yaml"
    tiny = [t for t in TINY if not t.startswith("train.time_limit_s")] + ["train.time_limit_s=null",
                                                                          "ppo.grad_accum_steps=2"]
    assert cli.main(["--config", str(config), "--impl", str(ROOT / "solutions" / "exercises.py"), *tiny]) == 0
    printed = capsys.readouterr().out
    # the first ratio is 1 within first_kl_tolerance (the trainer warns past it)
    assert "status: finished (2 PPO steps)" in printed and "WARNING: stats/approx_kl_first" not in printed
    run = staged / "runs" / f"gsm8k_qwen_coder_{profile}"
    out = staged / "reports" / f"gsm8k_qwen_coder_{profile}.md"
    assert cli.main(["--report", str(run), "--report-out", str(out)]) == 0
    summary = json.loads((out.with_suffix("") / "summary.json").read_text())
    assert summary["memory_cap_gib"] == [None]  # CPU: run.json records no cap where none applies


def test_the_reference_precision_benchmark_runs_on_the_staged_layout(staged):
    """benchmarks/reference_precision.py as documented, on the tiny GGUF (teacher-forced gold
    solutions, 2 problems): a table row per dtype, every response token finite."""
    from assignment.trainer.impl import load_module

    bench = load_module(ROOT / "benchmarks" / "reference_precision.py", "reference_precision")
    out = staged / "reference_precision.md"
    bench.main(["--config", str(CONFIG), "--n", "2", "--responses", "reference", "--out", str(out),
                "rollout.max_new_tokens=6"])
    text = out.read_text()
    assert "| bfloat16 |" in text and "| float16 |" in text and "0 of" in text

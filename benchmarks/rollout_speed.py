"""Benchmark: the trainer's rollout generation under its fast paths, and one PPO update.

    python benchmarks/rollout_speed.py --config configs/gsm8k_qwen_coder.yaml [--repeats 2] \
        [--out reports/performance.md] [key=value ...]

Loads the config's model (float32 master weights, as the trainer does) and its first training
batch of prompts (``rollout.batch_size`` of them), then times ``rollout.sample`` (the trainer's
own generation call) once per variant, each from the same seed:

    eager            transformers' dynamic cache, float32 weights (TF32 matmuls on CUDA): the
                     trainer's default and the baseline
    static           rollout.cache_implementation=static
    static+compile   ... and rollout.compile=true (transformers compiles the decoding step)
    bf16             rollout.generation_dtype=bfloat16 (a bfloat16 copy samples)
    bf16+static+compile

The first call of a variant (compilation included) is reported on its own; the next
``--repeats`` calls give the median. Throughput counts real response tokens (up to and including
EOS) per second; a batch runs until its longest response ends, so "decode steps" is printed too.
Sampling differs between variants (other weights, other kernels), so their lengths differ a
little. On CPU nothing compiles and bfloat16 is slow: the variants run, the numbers mean little.

The whole PPO step inside the trainer (the rollout phase broken down, and the update's padding
and real-token MFU) is ``benchmarks/ppo_step.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assignment.trainer.config import load_config  # noqa: E402
from assignment.trainer.data import Curriculum, load_problems, training_batch  # noqa: E402
from assignment.trainer.loading import build_models, load_tokenizer  # noqa: E402
from assignment.trainer.distributed import resolve_device  # noqa: E402
from assignment.trainer.loop import disable_dropout  # noqa: E402
from assignment.trainer.rollout import generation_copy, render_prompts, sample  # noqa: E402

VARIANTS = {  # name: (rollout overrides, sampler dtype)
    "eager": ({}, None),
    "static": ({"cache_implementation": "static"}, None),
    "static+compile": ({"cache_implementation": "static", "compile": True}, None),
    "bf16": ({}, torch.bfloat16),
    "bf16+static+compile": ({"cache_implementation": "static", "compile": True}, torch.bfloat16),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_variant(name, policy, tokenizer, prompts, cfg, repeats, device) -> dict:
    """Seconds of the first call and the median of ``repeats`` more, real tokens, decode steps, peak memory."""
    import dataclasses

    overrides, dtype = VARIANTS[name]
    rollout_cfg = dataclasses.replace(cfg.rollout, **overrides)
    sampler = generation_copy(policy.lm, dtype) if dtype is not None else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds, tokens, steps = [], [], []
    for call in range(1 + repeats):
        torch.manual_seed(call)  # the same seeds for every variant
        sync(device)
        started = time.perf_counter()
        responses = sample(policy, tokenizer, prompts, rollout_cfg, sampler=sampler)
        sync(device)
        seconds.append(time.perf_counter() - started)
        tokens.append(int(responses.response_mask.sum()))
        steps.append(responses.response_ids.shape[1])
    del sampler
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    median = statistics.median(seconds[1:])
    timed_tokens = statistics.median(tokens[1:])
    return {"variant": name, "first_s": seconds[0], "median_s": median, "tokens": timed_tokens,
            "steps": statistics.median(steps[1:]), "tok_per_s": timed_tokens / median, "peak_gib": peak}


def table(rows: list[dict]) -> list[str]:
    base = next((r["tok_per_s"] for r in rows if r["variant"] == "eager"), float("nan"))
    lines = ["| variant | first call (s) | median call (s) | real tokens | decode steps | tokens/s | vs eager | peak GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['tok_per_s'] / base:.2f}x" if base == base else "n/a"  # nan: eager was not run
        lines.append(f"| {r['variant']} | {r['first_s']:.1f} | {r['median_s']:.2f} | {r['tokens']:.0f} | {r['steps']:.0f} | "
                     f"{r['tok_per_s']:.0f} | {ratio} | {r['peak_gib']:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, help="also write the tables here (Markdown)")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    device = resolve_device(cfg.train.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # as the trainer: float32 weights, TF32 matmuls
    torch.manual_seed(cfg.train.seed)
    tokenizer = load_tokenizer(cfg.model)
    policy, _ = build_models(cfg.model, tokenizer, cfg.train.seed, device)
    disable_dropout(policy)  # as setup_run
    problems = load_problems(cfg.data, cfg.train.seed)
    batch = training_batch(cfg.data, problems["train"], cfg.rollout.batch_size, cfg.train.seed, 0,
                           Curriculum(cfg.data).level)
    prompts = render_prompts(tokenizer, [p.question for p in batch], cfg.data)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    import transformers

    head = [f"Card: {card}; torch {torch.__version__}, transformers {transformers.__version__}.",
            f"Command: `python benchmarks/rollout_speed.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
            f"Batch {len(prompts)} prompts, at most {cfg.rollout.max_new_tokens} new tokens, temperature "
            f"{cfg.rollout.temperature}; {args.repeats} timed calls per variant after a first one.", ""]
    print("\n".join(head), flush=True)
    rows = []

    def write() -> list[str]:  # after every variant: a run cut by a time limit keeps what it measured
        text = head + ["## Rollout generation", ""] + table(rows)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text("# Rollout generation: the fast paths\n\n" + "\n".join(text) + "\n")
        return text

    for name in args.variants:
        rows.append(time_variant(name, policy, tokenizer, prompts, cfg, args.repeats, device))
        print(f"{name}: {rows[-1]['tok_per_s']:.0f} tokens/s (first call {rows[-1]['first_s']:.1f} s)", flush=True)
        write()
    print("\n".join(write()[len(head):]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

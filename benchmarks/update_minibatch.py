"""Benchmark: exercise 5's time and memory by minibatch size, eager or compiled, on a model of
Qwen2.5-0.5B's shape with random weights (no model files, so it runs on a bare GPU machine).

    python benchmarks/update_minibatch.py [--sizes 2 4 16] [--compile both] [--optimizer adamw]
        [--json OUT.json] [--md OUT.md]

What it measures, on one GPU, for each minibatch size m and each of eager / compiled decoder layers
(``assignment.trainer.loading.compile_layers``):

    update        the solution's ppo_minibatch_update over one optimizer step's 64 rows
                  (64 / m minibatches, accumulating, then the step), seconds: the median of
                  --repeat steps after one that warms up (and compiles); x 4 is the recipe's update
                  of 256 rows per PPO step
    peak          the most memory torch's allocator held during those steps, GiB, and what exercise
                  5 adds to the memory held before it (weights, gradients, optimizer state)
    scoring       the rollout's scoring forward (``rollout.response_forward``: logprobs_old and
                  values) over 256 rows, by rows of ``forward_batch_size`` with the LM head on them
                  whole, or with the head on ``logits_chunk_tokens`` tokens at a time

The rows imitate the recipe's rollouts (configs/gsm8k_qwen_coder.yaml): prompts of 90-220 tokens,
responses of 40-400 tokens, mean ~280, one in ten cut at 400. Random weights give near-uniform
logits, so the numbers of the losses mean nothing; the shapes, and so the time and memory, are
those of the real model's steps. The first step of each compiled variant includes compilation,
shown apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assignment.model import PolicyWithValueHead  # noqa: E402
from assignment.trainer.batch import minibatches  # noqa: E402
from assignment.trainer.impl import load_impl  # noqa: E402
from assignment.trainer.loading import compile_layers  # noqa: E402
from assignment.trainer.ppo import UpdateConfig  # noqa: E402
from assignment.trainer.rollout import response_forward  # noqa: E402

# Qwen2.5-0.5B-Instruct's config.json (the architecture of Qwen2.5-Coder-0.5B-Instruct).
QWEN_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
# --shape tiny: the same code on the CPU in seconds (the test suite's smoke test); its figures mean nothing.
TINY = dict(QWEN_05B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)
ROWS_PER_STEP = 64  # the recipe's optimizer step: minibatch_size 16 x grad_accum_steps 4
GIB = 2 ** 30


class Memory:
    """torch.cuda's allocator statistics on CUDA; zeros on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def reset(self) -> float:
        """Start a new peak; return what is allocated now."""
        if not self.cuda:
            return 0.0
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / GIB

    def peak(self) -> float:
        return torch.cuda.max_memory_allocated() / GIB if self.cuda else 0.0


def qwen_shaped_policy(shape: dict, device: torch.device) -> PolicyWithValueHead:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    lm = Qwen2ForCausalLM(Qwen2Config(**shape, attn_implementation="sdpa")).to(device)
    enable = getattr(lm, "activation_checkpointing_enable", None) or lm.gradient_checkpointing_enable
    enable()
    return PolicyWithValueHead(lm).to(device).train()


def rollout_rows(n: int, vocab: int, device: torch.device, generator: torch.Generator) -> dict:
    """``n`` rows shaped as the recipe's rollouts, as the update's batch dict."""
    prompt = torch.randint(90, 221, (n,), generator=generator)
    response = torch.randint(40, 400, (n,), generator=generator)
    response[torch.rand(n, generator=generator) < 0.1] = 400
    P, T = int(prompt.max()), int(response.max())
    ids = torch.randint(0, vocab, (n, P + T), generator=generator)
    prompt_mask = torch.arange(P)[None] >= P - prompt[:, None]
    response_mask = torch.arange(T)[None] < response[:, None]
    mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    batch = {"input_ids": torch.where(mask.bool(), ids, 0), "attention_mask": mask,
             "response_ids": torch.where(response_mask, ids[:, P:], 0), "response_mask": response_mask,
             "logprobs_old": torch.full((n, T), -11.93),  # ~log(1/V): random weights, near-uniform
             "values_old": torch.zeros(n, T), "advantages": torch.randn(n, T, generator=generator),
             "returns": 0.3 * torch.randn(n, T, generator=generator), "prompt_length": P}
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}


def build_optimizer(policy: PolicyWithValueHead, name: str) -> torch.optim.Optimizer:
    from assignment.trainer.config import load_config
    from assignment.trainer.loop import build_optimizer as trainer_optimizer

    return trainer_optimizer(policy, load_config(None, [f"ppo.optimizer={name}", "ppo.lr=1e-6"]).ppo)


def time_update(policy, optimizer, impl, batch, m: int, repeat: int, memory: Memory) -> dict:
    cfg = UpdateConfig(temperature=1.0, clip_ratio=0.2, clip_range_value=0.2, vf_coeff=0.1, entropy_coeff=0.0,
                       grad_accum_steps=ROWS_PER_STEP // m, max_grad_norm=1.0)
    seconds, peaks = [], []
    for step in range(repeat + 1):
        memory.sync()
        before = memory.reset()
        started = time.perf_counter()
        parts = list(minibatches(batch, m, torch.Generator().manual_seed(step)))
        for i, minibatch in enumerate(parts):
            impl.ppo_minibatch_update(policy, optimizer, minibatch, cfg, i == len(parts) - 1)
        memory.sync()
        seconds.append(time.perf_counter() - started)
        peaks.append((memory.peak(), memory.peak() - before))
    return {"first_step_s": seconds[0], "step_s": statistics.median(seconds[1:]),
            "peak_gib": max(p[0] for p in peaks[1:]), "exercise5_gib": max(p[1] for p in peaks[1:])}


@torch.no_grad()
def time_scoring(policy, batch, rows: int, logits_chunk: int | None, repeat: int, memory: Memory) -> dict:
    P = batch["prompt_length"]
    seconds, transient = [], 0.0
    for _ in range(repeat + 1):
        memory.sync()
        before = memory.reset()
        started = time.perf_counter()
        policy.eval()
        response_forward(policy, batch["input_ids"], batch["attention_mask"], P, 1.0, rows, logits_chunk)
        policy.train()
        memory.sync()
        seconds.append(time.perf_counter() - started)
        transient = max(transient, memory.peak() - before)
    return {"first_s": seconds[0], "s": statistics.median(seconds[1:]), "transient_gib": transient}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 16])
    parser.add_argument("--compile", choices=("off", "on", "both"), default="both")
    parser.add_argument("--optimizer", default="adamw", choices=("adamw", "adamw_8bit"))
    parser.add_argument("--repeat", type=int, default=2, help="timed optimizer steps after the warm-up one")
    parser.add_argument("--scoring", nargs="*", default=["16:none", "64:2048", "64:1024"],
                        help="ROWS:LOGITS_CHUNK_TOKENS variants of the scoring forward (none: the head on whole rows)")
    parser.add_argument("--shape", choices=("qwen", "tiny"), default="qwen")
    parser.add_argument("--scoring-rows", type=int, default=256, help="rows of the scoring forward (the recipe's batch)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--md", type=Path)
    args = parser.parse_args(argv)
    device, shape = torch.device(args.device), QWEN_05B if args.shape == "qwen" else TINY
    memory = Memory(device)
    torch.set_float32_matmul_precision("high")  # as the trainer: float32 weights, TF32 matmuls
    impl = load_impl(str(ROOT / "solutions" / "exercises.py"))
    generator = torch.Generator().manual_seed(0)
    step_rows = rollout_rows(ROWS_PER_STEP, shape["vocab_size"], device, generator)
    rollout = rollout_rows(args.scoring_rows, shape["vocab_size"], device, generator)
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    result = {"card": torch.cuda.get_device_name() if memory.cuda else "cpu", "shape": args.shape,
              "scoring_rows": args.scoring_rows, "torch": torch.__version__, "optimizer": args.optimizer,
              "command": "python benchmarks/update_minibatch.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "update": [], "scoring": []}
    for compiled in modes:
        policy = qwen_shaped_policy(shape, device)
        if compiled:
            compile_layers(policy.lm, "inductor" if memory.cuda else "aot_eager")
        optimizer = build_optimizer(policy, args.optimizer)
        for m in args.sizes:
            row = {"compiled": compiled, "minibatch_size": m, **time_update(policy, optimizer, impl, step_rows, m, args.repeat, memory)}
            result["update"].append(row)
            print(json.dumps(row), flush=True)
        optimizer.zero_grad(set_to_none=True)
        for spec in args.scoring:
            rows, chunk = spec.split(":")
            row = {"compiled": compiled, "rows": int(rows), "logits_chunk_tokens": None if chunk == "none" else int(chunk),
                   **time_scoring(policy, rollout, int(rows), None if chunk == "none" else int(chunk), args.repeat, memory)}
            result["scoring"].append(row)
            print(json.dumps(row), flush=True)
        del policy, optimizer
        if memory.cuda:
            torch.cuda.empty_cache()
    text = report(result)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text)
    return 0


def report(result: dict) -> str:
    lines = ["# Exercise 5 by minibatch size, eager and compiled", "",
             f"{result['card']}, torch {result['torch']}, optimizer {result['optimizer']}, a random-init model of "
             f"{'Qwen2.5-0.5B' if result['shape'] == 'qwen' else 'a tiny'} shape; `{result['command']}`.", "",
             "| layers | minibatch | update of 64 rows (s) | x4: 256 rows (s) | first step (s) | peak (GiB) | exercise 5 adds (GiB) |",
             "|---|---|---|---|---|---|---|"]
    for row in result["update"]:
        lines.append(f"| {'compiled' if row['compiled'] else 'eager'} | {row['minibatch_size']} | {row['step_s']:.2f} | "
                     f"{4 * row['step_s']:.2f} | {row['first_step_s']:.1f} | {row['peak_gib']:.2f} | {row['exercise5_gib']:.2f} |")
    lines += ["", f"Scoring forward of {result.get('scoring_rows', 256)} rows (logprobs and values, no gradient):", "",
              "| layers | rows per forward | LM head on | seconds | first (s) | transient memory (GiB) |", "|---|---|---|---|---|---|"]
    for row in result["scoring"]:
        head = "whole rows" if row["logits_chunk_tokens"] is None else f"{row['logits_chunk_tokens']} tokens at a time"
        lines.append(f"| {'compiled' if row['compiled'] else 'eager'} | {row['rows']} | {head} | {row['s']:.2f} | "
                     f"{row['first_s']:.1f} | {row['transient_gib']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

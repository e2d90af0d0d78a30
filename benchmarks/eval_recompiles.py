"""Why greedy evaluation through the rollout's compiled decoding recompiled past dynamo's limit.

A probe on a random-init Qwen2 of the real model's depth (24 layers, tiny widths, no download),
through the trainer's own ``rollout.generate`` with the Qwen config's fast path (static cache,
compiled decoding): the schedule of a run that evaluated that way (greedy float32 policy at the
evaluation batch, then sampled rollouts from the bfloat16 copy at the rollout batch, then the
float32 policy again), printing every recompilation dynamo reports and its guard, and the seconds
of each call. The evaluation the trainer now does (eager, dynamic cache) is timed beside it.

    python benchmarks/eval_recompiles.py [--eval-batch 64] [--rollout-batch 32] [--new-tokens 32]

On CPU nothing compiles (the trainer compiles on CUDA only): the probe then only checks that it runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assignment.trainer.config import load_config  # noqa: E402
from assignment.trainer.evaluate import eval_rollout_config  # noqa: E402
from assignment.trainer.rollout import generate, generation_copy  # noqa: E402


class Recompiles(logging.Handler):
    """Collects dynamo's recompilation messages (TORCH_LOGS=recompiles) and limit warnings."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "ecompil" in text or "recompile_limit" in text:
            self.lines.append(text)


def tiny_qwen2(device: torch.device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=24,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=1, pad_token_id=0, bos_token_id=None)
    return Qwen2ForCausalLM(config).to(device).eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eval-batch", type=int, default=64)
    parser.add_argument("--rollout-batch", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="enable it on the policy before copying, as the Qwen config's trainer does")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    handler = Recompiles()
    torch._logging.set_logs(recompiles=True)
    for name in ("torch._dynamo", "torch._dynamo.guards", "torch._dynamo.convert_frame"):
        logging.getLogger(name).addHandler(handler)
    cfg = load_config(ROOT / "configs" / "gsm8k_qwen_coder.yaml",
                      [f"rollout.max_new_tokens={args.new_tokens}", f"rollout.max_prompt_tokens={args.prompt_tokens}"])
    fast = cfg.rollout
    eager = eval_rollout_config(cfg)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # as the trainer sets it
    policy = tiny_qwen2(device)
    if args.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    sampler = generation_copy(policy, torch.bfloat16)

    def call(label: str, model, batch: int, cfg, greedy: bool) -> None:
        ids = torch.randint(3, 500, (batch, args.prompt_tokens), device=device)
        before = len(handler.lines)
        started = time.perf_counter()
        generate(model, ids, torch.ones_like(ids), cfg, 0, [1], greedy)
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(f"{label}: {time.perf_counter() - started:.2f} s, {len(handler.lines) - before} recompile messages")
        for line in handler.lines[before:before + 6]:
            print("   ", line.replace("\n", " | ")[:400])

    schedule = [("eval before (float32, greedy, compiled path)", policy, args.eval_batch, fast, True),
                ("rollout 1 (bfloat16 copy, sampled)", sampler, args.rollout_batch, fast, False),
                ("rollout 2 (bfloat16 copy, sampled)", sampler, args.rollout_batch, fast, False),
                ("eval after (float32, greedy, compiled path)", policy, args.eval_batch, fast, True),
                ("eval, eager dynamic cache (the trainer's path now)", policy, args.eval_batch, eager, True)]
    for label, model, batch, cfg, greedy in schedule:
        call(label, model, batch, cfg, greedy)
    print(f"device {device}, torch {torch.__version__}; {len(handler.lines)} recompile messages in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

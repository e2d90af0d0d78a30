"""Benchmark: what each change to the rollout's decoding buys, on a random-init Qwen2.5-0.5B shape.

    python benchmarks/decode_profile.py [--batch 256] [--new-tokens 400] [--out reports/performance/decode_profile_h100.md]

Needs no model files: a random-init Qwen2 with Qwen2.5-0.5B's shape (24 layers, 14 query heads,
2 key/value heads, 151,936 tokens, untied LM head, 630M parameters, as the GGUF loads) stands in,
as the trainer builds it: float32 weights with gradient checkpointing on, and the rollout's
bfloat16 sampler copy with a static cache and compiled decoding (``rollout.generate``). Prompts
are random tokens of 90-250 real tokens left-padded to 320 (``rollout.max_prompt_tokens``); a
random model rarely samples EOS, so every call decodes all ``--new-tokens`` steps, as the real
rollout does while any of its responses runs to the limit. Variants, each adding one change:

    sdpa                 transformers' sdpa (repeat_kv of the cache), the checkpointing hook kept
    + no hook            the sampler copy without gradient checkpointing's input-embedding hook
    + grouped attention  ``attention.grouped_decoding_attention``
    + deferred stop      ``rollout.deferred_stop_check`` (the trainer's path)

For each: the first call (compilation), the median of ``--repeats`` more, and a profiled call's
GPU time and the part of it in attention kernels (names holding "attention", "sdpa" or "fmha",
and the fused repeat_kv copies feeding them).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assignment.model import PolicyWithValueHead  # noqa: E402
from assignment.trainer import rollout  # noqa: E402
from assignment.trainer.config import RolloutConfig  # noqa: E402

PAD, EOS = 151643, [151643, 151645]
VARIANTS = ("sdpa", "+ no hook", "+ grouped attention", "+ deferred stop")


def qwen_shaped_policy() -> PolicyWithValueHead:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1e6, tie_word_embeddings=False, rms_norm_eps=1e-6, pad_token_id=PAD)
    torch.manual_seed(0)
    lm = Qwen2ForCausalLM(config)
    lm.generation_config.eos_token_id = EOS
    (getattr(lm, "activation_checkpointing_enable", None) or lm.gradient_checkpointing_enable)()
    return PolicyWithValueHead(lm.train()).cuda()


def sampler_for(variant: str, lm) -> torch.nn.Module:
    """The rollout's bfloat16 copy, with the changes before ``variant`` undone."""
    sampler = rollout.generation_copy(lm, torch.bfloat16)
    level = VARIANTS.index(variant)
    if level < 1:
        sampler.enable_input_require_grads()  # the hook the copy used to inherit
    if level < 2:
        sampler.set_attn_implementation("sdpa")
    return sampler


def prompts(batch: int, width: int = 320) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(90, 250, (batch,), generator=gen)
    ids = torch.randint(0, 150000, (batch, width), generator=gen)
    mask = (torch.arange(width)[None, :] >= (width - lengths)[:, None]).long()
    return torch.where(mask.bool(), ids, PAD).cuda(), mask.cuda()


def attention_kernel(name: str) -> bool:
    name = name.lower()
    return any(key in name for key in ("attention", "sdpa", "fmha"))


def measure(variant: str, policy, ids, mask, cfg: RolloutConfig, repeats: int) -> dict:
    sampler = sampler_for(variant, policy.lm)
    deferred = VARIANTS.index(variant) >= 3
    undeferred = lambda device: contextlib.nullcontext()  # noqa: E731

    def call():
        with contextlib.ExitStack() as stack:
            if not deferred:
                original = rollout.deferred_stop_check
                rollout.deferred_stop_check = undeferred
                stack.callback(setattr, rollout, "deferred_stop_check", original)
            torch.cuda.synchronize()
            started = time.perf_counter()
            out = rollout.generate(sampler, ids, mask, cfg, PAD, EOS)
            torch.cuda.synchronize()
            return time.perf_counter() - started, out.shape[1]

    first, _ = call()
    seconds = [call()[0] for _ in range(repeats)]
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _, steps = call()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0 and "Graph" not in e.key]
    gpu = sum(e.self_device_time_total for e in events) / 1e6
    attn = sum(e.self_device_time_total for e in events if attention_kernel(e.key)) / 1e6
    del sampler
    torch.cuda.empty_cache()
    return {"variant": variant, "first_s": first, "median_s": statistics.median(seconds), "steps": steps,
            "gpu_s": gpu, "attention_s": attn}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark profiles CUDA decoding: run it on a GPU machine")
    torch.set_float32_matmul_precision("high")  # as the trainer
    import transformers

    policy = qwen_shaped_policy()
    ids, mask = prompts(args.batch)
    cfg = RolloutConfig(batch_size=args.batch, max_prompt_tokens=320, max_new_tokens=args.new_tokens,
                        temperature=1.0, top_p=1.0, top_k=0, cache_implementation="static", compile=True,
                        generation_dtype="bfloat16")
    lines = ["# Decoding: what each change buys", "",
             f"Card: {torch.cuda.get_device_name()}; torch {torch.__version__}, transformers {transformers.__version__}.",
             f"Command: `python benchmarks/decode_profile.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
             f"A random-init Qwen2.5-0.5B shape, {args.batch} prompts, {args.new_tokens} new tokens, bfloat16 "
             f"sampler, static cache, compiled decoding; median of {args.repeats} calls after the first.", "",
             "| variant | first call (s) | median call (s) | ms per step | GPU time (s) | of which attention (s) |",
             "|---|---|---|---|---|---|"]
    for variant in args.variants:
        r = measure(variant, policy, ids, mask, cfg, args.repeats)
        lines.append(f"| {variant} | {r['first_s']:.1f} | {r['median_s']:.2f} | {1000 * r['median_s'] / r['steps']:.2f} | "
                     f"{r['gpu_s']:.2f} | {r['attention_s']:.2f} |")
        print(lines[-1], flush=True)
        if args.out:  # after every variant: a call cut by its time limit keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

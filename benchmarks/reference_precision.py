"""Benchmark: the error a bfloat16 or float16 reference model puts into PPO's k1 KL penalty.

    python benchmarks/reference_precision.py [--config configs/gsm8k_qwen_coder.yaml] [--n 32] \
        [--responses sample|greedy|reference] [--device cpu|cuda] \
        [--chunk 4] [--out reports/performance/reference_precision.md] [key=value ...]

Purpose. The trainer keeps a frozen copy of the LM as the reference; each response token's
penalty is ``kl.coeff * (logprobs_old - ref_logprobs)`` and the per-response sum is logged as
``rollout/kl`` (``assignment.trainer.ppo.kl_penalties`` / ``sequence_kl``). Holding that copy in
bfloat16 (float16 on cards without bfloat16) halves its memory; this measures what it costs in
the penalty while the policy stays float32.

Method. Loads the config's model with the trainer's loader (GGUF dequantized to float32) and the
first ``--n`` problems of its first training batch (``training_batch``, step 0), rendered with
``render_prompts`` as the trainer does. Responses are one of
    sample     sampled by the float32 model with the config's rollout settings (temperature 1:
               what the recipe's rollouts are), through the trainer's own ``rollout.sample``
               (the trainer samples from a bfloat16 copy; the responses' distribution is the
               same model's either way);
    greedy     the same, greedy;
    reference  GSM8K's gold solution teacher-forced as the response, then EOS (no generation:
               for machines too slow to sample; off-distribution text, so expect larger errors).
Each (prompt + response) is then scored by ``rollout.response_forward(ReferenceForward(ref))``,
the trainer's reference scoring, once with the float32 reference (true float32: TF32 off) and
once with a copy made as the trainer makes it for ``model.reference_dtype``
(``loading.reference_model``: parameters cast, buffers such as RoPE's ``inv_freq`` kept float32). The logits are upcast to
float32 before the log-softmax in every case (``logprobs_from_logits``), so the difference is the
forward pass's.
On CUDA one more row scores the float32 reference with TF32 matmuls, as the trainer runs it there
(``torch.set_float32_matmul_precision("high")`` in loop.py): the error the trainer already accepts.

Reading the figures. Per response token, delta = ref_logprob(float32) - ref_logprob(dtype): the
amount by which the low-precision reference *raises* the k1 term ``logprobs_old - ref_logprobs``
(the policy's own log-probs are unchanged). Summed over a response it is the error in that
response's ``rollout/kl``; times ``kl.coeff`` it is the error in its KL penalty, i.e. in its
reward. "bias" is the mean of that sum over responses (a systematic shift of the logged KL),
"std" its spread between responses (noise that reaches the advantages). Compare them with the KL
the recipe reaches (~28 nats per response at its end) and the reward scale (1 for a correct
answer). "non-finite" counts response tokens whose low-precision log-prob is inf or NaN (float16
overflow); they are left out of the other columns. CPU and GPU kernels round differently (a CPU
accumulates bfloat16 matmuls in its own way), so a GPU run of this script is the final word for
GPU training; the rounding of the weights and activations themselves is the same everywhere.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import transformers  # noqa: E402

from assignment.model import PolicyWithValueHead  # noqa: E402
from assignment.trainer.config import load_config  # noqa: E402
from assignment.trainer.data import load_problems, read_jsonl_records, training_batch  # noqa: E402
from assignment.trainer.loading import DTYPES, load_lm, load_tokenizer, reference_model  # noqa: E402
from assignment.trainer.rollout import (ReferenceForward, encode_prompts, eos_token_ids, render_prompts,  # noqa: E402
                                        response_forward, sample)


def sampled_batch(lm, tokenizer, prompts, rollout_cfg, greedy: bool):
    """(input_ids (B, P+T), attention_mask (B, P+T), P) from the trainer's own ``rollout.sample``."""
    out = sample(PolicyWithValueHead(lm), tokenizer, prompts, rollout_cfg, greedy=greedy)
    input_ids = torch.cat([out.prompt_ids, out.response_ids], dim=1)
    mask = torch.cat([out.prompt_mask, out.response_mask.to(out.prompt_mask.dtype)], dim=1)
    return input_ids, mask, out.prompt_ids.shape[1]


def teacher_forced_batch(lm, tokenizer, prompts, solutions, rollout_cfg, device):
    """(input_ids, attention_mask, P) with each gold solution (+ EOS) as the response, right-padded."""
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts, rollout_cfg.max_prompt_tokens, device)
    # The tokenizer's EOS ends a chat turn (Qwen: <|im_end|>); else the model's first EOS id.
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else eos_token_ids(lm, tokenizer)[0]
    rows = [tokenizer(s, add_special_tokens=False)["input_ids"][: rollout_cfg.max_new_tokens - 1] + [eos]
            for s in solutions]
    T = max(map(len, rows))
    response = torch.full((len(rows), T), tokenizer.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros(len(rows), T, dtype=prompt_mask.dtype)
    for i, row in enumerate(rows):
        response[i, : len(row)] = torch.tensor(row)
        response_mask[i, : len(row)] = 1
    input_ids = torch.cat([prompt_ids, response.to(device)], dim=1)
    return input_ids, torch.cat([prompt_mask, response_mask.to(device)], dim=1), prompt_ids.shape[1]


def error_stats(ref32: torch.Tensor, low: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Figures of delta = ref32 - low over the real tokens ``mask`` (all (B, T), float32)."""
    finite = torch.isfinite(low) & mask
    delta = torch.where(finite, ref32 - low, 0.0).double()
    per_seq = delta.sum(dim=-1)  # (B,) error in each response's rollout/kl, nats
    return {"tokens": int(mask.sum()), "nonfinite": int((mask & ~finite).sum()),
            "mean_abs": float(delta.abs().sum() / finite.sum()), "max_abs": float(delta.abs().max()),
            "bias": float(per_seq.mean()), "std": float(per_seq.std()), "max_seq": float(per_seq.abs().max())}


def cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


RESPONSE_SOURCES = {
    "sample": "sampled by the float32 model at the config's temperature (the trainer's `rollout.sample`)",
    "greedy": "greedy responses of the float32 model (the trainer's `rollout.sample`)",
    "reference": "GSM8K's gold solutions teacher-forced as responses (+ EOS)",
}


def gold_solutions(cfg, questions: list[str]) -> list[str]:
    """The GSM8K train solution of each question, from ``data.local_dir``."""
    if not cfg.data.local_dir:
        raise SystemExit("--responses reference needs data.local_dir (GSM8K_DIR) with train.jsonl")
    solutions = {r["question"]: r["answer"] for r in read_jsonl_records(Path(cfg.data.local_dir) / "train.jsonl")}
    return [solutions[q] for q in questions]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/gsm8k_qwen_coder.yaml")
    parser.add_argument("--n", type=int, default=32, help="problems (one response each)")
    parser.add_argument("--responses", choices=tuple(RESPONSE_SOURCES), default="sample")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--chunk", type=int, default=4, help="rows per scoring forward (the logits are chunk x T x V float32)")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--out", default="reports/performance/reference_precision.md")
    parser.add_argument("overrides", nargs="*", help="config key=value overrides (rollout.max_new_tokens=..., ...)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    cfg = load_config(args.config, args.overrides)
    device = torch.device(args.device)
    torch.manual_seed(cfg.train.seed)
    tokenizer = load_tokenizer(cfg.model)
    lm = load_lm(cfg.model, tokenizer, cfg.train.seed).to(device).eval()
    problems = training_batch(cfg.data, load_problems(cfg.data, cfg.train.seed)["train"], cfg.rollout.batch_size,
                              cfg.train.seed, 0, cfg.data.max_operand)[: args.n]
    prompts = render_prompts(tokenizer, [p.question for p in problems], cfg.data)
    print(f"loaded in {time.perf_counter() - started:.0f} s", flush=True)

    t0 = time.perf_counter()
    torch.set_float32_matmul_precision("highest")  # true float32 (no TF32) for the sampler and the baseline
    if args.responses == "reference":
        solutions = gold_solutions(cfg, [p.question for p in problems])
        input_ids, mask, P = teacher_forced_batch(lm, tokenizer, prompts, solutions, cfg.rollout, device)
    else:
        input_ids, mask, P = sampled_batch(lm, tokenizer, prompts, cfg.rollout, args.responses == "greedy")
    response_mask = mask[:, P:].bool()
    lengths = response_mask.sum(dim=-1).float()
    print(f"responses ({args.responses}) in {time.perf_counter() - t0:.0f} s: mean {lengths.mean():.0f} tokens, "
          f"max {lengths.max():.0f}", flush=True)
    ref = reference_model(lm)
    del lm

    def score(model: torch.nn.Module, matmul_precision: str = "highest") -> torch.Tensor:
        t = time.perf_counter()
        torch.set_float32_matmul_precision(matmul_precision)
        with torch.no_grad():
            lp, _ = response_forward(ReferenceForward(model), input_ids, mask, P, cfg.rollout.temperature, args.chunk,
                                     cfg.rollout.logits_chunk_tokens)
        torch.set_float32_matmul_precision("highest")
        print(f"  scored in {time.perf_counter() - t:.0f} s", flush=True)
        return lp.float()

    print("float32", flush=True)
    ref32 = score(ref)
    rows = {}
    if device.type == "cuda":  # the trainer's float32 reference on CUDA runs its matmuls in TF32 (loop.py)
        print("float32 + TF32", flush=True)
        rows["float32 + TF32 (the trainer on CUDA)"] = error_stats(ref32, score(ref, "high"), response_mask)
    for name in args.dtypes.split(","):
        print(name, flush=True)
        low = reference_model(ref, DTYPES[name])  # the trainer's model.reference_dtype cast
        rows[name] = error_stats(ref32, score(low), response_mask)
        del low
    elapsed = time.perf_counter() - started

    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cpu_name()} ({torch.get_num_threads()} threads)"
    command = "python benchmarks/reference_precision.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    coeff = cfg.kl.coeff
    lines = [
        "# A low-precision reference model: its error in the k1 KL penalty",
        "",
        f"Machine: {machine}; torch {torch.__version__}, transformers {transformers.__version__}.",
        f"Command: `{command}` ({elapsed / 60:.1f} min in all).",
        f"Model: {cfg.model.gguf_file or cfg.model.name} (dequantized to float32 by the trainer's loader); "
        f"config {args.config}, temperature {cfg.rollout.temperature}, kl.coeff {coeff}.",
        f"N = {len(problems)} problems of the first training batch, one response each: "
        f"{RESPONSE_SOURCES[args.responses]}, up to {cfg.rollout.max_new_tokens} tokens "
        f"(mean {lengths.mean():.0f}, max {lengths.max():.0f}; {int(lengths.sum())} response tokens in all).",
        "",
        "delta = ref log-prob in float32 (no TF32) - in the variant, per response token: what that reference adds "
        "to `logprobs_old - ref_logprobs`. Per response, its sum is the error in `rollout/kl` (nats); "
        f"times kl.coeff = {coeff}, the error in that response's reward.",
        "",
        "| reference | mean abs delta / token | max abs delta / token | bias: mean sum delta / response (nats) "
        "| std of sum delta / response (nats) | max abs sum delta | penalty error, kl.coeff x std | non-finite tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in rows.items():
        lines.append(f"| {name} | {s['mean_abs']:.4f} | {s['max_abs']:.3f} | {s['bias']:+.3f} | {s['std']:.3f} "
                     f"| {s['max_seq']:.3f} | {coeff * s['std']:.1e} | {s['nonfinite']} of {s['tokens']} |")
    lines += ["", "For scale: the recipe's `rollout/kl` reaches ~28 nats per response by its last steps "
              "(reports/gsm8k_qwen_coder.md), a penalty of ~0.03 in reward; a correct answer earns 1.", ""]
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()

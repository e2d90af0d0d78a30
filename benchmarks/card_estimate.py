"""Estimate: how long a profile's whole GSM8K run takes on a student's card, from one measured on a big one.

    python benchmarks/card_estimate.py --profile reports/performance/small_cards/profile_24gb_h200.json \
        --recipe reports/performance/small_cards/recipe_h200.json --run reports/gsm8k_qwen_coder_24gb \
        --cards 24 [--out FILE]

Not a measurement: nothing here ran on those cards. Each phase of a measured step (``ppo_step.py``
JSON, medians of the steps after the first) is scaled by the ratio of the datasheet figure that
bounds it, assuming the small card reaches the same fraction of its peak as the measured card did:

    generation          x  bandwidth(measured) / bandwidth(card)   decoding reads the sampler's weights
                                                                   and KV cache for every token
    scoring forwards    x  matmul(measured) / matmul(card)         float32 weights, TF32 matmuls (FP32
                                                                   on cards without TF32)
    update              max(the profile's update,                  exercise 5's work is the same in
                            the recipe's update x matmul ratio)    every profile; the recipe's large
                                                                   minibatches keep the GPU busiest, so
                                                                   its time stands for the GPU's work,
                                                                   and the profile's own time for the
                                                                   host's (kernel launches), which a
                                                                   smaller card does not make longer
    rest                unchanged                                  rewards and decoding text, on the host
    evaluation          x  bandwidth ratio                         greedy float32 decoding
    loading             unchanged

A card that is slower than the measured one spends more of its time on arithmetic and less waiting
for the host, so it reaches a larger fraction of its peak than assumed: read the figures as upper
estimates. Datasheet figures are dense (no sparsity): NVIDIA's product pages and architecture
whitepapers (Hopper H200, Ada RTX 4090/4080/4060 Ti and L4, Ampere RTX 3090 and A10, Turing T4,
Volta V100).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

# card: (memory GB, memory bandwidth GB/s, dense TFLOPS of float32 training matmuls: TF32 tensor
# cores where the card has them, plain FP32 where it does not (T4, V100))
CARDS = {
    "NVIDIA H200": (141, 4800, 494.7),
    "NVIDIA H100 80GB HBM3": (80, 3350, 494.7),
    "RTX 4090": (24, 1008, 82.6),
    "RTX 3090": (24, 936, 35.6),
    "A10": (24, 600, 62.5),
    "L4": (24, 300, 60.0),
    "RTX 4080": (16, 717, 48.7),
    "RTX 4060 Ti 16GB": (16, 288, 22.1),
    "V100 16GB (SXM2)": (16, 900, 15.7),
    "T4": (16, 320, 8.1),
}


def medians(bench: dict) -> dict[str, float]:
    """The median of each phase's seconds over the steps after the first (which compiles)."""
    steps = bench["steps"][1:]
    keys = ("generate_s", "policy_forward_s", "reference_forward_s", "update_s", "rest_s")
    return {key: statistics.median(step[key] for step in steps) for key in keys}


def estimate(profile: dict, recipe: dict, run_seconds: dict, steps: int, card: str) -> dict[str, float]:
    """Seconds per step and for the whole run on ``card``, scaled from the measured card."""
    _, bandwidth, matmul = CARDS[card]
    _, measured_bandwidth, measured_matmul = CARDS[profile["card"]]
    memory, compute = measured_bandwidth / bandwidth, measured_matmul / matmul
    mine, theirs = medians(profile), medians(recipe)
    step = (mine["generate_s"] * memory + (mine["policy_forward_s"] + mine["reference_forward_s"]) * compute
            + max(mine["update_s"], theirs["update_s"] * compute) + mine["rest_s"])
    whole = steps * step + run_seconds["evaluation"] * memory + run_seconds["other"]
    return {"step": step, "run": whole}


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, required=True, help="ppo_step.py JSON of the profile")
    parser.add_argument("--recipe", type=Path, required=True, help="ppo_step.py JSON of the recipe, same card")
    parser.add_argument("--run", type=Path, required=True, help="the profile's report folder (summary.json)")
    parser.add_argument("--cards", type=int, nargs="+", default=[24, 16], help="card sizes in GB to list")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    profile, recipe = (json.loads(path.read_text()) for path in (args.profile, args.recipe))
    if profile["card"] != recipe["card"]:
        parser.error(f"the profile ran on {profile['card']} and the recipe on {recipe['card']}: measure both on one card")
    summary = json.loads((args.run / "summary.json").read_text())
    lines = [f"Estimated from `{profile['label']}` on {profile['card']} ({args.run.name}: {summary['steps']} steps "
             "and both evaluations); `python benchmarks/card_estimate.py` says how.", "",
             "| card | memory | seconds per step | whole run |", "|---|---|---|---|"]
    for card, (gigabytes, _, _) in CARDS.items():
        if gigabytes in args.cards or card == profile["card"]:
            guess = estimate(profile, recipe, summary["seconds"], summary["steps"], card)
            lines.append(f"| {card} | {gigabytes} GB | {guess['step']:.0f} | {guess['run'] / 60:.0f} min |")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()

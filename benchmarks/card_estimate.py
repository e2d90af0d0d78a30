"""Estimate: how long a profile's whole GSM8K run takes on a student's card, from one measured on a big one.

    python benchmarks/card_estimate.py --profile reports/performance/small_cards/profile_24gb_h200.json \
        --recipe reports/performance/small_cards/recipe_h200.json --run reports/gsm8k_qwen_coder_24gb \
        --cards 24 [--out FILE]

Not a measurement: nothing here ran on those cards. A step's phases come from the profile's
``ppo_step.py`` JSON (medians of the steps after the first), calibrated to the profile's whole run
(``--run``, a report folder): the rollout's parts are scaled so that they add up to the run's median
rollout, and the update is the run's median update. Each phase is then scaled by the ratio of the
datasheet figure that bounds it, assuming the small card reaches the same fraction of its peak as
the measured card did:

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

The whole run: the run's training seconds (every step, the first one's compilation included) times
the ratio of the estimated step to the measured one, its evaluation seconds times the bandwidth
ratio (greedy float32 decoding), and its other seconds (loading) unchanged. On the measured card
every ratio is 1 and the run's own figures come back.

A card that is slower than the measured one spends more of its time on arithmetic and less waiting
for the host, so it reaches a larger fraction of its peak than assumed: read the figures as upper
estimates. ``--check`` measures how far off the assumption is where arithmetic does bound the
update: the recipe's update with TF32 off (plain FP32, 1/7.4 of the TF32 rate on an H200), against
what scaling its measured matmul time by that rate ratio predicts (``ppo_step.py --profile-update``
splits an update's GPU time into matmul kernels, other kernels and the time no kernel ran).

    python benchmarks/card_estimate.py --check TF32.json --against NO_TF32.json
 Datasheet figures are dense (no sparsity): NVIDIA's product pages and architecture
whitepapers (Hopper H200, Ada RTX 4090/4080/4060 Ti and L4, Ampere RTX 3090 and A10, Turing T4,
Volta V100). An A10G (AWS) is not an A10: look its figures up before adding it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from assignment.trainer.runlog import read_jsonl

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


PHASES = ("generate_s", "policy_forward_s", "reference_forward_s", "rest_s")
# Plain FP32 (CUDA cores, no tensor cores) of the measured cards, dense TFLOPS, for --check.
PLAIN_FP32 = {"NVIDIA H200": 67.0, "NVIDIA H100 80GB HBM3": 66.9}


def phases(bench: dict, run_metrics: list[dict] | None = None) -> dict[str, float]:
    """Median seconds of each phase over the steps after the first (which compiles); with the whole
    run's metrics, the rollout's parts rescaled to the run's median rollout and its median update."""
    steps = bench["steps"][1:]
    out = {key: statistics.median(step[key] for step in steps) for key in PHASES}
    out["update_s"] = unprofiled_update(bench)
    if run_metrics:
        measured = run_metrics[1:]
        rollout = statistics.median(m["time/rollout"] for m in measured)
        scale = rollout / sum(out[key] for key in PHASES)
        out = {key: out[key] * scale for key in PHASES} | {"update_s": statistics.median(m["time/update"] for m in measured)}
    return out


def estimate(profile: dict[str, float], recipe: dict[str, float], measured_card: str, card: str) -> float:
    """Seconds per step on ``card``: ``profile`` and ``recipe`` are ``phases`` measured on ``measured_card``."""
    memory, compute = ratios(measured_card, card)
    return (profile["generate_s"] * memory + (profile["policy_forward_s"] + profile["reference_forward_s"]) * compute
            + max(profile["update_s"], recipe["update_s"] * compute) + profile["rest_s"])


def ratios(measured_card: str, card: str) -> tuple[float, float]:
    """(bandwidth, matmul rate) of the measured card over ``card``'s: how many times slower ``card`` is."""
    _, bandwidth, matmul = CARDS[card]
    _, measured_bandwidth, measured_matmul = CARDS[measured_card]
    return measured_bandwidth / bandwidth, measured_matmul / matmul


def whole_run(step: float, measured_step: float, seconds: dict, memory: float) -> float:
    """The run's seconds on a card whose step takes ``step`` where the measured one took ``measured_step``."""
    return seconds["training"] * step / measured_step + seconds["evaluation"] * memory + seconds["other"]


def unprofiled_update(bench: dict) -> float:
    """The median update over the steps after the first whose update was not profiled (the
    profiler slows the host)."""
    steps = bench["steps"][1:]
    return statistics.median(step["update_s"] for step in [s for s in steps if "update_split" not in s] or steps)


def update_shares(bench: dict) -> dict[str, float]:
    """The shares of the update's time (summing to 1) that matmul kernels ran (``matmul``), attention
    kernels (``attention``), other kernels (``other``: elementwise, reductions, copies) and no kernel
    (``host``), from the profiled update (``update_split``) and the median update of the steps after
    the first that were not profiled (the profiler slows the host, not the kernels). Raises
    ValueError for a JSON measured without --profile-update."""
    split = next((step["update_split"] for step in bench["steps"] if step.get("update_split", {}).get("busy_s")), None)
    if split is None:
        raise ValueError(f"{bench.get('label', 'the JSON')}: no profiled update (measure with ppo_step.py --profile-update)")
    update = unprofiled_update(bench)
    kernels = {kind: split[f"{kind}_s"] for kind in ("matmul", "attention", "other")}
    busy = min(split["busy_s"], update)  # kernels that overlap count once: their kinds share busy_s pro rata
    shares = {kind: busy * seconds / sum(kernels.values()) / update for kind, seconds in kernels.items()}
    return shares | {"host": (update - busy) / update}


def check(fast: dict, slow: dict) -> dict[str, float]:
    """The estimate's assumption against a measurement where arithmetic bounds the update: ``fast``
    measured with TF32 and profiled, ``slow`` the same config with TF32 off. Two predictions: this
    script's own (``estimate`` scales the recipe's whole update by the rate ratio) and one that
    scales only the matmul kernels' share of it (the profile's split) and keeps the rest: TF32 is a
    matmul precision, so attention (float32 memory-efficient kernels, CUDA cores either way), other
    kernels and the host take what they took."""
    shares, update = update_shares(fast), unprofiled_update(fast)
    ratio = CARDS[fast["card"]][2] / PLAIN_FP32[fast["card"]]
    measured = unprofiled_update(slow)
    by_share = update * (shares["matmul"] * ratio + shares["attention"] + shares["other"] + shares["host"])
    return {"update_tf32_s": update, "rate_ratio": ratio, **{f"share_{k}": v for k, v in shares.items()},
            "measured_s": measured, "predicted_s": update * ratio, "error": update * ratio / measured - 1,
            "predicted_by_share_s": by_share, "error_by_share": by_share / measured - 1}


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, help="ppo_step.py JSON of the profile")
    parser.add_argument("--recipe", type=Path, help="ppo_step.py JSON of the recipe, same card")
    parser.add_argument("--run", type=Path, help="the profile's report folder (summary.json)")
    parser.add_argument("--cards", type=int, nargs="+", default=[24, 16], help="card sizes in GB to list")
    parser.add_argument("--check", type=Path, help="ppo_step.py JSON measured with TF32 and --profile-update")
    parser.add_argument("--against", type=Path, help="with --check: the same config measured with --no-tf32")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.check:
        return check_main(parser, args)
    if None in (args.profile, args.recipe, args.run):
        parser.error("--profile, --recipe and --run are required (or --check and --against)")
    for path in (args.profile, args.recipe, args.run / "summary.json", args.run / "metrics.jsonl"):
        if not path.is_file():
            parser.error(f"{path} not found")
    profile, recipe = (json.loads(path.read_text()) for path in (args.profile, args.recipe))
    if profile["card"] != recipe["card"]:
        parser.error(f"the profile ran on {profile['card']} and the recipe on {recipe['card']}: measure both on one card")
    if profile["card"] not in CARDS:
        parser.error(f"no datasheet figures for {profile['card']!r}: add it to CARDS")
    summary = json.loads((args.run / "summary.json").read_text())
    mine = phases(profile, read_jsonl(args.run / "metrics.jsonl"))
    theirs = phases(recipe)
    measured = estimate(mine, theirs, profile["card"], profile["card"])
    lines = [f"Estimated from `{profile['label']}` on {profile['card']}, calibrated to {args.run.name} ({summary['steps']} "
             "steps and both evaluations); `python benchmarks/card_estimate.py` says how.", "",
             "| card | memory | seconds per step | whole run |", "|---|---|---|---|"]
    for card, (gigabytes, _, _) in CARDS.items():
        if gigabytes in args.cards or card == profile["card"]:
            step = estimate(mine, theirs, profile["card"], card)
            run = whole_run(step, measured, summary["seconds"], ratios(profile["card"], card)[0])
            lines.append(f"| {card} | {gigabytes} GB | {step:.0f} | {run / 60:.0f} min |")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return text


def check_main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    for path in (args.check, args.against):
        if path is None or not path.is_file():
            parser.error(f"--check needs two ppo_step.py JSON files (--check and --against): {path} not found")
    fast, slow = (json.loads(path.read_text()) for path in (args.check, args.against))
    if fast["card"] not in PLAIN_FP32 or slow["card"] != fast["card"]:
        parser.error(f"--check needs both measured on one card of {sorted(PLAIN_FP32)}")
    try:
        text = json.dumps(check(fast, slow), indent=1) + "\n"
    except ValueError as err:
        parser.error(str(err))
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()

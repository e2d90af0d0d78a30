"""Estimate: how long a profile's whole GSM8K run takes on a student's card, from one measured on a big one.

    python benchmarks/card_estimate.py --profile reports/performance/small_cards/bf16/profile_24gb.json \
        --run reports/gsm8k_qwen_coder_24gb --cards 24 [--out FILE]
    python benchmarks/card_estimate.py --check TF32.json --against FP32.json   # the model's check

Not a measurement: nothing here ran on those cards. A step's phases come from the profile's
``ppo_step.py`` JSON (medians of the steps after the first), calibrated to the profile's whole run
(``--run``, a report folder): the rollout's parts are scaled so that they add up to the run's median
rollout, and the update is the run's median update. The update is split by the profiler
(``ppo_step.py --profile-update``: the GPU kernels of one update, by kind) into

    arithmetic    matmul and attention kernels           x  rate(measured) / rate(card)
    memory        every other kernel (elementwise,       x  bandwidth(measured) / bandwidth(card)
                  reductions, copies)
    host          the update's seconds no kernel ran:     unchanged
                  Python, kernel launches, the allocator

where the rate is the card's dense matmul rate in the precision the profile trains in: TF32 (plain
FP32 on cards without it: T4, V100) for float32, the 16-bit tensor-core rate (bfloat16, or float16
on T4 and V100) for ``model.train_dtype``. The other phases:

    generation          x  bandwidth ratio       decoding reads the sampler's weights and KV cache per token
    scoring forwards    x  rate ratio            the policy's and the reference's (in their dtypes)
    rest                unchanged                rewards and decoding text, on the host

The whole run: the run's training seconds times the ratio of the estimated step to the measured
one, its evaluation seconds times the larger of the bandwidth ratio and the rate ratio of the
precision it decodes in (greedy decoding of 1319 problems: bandwidth-bound on the measured card,
arithmetic-bound on a card whose float32 rate is low), and its other seconds (loading) unchanged.
On the measured card every ratio is 1 and the run's own figures come back.

A slower card spends more of its time on arithmetic and overlaps more of the host's time with it,
so the sum above is an upper estimate. ``--check`` tests the model where arithmetic does bound
the update: the same update measured with TF32 off (plain FP32, ~1/7 of the TF32 rate on an
H100/H200) against what the model predicts from the TF32 measurement's split.

Datasheet figures are dense (no sparsity): NVIDIA's product pages and architecture whitepapers
(Hopper H100/H200, Ada RTX 4090/4080/4060 Ti and L4, Ampere RTX 3090 and A10, Turing T4, Volta
V100). The 16-bit rates are the tensor cores' with float32 accumulation (GeForce cards: half their
float16-accumulate figure). An A10G (AWS) is not an A10: look its figures up before adding it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

from assignment.trainer.runlog import read_jsonl

# card: (memory GB, memory bandwidth GB/s, dense TFLOPS of float32 matmuls: TF32 tensor cores where
# the card has them, plain FP32 where it does not (T4, V100), dense TFLOPS of 16-bit matmuls:
# bfloat16 tensor cores, float16 on T4 and V100)
CARDS = {
    "NVIDIA H200": (141, 4800, 494.7, 989.5),
    "NVIDIA H100 80GB HBM3": (80, 3350, 494.7, 989.5),
    "RTX 4090": (24, 1008, 82.6, 165.2),
    "RTX 3090": (24, 936, 35.6, 71.0),
    "A10": (24, 600, 62.5, 125.0),
    "L4": (24, 300, 60.0, 121.0),
    "RTX 4080": (16, 717, 48.7, 97.5),
    "RTX 4060 Ti 16GB": (16, 288, 22.1, 44.2),
    "V100 16GB (SXM2)": (16, 900, 15.7, 125.0),
    "T4": (16, 320, 8.1, 65.0),
}
# Plain FP32 (no tensor cores) of the measured cards, for --check: H100 SXM 66.9, H200 67.
PLAIN_FP32 = {"NVIDIA H200": 67.0, "NVIDIA H100 80GB HBM3": 66.9}

PHASES = ("generate_s", "policy_forward_s", "reference_forward_s", "rest_s")
UPDATE_PARTS = ("arithmetic", "memory", "host")


def phases(bench: dict, run_metrics: list[dict] | None = None) -> dict[str, float]:
    """Median seconds of each phase over the steps after the first (which compiles), and the
    update's parts (``update_parts``); with the whole run's metrics, the rollout's parts rescaled
    to the run's median rollout and the update to its median update."""
    steps = bench["steps"][1:]
    out = {key: statistics.median(step[key] for step in steps) for key in (*PHASES, "update_s")}
    if run_metrics:
        measured = run_metrics[1:]
        rollout = statistics.median(m["time/rollout"] for m in measured)
        scale = rollout / sum(out[key] for key in PHASES)
        out = {key: out[key] * scale for key in PHASES} | {"update_s": statistics.median(m["time/update"] for m in measured)}
    return out | {f"update_{part}": share * out["update_s"] for part, share in update_shares(bench).items()}


def update_shares(bench: dict) -> dict[str, float]:
    """The shares of the update's time (summing to 1) that were arithmetic kernels, memory-bound
    kernels and host time, from the profiled update (``update_split``) and the median update of
    the unprofiled steps (the profiler slows the host, not the kernels). Raises ValueError for a
    JSON measured without --profile-update."""
    split = next((step["update_split"] for step in bench["steps"] if step.get("update_split", {}).get("busy_s")), None)
    if split is None:
        raise ValueError(f"{bench.get('label', 'the profile')}: no profiled update (measure with ppo_step.py --profile-update)")
    plain = [step["update_s"] for step in bench["steps"][1:] if "update_split" not in step] or [bench["steps"][-1]["update_s"]]
    update = statistics.median(plain)
    arithmetic, memory = split["matmul_s"] + split["attention_s"], split["other_s"]
    kernels = arithmetic + memory
    # Kernels that overlap (several streams) count once in busy_s: their kinds share it pro rata.
    busy = min(split["busy_s"], update)
    return {"arithmetic": busy * arithmetic / kernels / update, "memory": busy * memory / kernels / update,
            "host": (update - busy) / update}


def ratios(measured_card: str, card: str, precision: str) -> tuple[float, float]:
    """(bandwidth, matmul rate in ``precision``) of the measured card over ``card``'s: how many times
    slower ``card`` is. ``precision``: float32 (TF32 or plain FP32), or a 16-bit dtype."""
    column = 2 if precision == "float32" else 3
    return CARDS[measured_card][1] / CARDS[card][1], CARDS[measured_card][column] / CARDS[card][column]


def precisions(config: dict) -> dict[str, str]:
    """The dtype each part of a run computes in, from its effective config: ``train`` (the
    update and the policy's scoring forward), ``reference`` and ``eval``."""
    model = config["model"]
    train = model.get("train_dtype") or model["dtype"]
    sampler = config["rollout"].get("generation_dtype")
    return {"train": train, "reference": model.get("reference_dtype") or model["dtype"],
            "eval": sampler if config["eval"].get("model") == "sampler" and sampler else model["dtype"]}


def estimate(profile: dict[str, float], measured_card: str, card: str, dtypes: dict[str, str]) -> float:
    """Seconds per step on ``card``: ``profile`` is ``phases`` measured on ``measured_card``."""
    memory, train_rate = ratios(measured_card, card, dtypes["train"])
    reference_rate = ratios(measured_card, card, dtypes["reference"])[1]
    return (profile["generate_s"] * memory + profile["policy_forward_s"] * train_rate
            + profile["reference_forward_s"] * reference_rate + profile["update_arithmetic"] * train_rate
            + profile["update_memory"] * memory + profile["update_host"] + profile["rest_s"])


def whole_run(step: float, measured_step: float, seconds: dict, eval_ratio: float) -> float:
    """The run's seconds on a card whose step takes ``step`` where the measured one took ``measured_step``."""
    return seconds["training"] * step / measured_step + seconds["evaluation"] * eval_ratio + seconds["other"]


def eval_ratio(measured_card: str, card: str, dtypes: dict[str, str]) -> float:
    return max(ratios(measured_card, card, dtypes["eval"]))


def check(fast: dict, slow: dict) -> dict[str, float]:
    """The model against a measurement where arithmetic bounds the update: ``fast`` measured with
    TF32 and profiled, ``slow`` the same update with TF32 off. The prediction scales ``fast``'s
    arithmetic share by the TF32 / plain-FP32 rate ratio and keeps the rest."""
    card = fast["card"]
    shares = update_shares(fast)
    update = statistics.median(step["update_s"] for step in fast["steps"][1:] if "update_split" not in step)
    ratio = CARDS[card][2] / PLAIN_FP32[card]
    predicted = update * (shares["arithmetic"] * ratio + shares["memory"] + shares["host"])
    measured = statistics.median(step["update_s"] for step in slow["steps"][1:] if "update_split" not in step)
    return {"update_tf32_s": update, "rate_ratio": ratio, **{f"share_{k}": v for k, v in shares.items()},
            "predicted_s": predicted, "measured_s": measured, "error": predicted / measured - 1}


def table(bench: dict, run: Path, cards: list[int]) -> str:
    """The Markdown table of one profile's estimates."""
    summary = json.loads((run / "summary.json").read_text())
    dtypes = precisions(yaml.safe_load((run / "config.yaml").read_text()))
    card = bench["card"]
    mine = phases(bench, read_jsonl(run / "metrics.jsonl"))
    measured = estimate(mine, card, card, dtypes)
    lines = [f"Estimated from `{bench['label']}` on {card}, calibrated to {run.name} ({summary['steps']} steps and both "
             f"evaluations; trains in {dtypes['train']}, evaluates in {dtypes['eval']}); "
             "`python benchmarks/card_estimate.py` says how.", "",
             "| card | memory | seconds per step | whole run | bound by |", "|---|---|---|---|---|"]
    for name, (gigabytes, _, _, _) in CARDS.items():
        if gigabytes in cards or name == card:
            step = estimate(mine, card, name, dtypes)
            total = whole_run(step, measured, summary["seconds"], eval_ratio(card, name, dtypes))
            lines.append(f"| {name} | {gigabytes} GB | {step:.0f} | {total / 60:.0f} min | {bound_by(mine, card, name, dtypes)} |")
    return "\n".join(lines) + "\n"


def bound_by(profile: dict[str, float], measured_card: str, card: str, dtypes: dict[str, str]) -> str:
    """The phase of the estimated step that takes the most time on ``card``."""
    memory, train_rate = ratios(measured_card, card, dtypes["train"])
    reference_rate = ratios(measured_card, card, dtypes["reference"])[1]
    parts = {"generation": profile["generate_s"] * memory,
             "scoring forwards": profile["policy_forward_s"] * train_rate + profile["reference_forward_s"] * reference_rate,
             "update: matmuls": profile["update_arithmetic"] * train_rate,
             "update: memory traffic": profile["update_memory"] * memory,
             "update: host": profile["update_host"], "rest (host)": profile["rest_s"]}
    return max(parts, key=parts.get)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, help="ppo_step.py JSON of the profile (with --profile-update)")
    parser.add_argument("--run", type=Path, help="the profile's report folder (summary.json, config.yaml, metrics.jsonl)")
    parser.add_argument("--cards", type=int, nargs="+", default=[24, 16], help="card sizes in GB to list")
    parser.add_argument("--check", type=Path, help="ppo_step.py JSON measured with TF32 and --profile-update")
    parser.add_argument("--against", type=Path, help="with --check: the same measured with --no-tf32")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.check:
        for path in (args.check, args.against):
            if path is None or not path.is_file():
                parser.error(f"--check needs two ppo_step.py JSON files: {path} not found")
        fast, slow = (json.loads(path.read_text()) for path in (args.check, args.against))
        if fast["card"] not in PLAIN_FP32 or slow["card"] != fast["card"]:
            parser.error(f"--check needs both measured on one card of {sorted(PLAIN_FP32)}")
        try:
            text = json.dumps(check(fast, slow), indent=1) + "\n"
        except ValueError as err:
            parser.error(str(err))
    else:
        if args.profile is None or args.run is None:
            parser.error("--profile and --run are required (or --check and --against)")
        for path in (args.profile, args.run / "summary.json", args.run / "metrics.jsonl", args.run / "config.yaml"):
            if not path.is_file():
                parser.error(f"{path} not found")
        bench = json.loads(args.profile.read_text())
        if bench["card"] not in CARDS:
            parser.error(f"no datasheet figures for {bench['card']!r}: add it to CARDS")
        try:
            text = table(bench, args.run, args.cards)
        except ValueError as err:
            parser.error(str(err))
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()

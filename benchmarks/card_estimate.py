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

``--by-kind`` (reports/performance.md, the end of Part 6) is the model that check supports, for
float32 and for 16-bit training: the update is split by what ran (``update_kinds``), its matmul
kernels scaled by the matmul rate ratio in the precision trained in (TF32/FP32, or HALF's 16-bit
rate), its attention and other kernels by the bandwidth ratio (they read and write activations;
an assumption the TF32-off check does not test, since TF32 left them unchanged), and the seconds
no kernel ran kept (upper: a slower card hides more of the host behind its kernels). Generation,
the scoring forwards (at the rate of the precision they run in) and the rest as above.

    python benchmarks/card_estimate.py --by-kind --profile P.json --recipe R.json --run RUN \
        [--split FP32_SPLIT.json] --half HALF.json (--half-run HALF_RUN | --half-seconds OTHER_HALF_RUN)

``--split``: the float32 update's profiled split when ``--profile`` has none (the kernels are
kept, the host is the rest of the run's median update). ``--half``: the profile's 16-bit step,
profiled; ``--half-run``: that profile's 16-bit whole run, which calibrates it and gives the whole
run's seconds; ``--half-seconds``: where the profile has no 16-bit run, another profile's, whose
seconds (training per median step, evaluation by the 16-bit sampler, loading) stand in.

Datasheet figures are dense (no sparsity): NVIDIA's product pages and architecture
whitepapers (Hopper H200, Ada RTX 4090/4080/4060 Ti and L4, Ampere RTX 3090 and A10, Turing T4,
Volta V100); HALF's comments say which were confirmed and where. An A10G (AWS) is not an A10:
look its figures up before adding it.
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


# card: (dense TFLOPS of the 16-bit matmuls it trains with, that type). bfloat16 with FP32
# accumulate on Hopper, Ampere and Ada (GeForce cards list it as "FP16/BF16 tensor with FP32
# accumulate", half their FP16-accumulate figure); float16 tensor cores (FP32 accumulate) on T4 and
# V100, which have no bfloat16. Where each figure was checked (public copies of NVIDIA's tables):
HALF = {
    # H200 and H100 SXM: 1,979 with sparsity (pages copying NVIDIA's H200 table; a dense ~989 on
    # another), half of it dense: 2x their TF32 494.7. NVIDIA's own pages not reached.
    "NVIDIA H200": (989.4, "bfloat16"),
    "NVIDIA H100 80GB HBM3": (989.4, "bfloat16"),
    # Ada whitepaper, RTX 4090: 165.2 (third-party copies: 165.15 BF16 dense); not read in the
    # whitepaper itself.
    "RTX 4090": (165.2, "bfloat16"),
    # Ampere GA102 whitepaper, RTX 3090 "BF16 Tensor with FP32 Accumulate 71/142": only its table of
    # contents was reached; third-party copies give 71.2 (2x TF32 35.6). Not confirmed.
    "RTX 3090": (71.0, "bfloat16"),
    # A10 datasheet, BFLOAT16 Tensor Core 125 (250 with sparsity), 2x its TF32 62.5. Not confirmed:
    # no copy of the datasheet was found.
    "A10": (125.0, "bfloat16"),
    # L4 datasheet: 242 with sparsity, half dense. A copy of the datasheet confirms its TF32 120
    # with sparsity and 300 GB/s; the BF16 line was not in it (third-party: 125.3 from clocks).
    "L4": (121.0, "bfloat16"),
    # Ada whitepaper, RTX 4080: 97.5 (third-party copies: 97.4); not read in the whitepaper.
    "RTX 4080": (97.5, "bfloat16"),
    # Not in the Ada whitepaper: 34 SMs x 512 FLOP a clock (the 4090's 165.2 over its 128 SMs at
    # 2.52 GHz) x 2.535 GHz boost = 44.1, 2x its 22.1. Derived, not confirmed.
    "RTX 4060 Ti 16GB": (44.1, "bfloat16"),
    # V100 SXM2: "up to 125 Tensor TFLOPS" (NVIDIA's developer blog on programming tensor cores).
    "V100 16GB (SXM2)": (125.0, "float16"),
    # T4 datasheet: 65 mixed-precision FP16/FP32, against 8.1 FP32: not read in NVIDIA's datasheet;
    # launch reports and spec databases (65.13 from clocks) give the same.
    "T4": (65.0, "float16"),
}


PHASES = ("generate_s", "policy_forward_s", "reference_forward_s", "rest_s")
KINDS = ("matmul", "attention", "other")
# What a step's time goes to by ``step_by_kind``, each scaled by what bounds it.
TERMS = ("generation", "scoring", "update matmuls", "update attention + other", "update host", "rest")
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


def ratios(measured_card: str, card: str, precision: str = "float32") -> tuple[float, float]:
    """(bandwidth, matmul rate) of the measured card over ``card``'s: how many times slower ``card``
    is. ``precision``: "float32" (CARDS' TF32/FP32 rate) or "16-bit" (HALF's)."""
    rate = {"float32": lambda name: CARDS[name][2], "16-bit": lambda name: HALF[name][0]}[precision]
    return CARDS[measured_card][1] / CARDS[card][1], rate(measured_card) / rate(card)


def whole_run(step: float, measured_step: float, seconds: dict, memory: float) -> float:
    """The run's seconds on a card whose step takes ``step`` where the measured one took ``measured_step``."""
    return seconds["training"] * step / measured_step + seconds["evaluation"] * memory + seconds["other"]


def unprofiled_update(bench: dict) -> float:
    """The median update over the steps after the first whose update was not profiled (the
    profiler slows the host)."""
    steps = bench["steps"][1:]
    return statistics.median(step["update_s"] for step in [s for s in steps if "update_split" not in s] or steps)


def update_kinds(bench: dict, update: float | None = None) -> dict[str, float]:
    """An update's seconds by what ran, summing to ``update`` (default: the bench's median update
    over the steps after the first that were not profiled): matmul kernels (``matmul``), attention
    kernels (``attention``), other kernels (``other``: elementwise, reductions, copies) from the
    profiled update (``update_split``), and ``host``, the rest, when no kernel ran. The profiler
    slows the host, not the kernels, so the kernels keep their profiled seconds and the host takes
    what is left: pass a whole run's median update to calibrate to it. Raises ValueError for a JSON
    measured without --profile-update."""
    split = next((step["update_split"] for step in bench["steps"] if step.get("update_split", {}).get("busy_s")), None)
    if split is None:
        raise ValueError(f"{bench.get('label', 'the JSON')}: no profiled update (measure with ppo_step.py --profile-update)")
    update = unprofiled_update(bench) if update is None else update
    kernels = {kind: split[f"{kind}_s"] for kind in KINDS}
    busy = min(split["busy_s"], update)  # kernels that overlap count once: their kinds share busy_s pro rata
    return {kind: busy * seconds / sum(kernels.values()) for kind, seconds in kernels.items()} | {"host": update - busy}


def update_shares(bench: dict) -> dict[str, float]:
    """``update_kinds`` of the bench's own median update as shares of it (summing to 1)."""
    update = unprofiled_update(bench)
    return {kind: seconds / update for kind, seconds in update_kinds(bench, update).items()}


def step_by_kind(profile: dict[str, float], kinds: dict[str, float], measured_card: str, card: str,
                 precision: str) -> dict[str, float]:
    """Seconds per step on ``card`` by term (TERMS; they add up to the step): ``profile`` is ``phases``
    and ``kinds`` its update's ``update_kinds``, measured on ``measured_card`` in ``precision``
    ("float32" or "16-bit", as ``ratios``). Generation, scoring and the rest as ``estimate`` (the
    scoring forwards at the rate of the precision they run in); the update's matmul kernels times
    the rate ratio, its attention and other kernels times the bandwidth ratio, its host unchanged."""
    memory, compute = ratios(measured_card, card, precision)
    scoring = profile["policy_forward_s"] + profile["reference_forward_s"]
    return dict(zip(TERMS, (profile["generate_s"] * memory, scoring * compute, kinds["matmul"] * compute,
                            (kinds["attention"] + kinds["other"]) * memory, kinds["host"], profile["rest_s"])))


def median_step(run_metrics: list[dict]) -> float:
    """A whole run's median rollout plus its median update over the steps after the first: the step
    ``phases`` calibrates to."""
    measured = run_metrics[1:]
    return statistics.median(m["time/rollout"] for m in measured) + statistics.median(m["time/update"] for m in measured)


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
    parser.add_argument("--by-kind", action="store_true", help="the table by kernel kind, float32 and 16-bit")
    parser.add_argument("--split", type=Path, help="with --by-kind: the float32 update's profiled split (default --profile)")
    parser.add_argument("--half", type=Path, help="with --by-kind: the profile's 16-bit step, profiled")
    parser.add_argument("--half-run", type=Path, help="with --by-kind: the profile's 16-bit whole run")
    parser.add_argument("--half-seconds", type=Path, help="with --by-kind: another profile's 16-bit whole run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.check:
        return check_main(parser, args)
    if args.by_kind:
        return by_kind_main(parser, args)
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


def by_kind(old: tuple[dict, dict], float32: tuple[dict, dict, float, dict], half: tuple[dict, dict, float, dict],
            measured_card: str, cards: list[str]) -> dict[str, dict]:
    """Per card of ``cards``, (seconds per step, seconds of the whole run) by ``estimate`` ("table":
    ``old`` is the profile's and the recipe's ``phases``) and by ``step_by_kind`` ("float32",
    "16-bit": each given as ``phases``, ``update_kinds``, the step the whole run's seconds were
    measured at, and those seconds, summary.json's), and the TERMS entry that bounds the 16-bit
    step ("bound")."""
    mine, theirs = old
    out = {}
    for card in cards:
        memory = ratios(measured_card, card)[0]
        step = estimate(mine, theirs, measured_card, card)
        row = {"table": (step, whole_run(step, estimate(mine, theirs, measured_card, measured_card), float32[3], memory))}
        for precision, (phased, kinds, measured_step, seconds) in (("float32", float32), ("16-bit", half)):
            terms = step_by_kind(phased, kinds, measured_card, card, precision)
            row[precision] = (sum(terms.values()), whole_run(sum(terms.values()), measured_step, seconds, memory))
        out[card] = row | {"bound": max(terms, key=terms.get)}
    return out


def duration(seconds: float) -> str:
    """A whole run's length as the pages write it: minutes under 100, hours from there."""
    return f"{seconds / 60:.0f} min" if seconds < 6000 else f"{seconds / 3600:.1f} h"


def by_kind_table(rows: dict[str, dict]) -> str:
    """``by_kind``'s rows as the Markdown table of ``--by-kind``."""
    cell = lambda figures: f"{figures[0]:.0f} s, {duration(figures[1])}"
    return "\n".join(["| card | float32, the table's model | float32 by kernel kind | 16-bit by kernel kind | 16-bit bound by |",
                      "|---|---|---|---|---|"]
                     + [f"| {card} | {cell(row['table'])} | {cell(row['float32'])} | {cell(row['16-bit'])} ({HALF[card][1]}) "
                        f"| {row['bound']} |" for card, row in rows.items()]) + "\n"


def load_by_kind(profile: Path, recipe: Path, run: Path, split: Path, half: Path, half_run: Path,
                 own_half_run: bool) -> tuple:
    """``by_kind``'s first four arguments (the last: the card all were measured on) from the files,
    ppo_step.py JSON and report folders. ``half_run`` calibrates ``half`` where it is that profile's own run
    (``own_half_run``); otherwise only its seconds and median step are used. Raises OSError for a
    missing file, ValueError for JSON measured on different cards or without a profiled update."""
    profile, recipe, split, half = (json.loads(path.read_text()) for path in (profile, recipe, split, half))
    if len({bench["card"] for bench in (profile, recipe, split, half)}) != 1 or profile["card"] not in CARDS:
        raise ValueError("--by-kind needs every JSON measured on one card of CARDS")
    card = profile["card"]
    metrics, half_metrics = read_jsonl(run / "metrics.jsonl"), read_jsonl(half_run / "metrics.jsonl")
    seconds, half_seconds = (json.loads((folder / "summary.json").read_text())["seconds"] for folder in (run, half_run))
    mine, half_phases = phases(profile, metrics), phases(half, half_metrics if own_half_run else None)
    kinds, half_kinds = update_kinds(split, mine["update_s"]), update_kinds(half, half_phases["update_s"])
    measured_half = (sum(step_by_kind(half_phases, half_kinds, card, card, "16-bit").values()) if own_half_run
                     else median_step(half_metrics))
    return ((mine, phases(recipe)), (mine, kinds, sum(step_by_kind(mine, kinds, card, card, "float32").values()), seconds),
            (half_phases, half_kinds, measured_half, half_seconds), card)


def by_kind_main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    if None in (args.profile, args.recipe, args.run, args.half) or (args.half_run is None) == (args.half_seconds is None):
        parser.error("--by-kind needs --profile, --recipe, --run, --half and one of --half-run, --half-seconds")
    try:
        inputs = load_by_kind(args.profile, args.recipe, args.run, args.split or args.profile, args.half,
                              args.half_run or args.half_seconds, args.half_run is not None)
    except (OSError, ValueError) as err:
        parser.error(str(err))
    text = by_kind_table(by_kind(*inputs, [card for card, (gigabytes, _, _) in CARDS.items()
                                           if gigabytes in args.cards or card == inputs[-1]]))
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

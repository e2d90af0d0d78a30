"""The scaling report's measurements: the trainer on one GPU, then data-parallel on several, one
launch after another on one machine, each summarised as one record of ``scaling.json``.

    python benchmarks/scaling.py --config configs/gsm8k_qwen_coder.yaml --impl solutions/exercises.py \
        --launches single ddp:2 ddp:4 fsdp:2 fsdp:4 --out reports/multi_gpu/scaling.json [key=value ...]
    python benchmarks/scaling.py --check reports/multi_gpu/scaling.json
    python benchmarks/scaling.py --markdown reports/multi_gpu/scaling.json

The first form runs, for each launch, ``--steps`` PPO steps of the config (no evaluation, no
checkpoint: ``eval.size=0 train.final_checkpoint=false``) into ``--runs-dir``/LAUNCH_N (a scratch
folder, replaced), with its log beside it:
    single   python -m assignment.trainer ...                       (one process, one GPU)
    ddp:N    accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes N -m assignment.trainer ...
    fsdp:N   accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes N -m assignment.trainer ...
in an environment that keeps NVLink multicast off (``NVLS_OFF``: a program that uses it can put a
shared host's GPUs out of service), and on a machine without CUDA on CPU processes (gloo,
``ACCELERATE_USE_CPU=1``), as the test suite runs it with the tiny synthetic model. It reads each
run's ``metrics.jsonl`` and writes (merging into ``--out``, replacing the records of the same
launch, size and card) records of exactly this form:

    {"launch": "single" | "ddp" | "fsdp", "gpus": N, "card": "<nvidia-smi name>" (or "cpu"),
     "seconds_per_step": s, "tokens_per_second": t, "peak_memory_gib": g (null on CPU), "command": "..."}

``seconds_per_step`` is the median over the steps after the first (at least 5) of the trainer's
``time/rollout + time/update``; ``tokens_per_second`` the median over the same steps of the step's
real response tokens (``rollout/response_length x rollout.batch_size``: EOS included, padding not,
the whole job's) divided by its seconds; ``peak_memory_gib`` the largest ``memory/peak_memory_gib``
of those steps: what torch's allocator held at most on the main process's GPU (the others are
not logged). The first step is left out: it compiles and warms up.

``--code DIR`` runs the trainer of another tree instead of this checkout's (``git archive COMMIT
assignment solutions configs | tar -x -C DIR``: the launches run in DIR, where ``python -m
assignment.trainer`` imports DIR's package), so that the code before and after a change is
measured on one machine in one lease; a tree without ``train.final_checkpoint`` writes its final
checkpoint after the measured steps.

The second form checks such a file's form (``check``) and prints each data-parallel record's
efficiency against the single-GPU record of the same card (``efficiencies``):
    efficiency = tokens_per_second(launch on N GPUs) / (N x tokens_per_second(single))
The third prints its Markdown table (``table``), which reports/multi_gpu.md carries verbatim.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAUNCHES = ("single", "ddp", "fsdp")
KEYS = ("launch", "gpus", "card", "seconds_per_step", "tokens_per_second", "peak_memory_gib", "command")
# NVLink multicast stays off in every process the launches start (NCCL, torch's symmetric memory, NVSHMEM).
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MIN_MEASURED = 5  # steps after the first


class ScalingError(ValueError):
    """A malformed scaling file or launch list, or a run that cannot be summarised: one message, no traceback."""


def parse_launch(text: str) -> tuple[str, int]:
    """"single" -> ("single", 1); "ddp:4" -> ("ddp", 4); "fsdp:2" -> ("fsdp", 2)."""
    kind, _, n = text.partition(":")
    if kind == "single" and not n:
        return kind, 1
    if kind in ("ddp", "fsdp") and n.isdigit() and int(n) >= 2:
        return kind, int(n)
    raise ScalingError(f"launch '{text}' must be single, ddp:N or fsdp:N with N >= 2")


def free_port() -> int:
    """A free TCP port for the launch's rendezvous: two launches must not meet at accelerate's 29500."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(kind: str, n: int, trainer_args: list[str], port: int) -> list[str]:
    """The command of one launch, with ``python`` and ``accelerate`` by name (``run`` resolves them)."""
    if kind == "single":
        return ["python", "-m", "assignment.trainer", *trainer_args]
    return ["accelerate", "launch", "--config_file", f"configs/accelerate/{kind}.yaml", "--num_processes", str(n),
            "--main_process_port", str(port), "-m", "assignment.trainer", *trainer_args]


def launch_env(cuda: bool) -> dict[str, str]:
    """What the launches add to the environment: multicast off; without CUDA, CPU processes (gloo)."""
    return {**NVLS_OFF, **({} if cuda else {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"})}


def card_name() -> str:
    """The GPUs' name as nvidia-smi gives it ("cpu" where there is none); one name for the machine."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    names = {line.strip() for line in done.stdout.splitlines() if line.strip()}
    if done.returncode or not names:
        return "cpu"
    if len(names) > 1:
        raise ScalingError(f"the machine has GPUs of several kinds ({', '.join(sorted(names))}): measure on one kind")
    return names.pop()


def summarize(metrics: list[dict[str, float]], batch_size: int) -> dict[str, float | None]:
    """seconds_per_step, tokens_per_second and peak_memory_gib of a run's per-step metrics (the
    module docstring says how), over the steps after the first."""
    measured = metrics[1:]
    if len(measured) < MIN_MEASURED:
        raise ScalingError(f"{len(metrics)} steps logged: the medians need the first and {MIN_MEASURED} more")
    seconds = [m["time/rollout"] + m["time/update"] for m in measured]
    tokens = [m["rollout/response_length"] * batch_size for m in measured]
    peaks = [m["memory/peak_memory_gib"] for m in measured if "memory/peak_memory_gib" in m]
    return {"seconds_per_step": statistics.median(seconds),
            "tokens_per_second": statistics.median(t / s for t, s in zip(tokens, seconds)),
            "peak_memory_gib": max(peaks) if peaks else None}


def run_launch(text: str, config: str, impl: str, steps: int, overrides: list[str], runs_dir: Path,
               card: str, cuda: bool, base: Path = ROOT) -> dict[str, Any]:
    """Run one launch, in the tree ``base``, into its scratch folder and return its record;
    ScalingError if it fails. Relative paths are ``base``'s."""
    from assignment.trainer.config import load_config
    from assignment.trainer.runlog import read_jsonl

    kind, n = parse_launch(text)
    out = runs_dir / f"{kind}_{n}"  # as the launch, in the folder base, names it
    shutil.rmtree(base / out, ignore_errors=True)
    (base / runs_dir).mkdir(parents=True, exist_ok=True)
    # An older tree's trainer refuses the key (and saves a checkpoint after the measured steps).
    final = ["train.final_checkpoint=false"] if "final_checkpoint" in (
        base / "assignment" / "trainer" / "config.py").read_text() else []
    trainer_args = ["--config", config, "--impl", impl, *overrides, f"train.steps={steps}", "eval.size=0", *final,
                    "train.checkpoint_every=0", "train.progress=false", "train.log_every=1", f"train.output_dir={out}"]
    command = launch_command(kind, n, trainer_args, free_port())
    added = launch_env(cuda)
    bin_dir = Path(sys.executable).parent
    executable = {"python": sys.executable, "accelerate": str(bin_dir / "accelerate")
                  if (bin_dir / "accelerate").exists() else "accelerate"}
    log = base / runs_dir / f"{kind}_{n}.log"
    print(f"[scaling] {text}: {shlex.join(command)}  (log: {log})", flush=True)
    with log.open("w") as sink:
        done = subprocess.run([executable.get(command[0], command[0]), *command[1:]], cwd=base, stdout=sink,
                              stderr=subprocess.STDOUT, env={**os.environ, **added})
    if done.returncode:  # the trainer's own message (a torchrun summary follows it), and the end
        lines = log.read_text().splitlines()
        said = [line for line in lines if line.startswith("ppo-train:")][:2]
        tail = "\n".join(said + lines[-10:])
        raise ScalingError(f"launch {text} exited with status {done.returncode}; from {log}:\n{tail}")
    batch_size = load_config(base / out / "config.yaml").rollout.batch_size
    record = {"launch": kind, "gpus": n, "card": card,
              **summarize(read_jsonl(base / out / "metrics.jsonl"), batch_size),
              "command": " ".join(f"{k}={v}" for k, v in added.items()) + " " + shlex.join(command)}
    return {key: record[key] for key in KEYS}


def check(records: Any, paired: bool = True) -> None:
    """Raise ScalingError unless ``records`` has the form of the module docstring: a list of
    records with exactly its keys and types, one per (launch, gpus, card), and (``paired``) a
    single-GPU record of the same card beside every data-parallel one."""
    if not isinstance(records, list) or not records:
        raise ScalingError("a scaling file holds a non-empty JSON list of records")
    seen = set()
    for i, record in enumerate(records):
        where = f"record {i}"
        if not isinstance(record, dict) or set(record) != set(KEYS):
            got = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ScalingError(f"{where}: must have exactly the keys {list(KEYS)}, has {got}")
        launch, gpus, card = record["launch"], record["gpus"], record["card"]
        where = f"record {i} ({launch}, {gpus} GPUs)"
        if launch not in LAUNCHES:
            raise ScalingError(f"{where}: launch must be one of {LAUNCHES}")
        if type(gpus) is not int or gpus < 1 or (gpus == 1) != (launch == "single"):
            raise ScalingError(f"{where}: gpus must be 1 for single and an integer >= 2 for ddp and fsdp")
        if not isinstance(card, str) or not card.strip():
            raise ScalingError(f"{where}: card must be the nvidia-smi name of the GPUs")
        for key in ("seconds_per_step", "tokens_per_second"):
            if not _positive(record[key]):
                raise ScalingError(f"{where}: {key} must be a number > 0, got {record[key]!r}")
        peak = record["peak_memory_gib"]
        if not (_positive(peak) or (peak is None and card == "cpu")):
            raise ScalingError(f"{where}: peak_memory_gib must be a number > 0 (null only on card cpu), got {peak!r}")
        if not isinstance(record["command"], str) or not record["command"].strip():
            raise ScalingError(f"{where}: command must be the command that ran")
        if (launch, gpus, card) in seen:
            raise ScalingError(f"{where}: a second record of the same launch on {card}")
        seen.add((launch, gpus, card))
    singles = {card for launch, _, card in seen if launch == "single"}
    for launch, gpus, card in sorted(seen):
        if paired and card not in singles:
            raise ScalingError(f"{launch} on {gpus} GPUs ({card}) has no single-GPU record of the same card to compare with")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and value != float("inf")


def efficiencies(records: list[dict[str, Any]]) -> list[tuple[str, int, str, float]]:
    """(launch, gpus, card, efficiency) of each data-parallel record of a checked file:
    tokens_per_second / (gpus x tokens_per_second of the single record of the same card)."""
    single = {r["card"]: r["tokens_per_second"] for r in records if r["launch"] == "single"}
    return [(r["launch"], r["gpus"], r["card"], r["tokens_per_second"] / (r["gpus"] * single[r["card"]]))
            for r in records if r["launch"] != "single"]


def table(records: list[dict[str, Any]]) -> str:
    """The Markdown table of a checked file, one row per record (as ``merge`` orders them): what
    ``reports/multi_gpu.md`` shows, so that the page's figures are the file's."""
    single = {r["card"]: r["tokens_per_second"] for r in records if r["launch"] == "single"}
    rows = ["| launch | card | GPUs | seconds per step | real response tokens/s | speed-up | efficiency | peak GiB |",
            "|---|---|---|---|---|---|---|---|"]
    for r in records:
        speedup = r["tokens_per_second"] / single[r["card"]]
        peak = "-" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f}"
        rows.append(f"| {r['launch']} | {r['card']} | {r['gpus']} | {r['seconds_per_step']:.2f} | "
                    f"{r['tokens_per_second']:.0f} | {speedup:.2f} | {speedup / r['gpus']:.3f} | {peak} |")
    return "\n".join(rows)


def read(path: Path, paired: bool = True) -> list[dict[str, Any]]:
    """A scaling file, checked."""
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ScalingError(f"cannot read {path}: {err}") from None
    check(records, paired)
    return records


def rel(path: str | Path, base: Path = ROOT) -> str:
    """``path`` (relative to the caller's folder) as the launches, which run in the folder ``base``,
    see it: relative to ``base`` when inside it, absolute otherwise."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(base)) if resolved.is_relative_to(base) else str(resolved)


def merge(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``old`` with the records of ``new`` in place of those of the same launch, size and card, in
    launch order (single, ddp, fsdp) and size."""
    key = lambda r: (r["launch"], r["gpus"], r["card"])  # noqa: E731
    fresh = {key(r) for r in new}
    kept = [r for r in old if key(r) not in fresh] + new
    return sorted(kept, key=lambda r: (r["card"], LAUNCHES.index(r["launch"]), r["gpus"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", metavar="FILE", help="check a scaling file and print its efficiencies")
    parser.add_argument("--markdown", metavar="FILE", help="check a scaling file and print its Markdown table")
    parser.add_argument("--config", help="the trainer's config (e.g. configs/gsm8k_qwen_coder.yaml)")
    parser.add_argument("--impl", help="whose exercises: assignment or a file (default: the answer key)")
    parser.add_argument("--code", metavar="DIR", help="run the trainer of this tree (default: this checkout)")
    parser.add_argument("--launches", nargs="+", default=["single", "ddp:2"], help="single, ddp:N, fsdp:N")
    parser.add_argument("--steps", type=int, default=7, help="PPO steps per launch (the first is not measured)")
    parser.add_argument("--runs-dir", default="runs/scaling", help="scratch folder of the runs and their logs")
    parser.add_argument("--out", help="the scaling file to write (merged into when it exists)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every launch")
    args = parser.parse_args(argv)
    try:
        if args.markdown:
            print(table(merge([], read(Path(args.markdown)))))
            return 0
        if args.check:
            for launch, gpus, card, efficiency in efficiencies(read(Path(args.check))):
                print(f"{launch} on {gpus} x {card}: efficiency {efficiency:.3f}")
            return 0
        if not (args.config and args.out):
            raise ScalingError("--config and --out are needed to measure (or --check FILE)")
        if args.steps < MIN_MEASURED + 1:
            raise ScalingError(f"--steps must be at least {MIN_MEASURED + 1}: the first and {MIN_MEASURED} measured")
        launches = [parse_launch(text) for text in args.launches]  # every one checked before the first runs
        import torch

        cuda, card = torch.cuda.is_available(), card_name()
        base = Path(args.code).resolve() if args.code else ROOT
        impl = args.impl or base / "solutions" / "exercises.py"
        impl = impl if impl == "assignment" else rel(impl, base)
        out = Path(args.out)
        records, failed = [], []
        for text in args.launches:
            try:
                records.append(run_launch(text, rel(args.config, base), impl, args.steps, args.overrides,
                                          Path(rel(args.runs_dir, base)), card, cuda, base))
            except ScalingError as err:  # one that fails (out of memory, say) leaves the others' records
                print(f"[scaling] {err}", file=sys.stderr)
                failed.append(text)
            else:
                print(f"[scaling] {json.dumps(records[-1])}", flush=True)
        if records:  # a file may gather the launches of several calls: the pairs are checked at the end
            merged = merge(read(out, paired=False) if out.exists() else [], records)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(merged, indent=1) + "\n")
            print(f"wrote {out}: {len(records)} of {len(launches)} launches")
            try:
                check(merged)
            except ScalingError as err:
                print(f"no efficiencies yet: {err}")
            else:
                for launch, gpus, card_, efficiency in efficiencies(merged):
                    print(f"{launch} on {gpus} x {card_}: efficiency {efficiency:.3f}")
        return 1 if failed else 0
    except ScalingError as err:
        print(f"scaling: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

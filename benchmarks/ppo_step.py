"""Benchmark: where a PPO step's time goes, measured inside the trainer itself.

    python benchmarks/ppo_step.py --config configs/gsm8k_qwen_coder.yaml --label after --json after.json \
        [--steps 6] [--code DIR] [key=value ...]
    python benchmarks/ppo_step.py --report before.json after.json --out reports/performance/ppo_step.md

The first form runs ``assignment.trainer.loop.train`` on the config for ``--steps`` PPO steps (no
evaluation, samples or checkpoint) and times, CUDA-synchronised, inside every step:

    rollout phase    the trainer's ``time/rollout``: prompts, the sampler's refresh, then
      generation       ``rollout.generate`` (the decoding of every response)
      policy forward   ``rollout.response_forward`` with the policy: logprobs_old and values
      reference fwd    ``rollout.response_forward`` with the reference: the KL anchor
      rest             decoding to text, rewards, exercise 4, the guard
    update           the trainer's ``time/update`` (exercise 5 over the minibatches)
      optimizer step   ``optimizer.step`` inside exercise 5

and where the GPU memory goes: for each of those phases, what torch's allocator held when it
began and the most it held during it (``torch.cuda.max_memory_allocated`` after a reset at the
phase's start), and, after each step, what the long-lived tensors hold: the policy's weights
(their gradients are freed between steps), the optimizer's state, the reference and the sampler
copy (the static KV cache is generation's own: it is not held between steps). The phase whose
peak is the step's tells what a smaller card must cut.

Throughput counts real tokens only: the rollout phase's real response tokens (up to and including
EOS) per second, the measure the rollout's speed-up was asked in. For the update, every minibatch's
computed columns (rows x its trimmed length) against its real tokens (prompt and response) give
the padding share, and MFU = 6 x parameters x real tokens / seconds / ``--peak-tflops`` (forward
and backward; the forward that gradient checkpointing repeats is not useful work, so it is not
counted; the default peak is the dense TF32 rate of an H100 or H200 SXM, 494.7 TFLOPS, the
precision the float32 weights train in). Step 1 compiles the decoding step and is shown apart; the
summary is the median over the steps after it.

``--profile-update`` records the last step's update on the GPU (its kernels by kind, and the time
none ran); ``--host-profile FILE`` records the same update on the host instead (cProfile, the
functions with the most own time and the most cumulative time, into FILE): where an update whose
GPU idles spends its time. The two slow the update each in its own way, so one run takes one.
Every step also records ``update_alloc_retries`` (the allocator's cache flushes: a phase near its
memory cap) and ``dynamo_graphs`` (torch.compile's graphs so far: one that grows after the first
steps recompiles).

``--code DIR`` imports ``assignment`` (and the answer key) from DIR instead of this checkout: a
tree of another commit (``git archive COMMIT assignment solutions configs | tar -x -C DIR``), so
that the code before and after a change is measured on the same card in one call. The second
form writes the Markdown tables of one or more such JSON files, the first being the baseline.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import json
import math
import pstats
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PEAK_TFLOPS = 494.7  # dense TF32, H100 and H200 SXM (the datasheets' 989 assumes sparsity)


class Enough(Exception):
    """Raised after the last measured step, so that the run ends without its final checkpoint."""


GIB = 2 ** 30


# Kernel names by kind, attention first: PyTorch's memory-efficient SDPA kernels are CUTLASS's too
# (fmha_cutlassF_f32_*), and they do not run at the matmul rate (in float32 they compute the same
# with TF32 on or off). cuBLAS on Hopper names its kernels nvjet_* and sm90_xmma_*; CUTLASS and
# inductor's matmul templates (triton_tem_*) do matmuls too.
MATMUL = re.compile(r"gemm|cutlass|xmma|nvjet|cublas|triton_tem|splitk", re.IGNORECASE)
ATTENTION = re.compile(r"flash|fmha|attention|attn", re.IGNORECASE)


def kernel_split(events: list[tuple[str, float, float]]) -> dict[str, float]:
    """Seconds of GPU kernels by kind, from (name, start, end) in seconds: ``matmul_s``,
    ``attention_s``, ``other_s`` (elementwise, reductions, copies: memory traffic), and ``busy_s``,
    the time at least one kernel ran (the union of their intervals)."""
    split = {"matmul_s": 0.0, "attention_s": 0.0, "other_s": 0.0, "busy_s": 0.0, "kernels": float(len(events))}
    end = -math.inf
    for name, start, stop in sorted(events, key=lambda event: event[1]):
        kind = "attention_s" if ATTENTION.search(name) else "matmul_s" if MATMUL.search(name) else "other_s"
        split[kind] += stop - start
        split["busy_s"] += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return split


@contextmanager
def profiled(into: dict):
    """Inside the block, record every CUDA kernel (torch.profiler, CUDA activity only: no CPU
    events, so the host is slowed as little as may be) and put ``kernel_split`` of them into ``into``."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        into["skipped"] = "no CUDA: nothing to profile"
        yield
        return
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        yield
    events = [(e.name(), e.start_ns() / 1e9, (e.start_ns() + e.duration_ns()) / 1e9)
              for e in prof.profiler.kineto_results.events() if e.device_type() == torch.autograd.DeviceType.CUDA]
    into.update(kernel_split(events))


def host_profiled(path: Path):
    """Inside the block, cProfile the host; after it, write the 40 functions with the most own time
    and the 40 with the most cumulative time to ``path``."""
    profiler = cProfile.Profile()

    @contextmanager
    def block():
        profiler.enable()
        try:
            yield
        finally:
            profiler.disable()
            text = io.StringIO()
            for order in ("tottime", "cumulative"):
                pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(40)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text.getvalue())
    return block()


def instrument(record: dict, runs: list, profile_next: list[bool] | None = None, host_profile: Path | None = None) -> None:
    """Wrap the functions the trainer calls by module attribute so that ``record`` accumulates
    their synchronised seconds (and, for the update, the minibatches' columns and real tokens) and
    the memory of each phase (``{phase}_held_gib``, ``{phase}_peak_gib``), and ``runs`` receives
    the trainer's ``Run`` (its models and optimizer, for ``resident``). While ``profile_next[0]`` is
    true, the next update is profiled (its kernels by kind in ``record["update_split"]``, or with
    ``host_profile`` its host functions into that file), once."""
    rollout = importlib.import_module("assignment.trainer.rollout")
    ppo = importlib.import_module("assignment.trainer.ppo")
    loop = importlib.import_module("assignment.trainer.loop")
    generate, response_forward, minibatches = rollout.generate, rollout.response_forward, ppo.minibatches
    ppo_update, setup_run = ppo.ppo_update, loop.setup_run
    cuda = torch.cuda.is_available()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    @contextmanager
    def timed(key: str, phase: str | None = None):
        sync()
        if cuda and phase:
            record[f"{phase}_held_gib"] = max(record.get(f"{phase}_held_gib", 0.0), torch.cuda.memory_allocated() / GIB)
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        yield
        sync()
        record[key] += time.perf_counter() - started
        if cuda and phase:
            record[f"{phase}_peak_gib"] = max(record.get(f"{phase}_peak_gib", 0.0), torch.cuda.max_memory_allocated() / GIB)

    def timed_setup(*args, **kwargs):
        run = setup_run(*args, **kwargs)
        runs.append(run)
        step = run.optimizer.step

        def timed_step(*step_args, **step_kwargs):  # inside exercise 5: its own phase, not the update's
            peak = torch.cuda.max_memory_allocated() / GIB if cuda else 0.0
            with timed("optimizer_step_s", "optimizer_step"):
                out = step(*step_args, **step_kwargs)
            if cuda:  # the update's peak so far, which the reset above cleared
                record["update_peak_gib"] = max(record.get("update_peak_gib", 0.0), peak)
            return out

        run.optimizer.step = timed_step
        return run

    def timed_update(*args, **kwargs):
        if not (profile_next and profile_next[0]):
            with timed("update_timed_s", "update"):
                return ppo_update(*args, **kwargs)
        profile_next[0] = False
        split: dict = {}
        with timed("update_timed_s", "update"), (host_profiled(host_profile) if host_profile else profiled(split)):
            out = ppo_update(*args, **kwargs)
            sync()
        record["update_split"] = split or {"host_profile": str(host_profile)}
        return out

    def timed_generate(*args, **kwargs):
        with timed("generate_s", "generation"):
            return generate(*args, **kwargs)

    def timed_forward(forward, *args, **kwargs):
        is_policy = isinstance(forward, torch.nn.Module)  # the policy itself; the reference comes as a function
        if is_policy and "parameters" not in record:
            record["parameters"] = sum(p.numel() for p in forward.parameters())
        with timed("policy_forward_s" if is_policy else "reference_forward_s",
                   "policy_forward" if is_policy else "reference_forward"):
            return response_forward(forward, *args, **kwargs)

    def counted_minibatches(*args, **kwargs):
        for minibatch in minibatches(*args, **kwargs):
            record["update_columns"] += minibatch["input_ids"].numel()
            record["update_real_tokens"] += int(minibatch["attention_mask"].sum())
            yield minibatch

    rollout.generate, rollout.response_forward, ppo.minibatches = timed_generate, timed_forward, counted_minibatches
    loop.ppo_update, loop.setup_run = timed_update, timed_setup


def tensor_gib(tensors) -> float:
    """GiB held by these tensors (each storage counted once: tied weights are one)."""
    seen, total = set(), 0
    for t in tensors:
        if torch.is_tensor(t) and t.device.type == "cuda" and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    return total / GIB


def resident(run) -> dict:
    """What the long-lived tensors of the trainer's ``Run`` hold, GiB, after a step."""
    def state_tensors(state):
        for value in state.values():
            if torch.is_tensor(value):
                yield value
            elif isinstance(value, dict):
                yield from state_tensors(value)

    sampler, precision = getattr(run, "sampler", None), getattr(run, "precision", None)
    return {"weights_gib": tensor_gib(run.policy.parameters()),
            "working_copy_gib": tensor_gib(precision.working.parameters()) if precision is not None else 0.0,
            "optimizer_state_gib": tensor_gib(t for state in run.optimizer.state.values() for t in state_tensors(state)),
            "reference_gib": tensor_gib(run.ref.parameters()),
            "sampler_gib": tensor_gib(sampler.parameters()) if sampler is not None else 0.0,
            "allocated_after_step_gib": torch.cuda.memory_allocated() / GIB if torch.cuda.is_available() else 0.0}


def fresh_dir() -> str:
    """A new folder for the throwaway run (a fresh run refuses a folder that holds one)."""
    Path("runs").mkdir(exist_ok=True)
    return tempfile.mkdtemp(prefix="ppo_step_", dir="runs")


def measure(args: argparse.Namespace) -> dict:
    if args.code is not None:
        sys.path.insert(0, str(args.code.resolve()))
    else:
        sys.path.insert(0, str(ROOT))
    config = importlib.import_module("assignment.trainer.config")
    loop = importlib.import_module("assignment.trainer.loop")
    impl = importlib.import_module("assignment.trainer.impl").load_impl(str((args.code or ROOT) / "solutions" / "exercises.py"))
    overrides = [f"train.steps={args.steps + 1}", "eval.size=0", "train.sample_every=0", "train.checkpoint_every=0",
                 "train.time_limit_s=null", f"train.output_dir={args.output_dir or fresh_dir()}", *args.overrides]
    cfg = config.load_config(args.config, overrides)
    if args.no_tf32:  # plain float32 matmuls: the trainer's request for TF32 is refused for this run
        torch.set_float32_matmul_precision("highest")
        torch.set_float32_matmul_precision = lambda precision: None
    record: dict = defaultdict(float)
    runs: list = []
    profiling = args.profile_update or args.host_profile is not None
    profile_next = [profiling and args.steps == 1]  # set after step steps - 1: the last step's update
    instrument(record, runs, profile_next, args.host_profile)
    steps: list[dict] = []

    def on_step(step: int, metrics: dict) -> None:
        response_tokens = cfg.rollout.batch_size * metrics["rollout/response_length"]
        # the step's peak from its phases' (the phases reset the allocator's peak themselves)
        phase_peaks = [v for k, v in record.items() if k.endswith("_peak_gib")]
        row = {"step": step, "rollout_s": metrics["time/rollout"], "update_s": metrics["time/update"],
               "response_tokens": response_tokens, "approx_kl_first": metrics.get("stats/approx_kl_first"),
               "peak_memory_gib": max(phase_peaks) if phase_peaks else metrics.get("memory/peak_memory_gib"),
               "update_alloc_retries": metrics.get("memory/update_alloc_retries"),
               "rollout_alloc_retries": metrics.get("memory/rollout_alloc_retries"),
               "dynamo_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
               **(resident(runs[-1]) if runs else {}), **record}
        row["rest_s"] = row["rollout_s"] - sum(row.get(k, 0.0) for k in ("generate_s", "policy_forward_s", "reference_forward_s"))
        steps.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        params = record.get("parameters")
        record.clear()
        if params is not None:
            record["parameters"] = params
        if step >= args.steps:
            raise Enough
        profile_next[0] = profiling and step == args.steps - 1

    import transformers

    started = time.time()
    try:
        loop.train(cfg, impl, on_step=on_step)
    except Enough:
        pass
    card = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (the figures mean little there)"
    return {"label": args.label, "card": card, "torch": torch.__version__,
            "transformers": transformers.__version__, "code": str(args.code or "this checkout"),
            "command": "python benchmarks/ppo_step.py " + " ".join(sys.argv[1:]),
            "batch_size": cfg.rollout.batch_size, "max_new_tokens": cfg.rollout.max_new_tokens,
            "peak_tflops": args.peak_tflops, "wall_s": time.time() - started, "steps": steps}


def median(rows: list[dict], key: str) -> float:
    return statistics.median(row.get(key, 0.0) for row in rows)


def summary(run: dict) -> dict:
    """Medians over the steps after the first (which compiles); the update's over those whose update
    was not profiled (the profiler slows the host; it wraps the update alone)."""
    rows = run["steps"][1:] or run["steps"]
    out = {key: median(rows, key) for key in ("rollout_s", "generate_s", "policy_forward_s", "reference_forward_s",
                                               "rest_s", "response_tokens")}
    updates = [row for row in rows if "update_split" not in row] or rows
    out |= {key: median(updates, key) for key in ("update_s", "update_real_tokens", "update_columns")}
    out["tokens_per_s"] = median([{"x": r["response_tokens"] / r["rollout_s"]} for r in rows], "x")
    out["padding"] = 1 - out["update_real_tokens"] / out["update_columns"] if out["update_columns"] else float("nan")
    params = next((r["parameters"] for r in rows if "parameters" in r), float("nan"))
    out["mfu"] = 6 * params * out["update_real_tokens"] / out["update_s"] / (run["peak_tflops"] * 1e12)
    out["params"] = params
    out["measured_steps"] = len(rows)
    kl = [abs(r["approx_kl_first"]) for r in run["steps"] if r.get("approx_kl_first") is not None]
    out["max_abs_approx_kl_first"] = max(kl) if kl else float("nan")
    out["first_step"] = run["steps"][0]
    return out


PHASES = {"generation": "generation", "policy_forward": "policy forward", "reference_forward": "reference forward",
          "update": "update (exercise 5)", "optimizer_step": "optimizer step"}
RESIDENT = ("weights_gib", "working_copy_gib", "optimizer_state_gib", "reference_gib", "sampler_gib",
            "allocated_after_step_gib")


def _most(run: dict, key: str) -> float:
    """The largest value of ``key`` over the run's steps (0 where absent: a CPU run)."""
    return max((row.get(key) or 0.0) for row in run["steps"])


def _flushes(run: dict) -> str:
    """The update's allocator cache flushes (``update_alloc_retries``), median over the measured
    steps; "-" for a measurement made before they were recorded."""
    rows = [row for row in run["steps"][1:] or run["steps"] if row.get("update_alloc_retries") is not None]
    return f"{median(rows, 'update_alloc_retries'):.0f}" if rows else "-"


def report(runs: list[dict]) -> str:
    sums = [summary(run) for run in runs]
    base = sums[0]
    lines = ["# PPO step: where the time goes", "",
             "Written by `python benchmarks/ppo_step.py --report ...` from the JSON of each run below.", ""]
    for run, s in zip(runs, sums):
        lines.append(f"- **{run['label']}**: {run['card']}, torch {run['torch']}, transformers {run['transformers']}; "
                     f"code: {run['code']}; `{run['command']}`; {run['batch_size']} responses of at most "
                     f"{run['max_new_tokens']} tokens per step; medians of steps 2-{s['measured_steps'] + 1}.")
    lines += ["", "## Rollout phase (seconds per step, median)", "",
              "| run | rollout phase | generation | policy forward | reference forward | rest | real response tokens | tokens/s | vs first |",
              "|---|---|---|---|---|---|---|---|---|"]
    for run, s in zip(runs, sums):
        lines.append(f"| {run['label']} | {s['rollout_s']:.2f} | {s['generate_s']:.2f} | {s['policy_forward_s']:.2f} | "
                     f"{s['reference_forward_s']:.2f} | {s['rest_s']:.2f} | {s['response_tokens']:.0f} | "
                     f"{s['tokens_per_s']:.0f} | {s['tokens_per_s'] / base['tokens_per_s']:.2f}x |")
    lines += ["", "## Update (seconds per step, median)", "",
              "| run | update | real tokens | computed columns | padding | real-token MFU | parameters | cache flushes |",
              "|---|---|---|---|---|---|---|---|"]
    for run, s in zip(runs, sums):
        lines.append(f"| {run['label']} | {s['update_s']:.2f} | {s['update_real_tokens']:.0f} | {s['update_columns']:.0f} | "
                     f"{s['padding']:.1%} | {s['mfu']:.1%} of {run['peak_tflops']:g} TFLOPS | {s['params'] / 1e6:.0f}M | "
                     f"{_flushes(run)} |")
    split = [(run, next((row["update_split"] for row in run["steps"] if row.get("update_split", {}).get("busy_s")), None))
             for run in runs]
    if any(kinds for _, kinds in split):
        lines += ["", "## One update's GPU kernels (`--profile-update`: the last step's update, seconds)", "",
                  "Kernel time is the profiler's; the update is the median of the unprofiled steps; idle is the update "
                  "less the time some kernel ran (host work: Python, launches, the allocator).", "",
                  "| run | update | matmul kernels | attention kernels | other kernels | some kernel running | idle | kernels |",
                  "|---|---|---|---|---|---|---|---|"]
        for (run, kinds), s in zip(split, sums):
            if kinds:
                lines.append(f"| {run['label']} | {s['update_s']:.2f} | {kinds['matmul_s']:.2f} | {kinds['attention_s']:.2f} | "
                             f"{kinds['other_s']:.2f} | {kinds['busy_s']:.2f} | {max(s['update_s'] - kinds['busy_s'], 0):.2f} | "
                             f"{kinds['kernels']:.0f} |")
    lines += ["", "## Where the GPU memory goes (GiB, the most over the measured steps)", "",
              "What torch's allocator held when each phase began, and the most it held during it:", "",
              "| run | " + " | ".join(f"{name} (held / peak)" for name in PHASES.values()) + " | step peak |",
              "|---|" + "---|" * (len(PHASES) + 1)]
    for run, s in zip(runs, sums):
        cells = [f"{_most(run, f'{p}_held_gib'):.1f} / {_most(run, f'{p}_peak_gib'):.1f}" for p in PHASES]
        lines.append(f"| {run['label']} | " + " | ".join(cells) + f" | {_most(run, 'peak_memory_gib'):.1f} |")
    lines += ["", "Held between phases by the long-lived tensors (after a step; gradients are freed by then):", "",
              "| run | policy weights | 16-bit working copy | optimizer state | reference | sampler copy | all allocated |",
              "|---|---|---|---|---|---|---|"]
    for run, s in zip(runs, sums):
        lines.append(f"| {run['label']} | " + " | ".join(f"{_most(run, key):.2f}" for key in RESIDENT) + " |")
    lines += ["", "## The first minibatch's ratio and the first step", "",
              "| run | max abs stats/approx_kl_first, all steps | step 1: rollout phase (compiles) | step 1: update | peak GPU memory |",
              "|---|---|---|---|---|"]
    for run, s in zip(runs, sums):
        first = s["first_step"]
        peak = max((r.get("peak_memory_gib") or 0.0) for r in run["steps"])
        lines.append(f"| {run['label']} | {s['max_abs_approx_kl_first']:.1e} | {first['rollout_s']:.1f} | "
                     f"{first['update_s']:.1f} | {peak:.1f} GiB |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path)
    parser.add_argument("--steps", type=int, default=6, help="PPO steps to run (the first compiles)")
    parser.add_argument("--code", type=Path, help="import assignment and the answer key from this tree")
    parser.add_argument("--label", default="current")
    parser.add_argument("--json", type=Path, help="write the measurement here")
    parser.add_argument("--output-dir", help="the run's folder (train.output_dir; default a new runs/ppo_step_*)")
    parser.add_argument("--peak-tflops", type=float, default=DEFAULT_PEAK_TFLOPS)
    parser.add_argument("--no-tf32", action="store_true", help="float32 matmuls at full precision (no TF32)")
    parser.add_argument("--profile-update", action="store_true",
                        help="profile the last step's update: its GPU kernels by kind (update_split)")
    parser.add_argument("--host-profile", type=Path,
                        help="cProfile the last step's update on the host, into this file (not with --profile-update)")
    parser.add_argument("--report", type=Path, nargs="+", help="write the tables of these JSON files instead")
    parser.add_argument("--out", type=Path, help="with --report: the Markdown file")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args(argv)
    if args.report:
        text = report([json.loads(path.read_text()) for path in args.report])
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        print(text)
        return 0
    if args.config is None or args.json is None:
        parser.error("--config and --json are required to measure")
    if args.profile_update and args.host_profile:
        parser.error("--profile-update and --host-profile each slow the update their own way: one at a time")
    result = measure(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(report([result]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

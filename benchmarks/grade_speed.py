"""Benchmark: wall time of grading one submission in full, as a TA runs it (a cold process).

    python benchmarks/grade_speed.py [SUBMISSION.py] [--repeat 3] [--per-exercise] [--out reports/performance/grading.md]

Each run is `python -m autograder SUBMISSION --results ...` in a fresh process, with grading.yaml
as shipped, so Python start-up and every import are counted, and with a hidden seed set
(PPO_GRADER_HIDDEN_SEED), as deployed. The grader records the examples of every check a
submission passes and replays them in later gradings (autograder/replay.py), so the first
grading on a machine differs from the others: the benchmark gives the grader a folder of
recordings of its own, empty at the start, times one grading in it first (the first grading on a
machine, which records), then --repeat more under the same hidden seed (which replay every
check: a TA's machine, or Gradescope when the seed was set as its image was built), then
--repeat more each under a new hidden seed (the hidden checks drawn, the visible ones replayed:
Gradescope when the seed is set after the image is built), and reports each series' median. The
target is a median of <= 10 s for the reference solution on a 2-core CPU machine, with the 200
examples per exercise of grading.yaml. --per-exercise adds one `--exercise N` grading per
exercise (replaying every check). --out writes the same figures as Markdown: the machine (cores,
load average at the start and the end), the command and every run.

Run it on an otherwise idle machine: the grader and its worker take one core each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = range(1, 9)


HIDDEN_SEED = 424242  # any: a deployment's secret


def grade(submission: Path, results: Path, recordings: Path, *extra: str, hidden_seed: int = HIDDEN_SEED) -> dict:
    """One grading in a fresh process: its wall time and what results.json says."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "autograder", str(submission), "--results", str(results), "--quiet",
                           *extra], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PPO_GRADER_CACHE=str(recordings), PPO_GRADER_HIDDEN_SEED=str(hidden_seed)))
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"grading failed:\n{proc.stderr}")
    data = json.loads(results.read_text())
    return {"wall": wall, "execution_time": data["execution_time"], "score": data["score"],
            "sandbox": data["extra_data"]["sandbox"]}


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU") \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    return f"{os.cpu_count()} cores ({model}), {platform.system()} {platform.release()}, Python {platform.python_version()}"


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submission", type=Path, nargs="?", default=ROOT / "solutions" / "exercises.py")
    parser.add_argument("--repeat", type=int, default=3, help="gradings after the first (default 3)")
    parser.add_argument("--per-exercise", action="store_true", help="also one `--exercise N` grading per exercise")
    parser.add_argument("--out", type=Path, help="write the figures as Markdown to this file")
    args = parser.parse_args()
    lines = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    command = "python " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0])), *sys.argv[1:]])
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    say(f"machine: {machine()}")
    say(f"load average (1, 5, 15 min) at the start: {load()}")
    say(f"command: `{command}` (commit {commit.stdout.strip() or 'unknown'})")
    say()
    say("| run | hidden checks | recordings at the start | wall (s) | grader execution_time (s) | score | sandbox |")
    say("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        recordings, results = Path(tmp) / "recordings", Path(tmp) / "results.json"
        series: dict[str, list[dict]] = {"first": [], "replayed": [], "drawn": []}
        plan = [("first", HIDDEN_SEED)] + [("replayed", HIDDEN_SEED)] * args.repeat + \
            [("drawn", HIDDEN_SEED + 1 + i) for i in range(args.repeat)]
        for i, (kind, seed) in enumerate(plan):
            before = len(list(recordings.glob("*.safetensors")))
            run = grade(args.submission, results, recordings, hidden_seed=seed)
            series[kind].append(run)
            hidden = {"first": "drawn, recorded", "replayed": "replayed", "drawn": "a new seed: drawn"}[kind]
            say(f"| {'first' if i == 0 else i} | {hidden} | {before} | {run['wall']:.2f} | {run['execution_time']:.2f} | "
                f"{run['score']:g} | {run['sandbox']} |")
        say()
        say(f"first grading on this machine (no recordings): {series['first'][0]['wall']:.2f} s")
        for kind, what in (("replayed", "every check replayed"), ("drawn", "the hidden checks drawn under a new seed")):
            if series[kind]:
                walls = [r["wall"] for r in series[kind]]
                say(f"median wall time, {what}: **{statistics.median(walls):.2f} s** over {len(walls)} runs")
        if args.per_exercise:
            say()
            say("| exercise alone (`--exercise N`, after one untimed grading that records its examples) | wall (s) | "
                "grader execution_time (s) |")
            say("|---|---|---|")
            for n in EXERCISES:
                grade(args.submission, results, recordings, "--exercise", str(n))
                run = grade(args.submission, results, recordings, "--exercise", str(n))
                say(f"| {n} | {run['wall']:.2f} | {run['execution_time']:.2f} |")
    say()
    say(f"load average (1, 5, 15 min) at the end: {load()}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("# Grading speed\n\nWritten by `benchmarks/grade_speed.py` (its docstring says what it "
                            "measures).\n\n" + "\n".join(line if line.startswith("|") or not line else line + "  "
                                                          for line in lines) + "\n")


if __name__ == "__main__":
    main()

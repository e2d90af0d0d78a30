"""Benchmark: wall time of grading a class (`ppo-grade FOLDER --out DIR`) against one grading.

    python benchmarks/grade_class.py [--students 20] [--jobs 1 2] [--class-size 200]

Makes a folder of N copies of the reference solution and grades it with grading.yaml as shipped,
once per --jobs value, each a cold `python -m autograder FOLDER --out OUT --jobs J` in a fresh
out folder, so start-up, every import and each process's first sandbox are counted. In the same
run it times one single grading, `python -m autograder FILE` (as benchmarks/grade_speed.py does).
Prints, per jobs value, the wall time in total and per student, the ratio of the per-student
time to the single grading's, and an estimate for a class of --class-size students:

    wall(M) ~ wall(N) + (M - N) * median(execution_time) / J

that is, the measured run plus the remaining students at the steady rate of J processes, each
taking the median grading time it took here (measured under the same contention). It assumes a
class like this one: wrong submissions that shrink counterexamples or hit time limits take longer.
Run it on an otherwise idle machine; it prints the load average before it starts.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "exercises.py"


def cli(*args) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"ppo-grade {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc


def single(tmp: Path) -> tuple[float, float]:
    wall, _ = cli(SOLUTION, "--results", tmp / "single.json", "--quiet")
    return wall, json.loads((tmp / "single.json").read_text())["execution_time"]


def grade_class(tmp: Path, folder: Path, jobs: int) -> tuple[float, list[float]]:
    out = tmp / f"out-{jobs}"
    shutil.rmtree(out, ignore_errors=True)
    wall, _ = cli(folder, "--out", out, "--jobs", jobs)
    with open(out / "gradebook.csv", newline="", encoding="utf-8-sig") as f:  # it starts with a BOM
        rows = list(csv.DictReader(f))
    wrong = [r["student"] for r in rows if r["total"] != "100" or r["status"] != "graded"]
    if wrong:
        sys.exit(f"the reference solution lost points in the batch: {wrong}")
    times = [json.loads(p.read_text())["execution_time"] for p in sorted((out / "results").glob("*.json"))]
    return wall, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=20)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--class-size", type=int, default=200, help="the class to extrapolate to")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{args.students} copies of the reference solution, grading.yaml as shipped")
    with tempfile.TemporaryDirectory(prefix="grade-class-") as name:
        tmp = Path(name)
        folder = tmp / "submissions"
        folder.mkdir()
        for i in range(args.students):
            shutil.copyfile(SOLUTION, folder / f"student{i:03d}.py")
        one_wall, one_exec = single(tmp)
        print(f"single grading (ppo-grade FILE, cold process): wall {one_wall:.1f} s, "
              f"grader execution_time {one_exec:.1f} s")
        print(f"{'jobs':>4} {'wall total':>11} {'per student':>12} {'vs single':>10} "
              f"{'median grading':>15} {f'est. {args.class_size} students':>20}")
        for jobs in args.jobs:
            wall, times = grade_class(tmp, folder, jobs)
            per = wall / args.students
            median = statistics.median(times)
            estimate = wall + (args.class_size - args.students) * median / jobs
            print(f"{jobs:>4} {wall:>9.1f} s {per:>10.2f} s {per / one_wall:>9.2f}x {median:>13.2f} s "
                  f"{estimate / 60:>15.1f} min")


if __name__ == "__main__":
    main()

"""Benchmark: wall time of grading one submission in full, as a TA runs it (a cold process).

    python benchmarks/grade_speed.py [SUBMISSION.py] [--repeat 3]

Each run is `python -m autograder SUBMISSION --results ...` in a fresh process, with
grading.yaml as shipped, so Python start-up and every import are counted. Prints each run's
wall time and the grader's own execution_time, then the median. The target is
<= 20 s for the reference solution on a 2-core CPU machine, with >= 200 examples per exercise.
Run it on an otherwise idle machine: the grader and its worker take one core each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submission", type=Path, nargs="?", default=ROOT / "solutions" / "exercises.py")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.json"
        for i in range(args.repeat):
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "autograder", str(args.submission), "--results",
                                   str(results), "--quiet"], cwd=ROOT, capture_output=True, text=True)
            walls.append(time.monotonic() - started)
            if proc.returncode != 0:
                sys.exit(f"grading failed:\n{proc.stderr}")
            data = json.loads(results.read_text())
            print(f"run {i + 1}: wall {walls[-1]:.2f} s, grader execution_time {data['execution_time']:.2f} s, "
                  f"score {data['score']:g}, sandbox {data['extra_data']['sandbox']}")
    print(f"median wall time: {statistics.median(walls):.2f} s over {len(walls)} runs")


if __name__ == "__main__":
    main()

"""Benchmark: the test command as a newcomer pays it, on a fresh clone with an empty pip cache.

    python benchmarks/fresh_clone.py [--ref HEAD] [--no-fast] [--out reports/performance/test_suite.md]

Clones commit REF of this repository into a temporary folder and times there what `.ci/run`
does: the virtualenv and `pip install -c autograder/gradescope/constraints.txt -e '.[dev]'` with
PIP_NO_CACHE_DIR=1 (nothing comes from pip's cache), then the whole suite (`pytest`); then the
fast tier (`pytest -m "not slow"`). Each step with its wall time and CPU time (user + sys of
every process it started) and the last line pytest printed. The project's targets: install and
whole suite within 15 min, fast tier under 3 min.

Run it on an otherwise idle machine: the suite uses every core (pytest-xdist).
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grade_speed import load, machine

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], cwd: Path, env: dict) -> dict:
    """Run ``cmd``; its wall and CPU seconds, exit status, last line of output, and the tests
    pytest's short summary names as failed or in error (a flaky one is then named in the report)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return {"wall": wall, "cpu": cpu, "rc": proc.returncode, "last": lines[-1].strip("= ") if lines else "",
            "failed": [line for line in lines if line.startswith(("FAILED ", "ERROR "))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="HEAD", help="the commit to clone (default HEAD)")
    parser.add_argument("--no-fast", action="store_true", help="skip the fast tier")
    parser.add_argument("--out", type=Path, help="write the figures as Markdown to this file")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", args.ref], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    command = "python " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0])), *sys.argv[1:]])
    lines = [f"machine: {machine()}", f"load average (1, 5, 15 min) at the start: {load()}",
             f"command: `{command}` (commit {commit}, cloned fresh)", "",
             "| step | command | wall | CPU (user + sys) | result |", "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fresh-clone-") as tmp:
        clone = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", "--no-local", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTEST_", "PPO_", "VIRTUAL_ENV"))}
        env["PIP_NO_CACHE_DIR"] = "1"
        python = str(clone / ".venv" / "bin" / "python")
        steps = [("install", ["bash", "-c", "python3 -m venv .venv && .venv/bin/pip install -q -c "
                                             "autograder/gradescope/constraints.txt -e '.[dev]'"]),
                 ("whole suite", [python, "-m", "pytest", "-q"])]
        if not args.no_fast:
            steps.append(("fast tier", [python, "-m", "pytest", "-q", "-m", "not slow"]))
        for name, cmd in steps:
            run = timed(cmd, clone, env)
            rows.append((name, run))
            shown = cmd[2] if cmd[0] == "bash" else shlex.join(["python", *cmd[1:]])
            result = f"exit {run['rc']}" + (f": {run['last']}" if cmd[0] == python else "")
            line = f"| {name} | `{shown}` | {run['wall']:.0f} s | {run['cpu']:.0f} s | {result} |"
            lines.append(line)
            print(line, flush=True)
            if run["rc"] != 0:
                break
    walls = dict((name, run["wall"]) for name, run in rows)
    table_end = len(lines)
    failed = [f"- {name}: `{line[:300]}`" for name, run in rows for line in run["failed"]]
    lines += ["", "Failed:", *failed] if failed else []
    lines += ["", f"install + whole suite (what `.ci/run` does): **{(walls.get('install', 0) + walls.get('whole suite', 0)) / 60:.1f} min** (target 15)"]
    if "fast tier" in walls:
        lines.append(f"fast tier: **{walls['fast tier']:.0f} s** (target under 180 s)")
    lines += ["", f"load average (1, 5, 15 min) at the end: {load()}"]
    print("\n".join(lines[table_end:]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("# The test suite on a fresh clone\n\nWritten by `benchmarks/fresh_clone.py` (its docstring "
                            "says what it measures).\n\n" + "\n".join(line if line.startswith("|") or not line
                                                                      else line + "  " for line in lines) + "\n")
    sys.exit(0 if all(run["rc"] == 0 for _, run in rows) else 1)


if __name__ == "__main__":
    main()

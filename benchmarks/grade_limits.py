"""One full grading of the answer key held to a Gradescope container's default resources.

Gradescope's default autograder container has half a CPU and 768 MB of memory, and a grading
may take 10 minutes. This runs ``ppo-grade solutions/exercises.py`` (the grader as run_autograder
calls it, Part II included) in a cgroup held to the same CPU quota and memory limit, twice: first
with an empty example cache (what setup.sh does once, when it builds the image), then replaying
what the first recorded (every grading on Gradescope after that). Per grading it prints the wall
time, the exit status, the score, the sandbox strategy, the peak of the cgroup's anonymous memory
(its processes' own pages, polled every 20 ms: what the limit cannot reclaim) and whether the
kernel had to kill anything for memory.

Linux, as root, cgroup v1 (the cpu and memory hierarchies under /sys/fs/cgroup; this project's
machine has them); not written for cgroup v2.

    sudo python benchmarks/grade_limits.py [--cpus 0.5] [--memory-mb 768]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CGROUP = Path("/sys/fs/cgroup")


def own_memory_cgroup() -> Path:
    """This process's memory cgroup (a container's own, where that is where it may create one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP / "memory" / path.lstrip("/")
    raise SystemExit("no cgroup v1 memory hierarchy: this benchmark is written for cgroup v1")


def stat(group: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (group / "memory.stat").read_text().splitlines())}


def grade(cpus: float, memory_mb: int, cache: Path, name: str) -> dict:
    cpu, memory = CGROUP / "cpu" / name, own_memory_cgroup() / name
    for group in (cpu, memory):
        group.mkdir()
    try:
        period = 100_000
        (cpu / "cpu.cfs_period_us").write_text(str(period))
        (cpu / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))
        (memory / "memory.limit_in_bytes").write_text(str(memory_mb * 2**20))
        results = cache / f"{name}.json"
        env = dict(os.environ, PPO_GRADER_CACHE=str(cache / "examples"))
        env.setdefault("PPO_GRADER_HIDDEN_SEED", "20240601")  # as a deployment sets it: hidden checks recorded too
        # The shell joins both groups, then becomes the grader: every process it starts is counted.
        command = (f"echo $$ > {cpu}/cgroup.procs && echo $$ > {memory}/cgroup.procs && exec {sys.executable} "
                   f"-m autograder solutions/exercises.py --results {results} --quiet")
        peak, done = 0, threading.Event()

        def poll() -> None:
            nonlocal peak
            while not done.is_set():
                s = stat(memory)
                peak = max(peak, s["total_rss"] + s.get("total_shmem", 0))
                time.sleep(0.02)

        watcher = threading.Thread(target=poll)
        watcher.start()
        start = time.monotonic()
        proc = subprocess.run(["sh", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        done.set()
        watcher.join()
        oom = dict(line.split() for line in (memory / "memory.oom_control").read_text().splitlines())
        graded = json.loads(results.read_text()) if results.exists() else {"extra_data": {}}
        return {"grading": name, "exit": proc.returncode, "score": graded.get("score"),
                "sandbox": graded["extra_data"].get("sandbox"), "wall_s": round(wall, 1),
                "peak_anonymous_mb": round(peak / 1e6), "oom_kills": int(oom.get("oom_kill", 0)),
                "stderr_tail": proc.stderr[-300:] if proc.returncode else ""}
    finally:
        for group in (cpu, memory):
            group.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=float, default=0.5)
    parser.add_argument("--memory-mb", type=int, default=768)
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"python benchmarks/grade_limits.py {' '.join(sys.argv[1:])}(commit {commit}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d')})")
    print(f"limits: {args.cpus} CPU, {args.memory_mb} MB; load average at the start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("ppo_grade_limits_recording", "ppo_grade_limits_replaying"):
            print(json.dumps(grade(args.cpus, args.memory_mb, Path(tmp), name)))
    print(f"load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

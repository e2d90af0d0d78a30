"""Check that a change of the grader changes no verdict: grade many submissions, then diff.

    python benchmarks/grade_equivalence.py grade OUT [--jobs 2] [--attacks] [--trace] [--cold]
    python benchmarks/grade_equivalence.py diff BEFORE AFTER

``grade`` grades, each in a fresh `python -m autograder FILE --results ...` process with
grading.yaml as shipped (what a TA runs): the reference solution, the blank assignment, every
file of tests/submissions/, and tests/corpus.py's mutants, alternatives and wrong-everywhere
file (``--attacks`` adds the hostile ones: slow, they hit time limits). Per submission it keeps
results.json without its one timing field (execution_time) and the terminal report (the TA's
view, hidden checks included). ``--trace`` also records a digest of every example each check
evaluated, in order, shrinking included (NAME.examples), so that "the same examples" is checked
directly, not only through the verdicts. The gradings share one folder of recorded examples
(autograder/replay.py), fresh at the start: the first passing grading of a check records it,
later ones replay it; ``--cold`` gives each grading a fresh folder of its own (nothing replays).

``diff`` compares two such folders file by file and prints every difference; exit status 1
if any. The examples are compared exercise by exercise, each in its order (the grader may take
the exercises in another order: each has workers of its own). Run ``grade`` on the commit
before a change and on the one after, then ``diff``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMING_FIELDS = ("execution_time",)

# Run in the grading process by --trace: wraps the grader's one function that evaluates a case and
# records a digest of the case (its own digest, not replay.digest: it must trace graders from before
# replay.py too). It is passed with -c, so it adds no module with a __file__ (Hypothesis
# draws some examples from the literals of local modules: a module of ours would change them).
TRACE = r"""
import hashlib, os, runpy, sys, torch
import autograder.grade as g
out = open(os.environ["GRADE_TRACE"], "w")
def digest(x, h):
    if torch.is_tensor(x):
        h.update(f"{x.dtype}{tuple(x.shape)}".encode()); h.update(x.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(x, dict):
        for k in x: h.update(repr(k).encode()); digest(x[k], h)
    elif isinstance(x, (list, tuple)):
        h.update(b"["); [digest(v, h) for v in x]; h.update(b"]")
    else:
        h.update(repr(x).encode())
evaluate = g._evaluate
def traced(number, case, *rest):
    h = hashlib.sha256()
    digest({k: v for k, v in vars(case).items() if k != "initial"}, h)
    out.write(f"{number} {h.hexdigest()[:16]}\n"); out.flush()
    return evaluate(number, case, *rest)
g._evaluate = traced
sys.argv = ["autograder", *sys.argv[1:]]
runpy.run_module("autograder", run_name="__main__", alter_sys=True)
"""


def submissions(attacks: bool) -> dict[str, str]:
    """name -> source of every submission to grade."""
    sys.path.insert(0, str(ROOT / "tests"))
    import corpus

    found = {"solution": (ROOT / "solutions" / "exercises.py").read_text(),
             "blank": (ROOT / "assignment" / "exercises.py").read_text()}
    for path in sorted((ROOT / "tests" / "submissions").glob("*.py")):
        if path.name != "check_alternatives.py":  # a checking script, not a submission
            found[f"file_{path.stem}"] = path.read_text()
    variants = corpus.MUTANTS + corpus.ALTERNATIVES + [corpus.WRONG_EVERYWHERE] + (corpus.ATTACKS if attacks else [])
    found.update({v.name: corpus.render(v) for v in variants})
    return found


def grade_one(name: str, source: str, out: Path, trace: bool, recordings: Path | None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "exercises.py"
        path.write_text(source)
        results = out / f"{name}.results.json"
        args = [str(path), "--results", str(results)]
        env = dict(os.environ, PPO_GRADER_CACHE=str(recordings or Path(tmp) / "recordings"))
        if trace:
            env["GRADE_TRACE"] = str(out / f"{name}.examples")
            cmd = [sys.executable, "-c", TRACE, *args]
        else:
            cmd = [sys.executable, "-m", "autograder", *args]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    (out / f"{name}.report.txt").write_text(proc.stdout.replace(str(path), "SUBMISSION"))
    data = json.loads(results.read_text())
    for key in TIMING_FIELDS:
        data.pop(key, None)
    results.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return f"{name}: exit {proc.returncode}, score {data.get('score')}"


def grade(out: Path, jobs: int, attacks: bool, trace: bool, only: list[str] | None, cold: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    todo = {k: v for k, v in submissions(attacks).items() if not only or k in only}
    with tempfile.TemporaryDirectory() as shared, ThreadPoolExecutor(jobs) as pool:
        recordings = None if cold else Path(shared) / "recordings"
        for line in pool.map(lambda item: grade_one(*item, out, trace, recordings), todo.items()):
            print(line, flush=True)
    print(f"{len(todo)} submissions graded into {out}")


def _text(path: Path) -> str:
    """The file's text; for NAME.examples, its lines grouped by exercise, each group in its order."""
    text = path.read_text()
    if path.suffix != ".examples":
        return text
    lines = text.splitlines(True)
    return "".join(sorted(lines, key=lambda line: int(line.split()[0])))  # a stable sort keeps each exercise's order


def diff(before: Path, after: Path) -> int:
    names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
    differ = 0
    for name in names:
        a, b = before / name, after / name
        if not a.exists() or not b.exists():
            print(f"{name}: only in {before if a.exists() else after}")
            differ += 1
            continue
        if _text(a) != _text(b):
            differ += 1
            print(f"{name} differs:")
            sys.stdout.writelines(difflib.unified_diff(_text(a).splitlines(True), _text(b).splitlines(True),
                                                       str(a), str(b), n=1))
    graded = len({n.split(".")[0] for n in names})
    print(f"{graded} submissions, {len(names)} files compared: {differ} differ")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade")
    g.add_argument("out", type=Path)
    g.add_argument("--jobs", type=int, default=2)
    g.add_argument("--attacks", action="store_true")
    g.add_argument("--trace", action="store_true")
    g.add_argument("--only", nargs="+", metavar="NAME", help="grade only these submissions")
    g.add_argument("--cold", action="store_true", help="each grading with a fresh folder of recordings")
    d = sub.add_parser("diff")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "grade":
        grade(args.out, args.jobs, args.attacks, args.trace, args.only, args.cold)
    else:
        sys.exit(diff(args.before, args.after))


if __name__ == "__main__":
    main()

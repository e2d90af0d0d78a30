"""Turn a GradingResult into what people read: a terminal report and Gradescope's results.json.

results.json follows Gradescope's autograder specification (score, execution_time, output,
tests[], extra_data) and is written last and atomically: whatever the submission wrote at that
path is replaced.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from assignment import EXERCISES

from .grade import CheckResult, GradingResult


def test_name(c: CheckResult) -> str:
    if c.exercise == 0:
        return f"Training check: {c.check}"
    return f"Exercise {c.exercise} ({EXERCISES[c.exercise - 1]}): {c.check}"


def to_gradescope(result: GradingResult) -> dict:
    tests = [{
        "name": test_name(c),
        "score": c.score,
        "max_score": c.max_score,
        "status": "passed" if c.passed else "failed",
        "output": c.description + ("\n\n" + c.feedback if c.feedback else ""),
        "visibility": c.visibility,
        "extra_data": {"exercise": c.exercise, "check": c.check},
    } for c in result.checks]
    return {
        "score": result.score,
        "execution_time": result.execution_time,
        "output": summary(result),
        "tests": tests,
        "extra_data": result.extra,
    }


def failure_results(message: str, extra: dict) -> dict:
    """results.json for a grader that could not finish: 0 points and what went wrong."""
    return {"score": 0.0, "execution_time": 0.0, "output": f"The autograder failed: {message}. "
            "This is not your fault; tell the course staff.", "tests": [], "extra_data": extra}


def write_json_atomic(data: dict, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def summary(result: GradingResult) -> str:
    lines = [f"Total: {result.score:g} / {result.max_score:g}"]
    for number in sorted({c.exercise for c in result.checks}):
        got = sum(c.score for c in result.checks if c.exercise == number)
        out_of = sum(c.max_score for c in result.checks if c.exercise == number)
        name = "training check" if number == 0 else f"exercise {number} ({EXERCISES[number - 1]})"
        lines.append(f"  {name}: {got:g} / {out_of:g}")
    lines += [f"Note: {n}" for n in result.notes]
    return "\n".join(lines)


def terminal(result: GradingResult, show_hidden: bool = True) -> str:
    """A table per exercise, with the feedback of each failed check under it."""
    out = []
    for number in sorted({c.exercise for c in result.checks}):
        rows = [c for c in result.checks if c.exercise == number]
        got, out_of = sum(c.score for c in rows), sum(c.max_score for c in rows)
        title = "Training check" if number == 0 else f"Exercise {number}: {EXERCISES[number - 1]}"
        out.append(f"{title:<66}{got:>6g} / {out_of:g}")
        width = max(len(c.check) for c in rows)
        for c in rows:
            if c.visibility != "visible" and not show_hidden:
                continue
            mark = "PASS" if c.passed else "FAIL"
            out.append(f"  {mark}  {c.check:<{width}}  {c.score:>4g}/{c.max_score:<4g} {c.description}")
            if c.feedback and not c.passed:
                out += ["          " + line for line in c.feedback.splitlines()]
        out.append("")
    out.append(f"{'TOTAL':<66}{result.score:>6g} / {result.max_score:g}")
    out += [f"Note: {n}" for n in result.notes]
    return "\n".join(out)

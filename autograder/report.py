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

from assignment.contract import exercise

from .grade import CheckResult, GradingResult


def test_name(c: CheckResult) -> str:
    if c.exercise == 0:
        return f"Training check: {c.check}"
    return f"Exercise {c.exercise} ({exercise(c.exercise).name}): {c.check}"


def _title(number: int) -> str:
    return "training check" if number == 0 else f"exercise {number} ({exercise(number).name})"


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
        "output": summary(result, include_hidden=False),
        "tests": tests,
        "extra_data": result.extra,
    }


def failure_results(message: str, extra: dict) -> dict:
    """results.json for a grader that could not finish: 0 points and what went wrong."""
    return {"score": 0.0, "execution_time": 0.0, "output": f"The autograder failed: {message}. "
            "This is not your fault; tell the course staff.", "tests": [], "extra_data": extra}


def write_json_atomic(data: dict, path: Path) -> None:
    write_text_atomic(json.dumps(data, indent=2) + "\n", path, prefix=".results-")


def write_text_atomic(text: str, path: Path, prefix: str | None = None) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it (``prefix``, default
    ``.NAME-``): a reader sees the old file or the new one, never half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix or f".{path.name}-")
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def summary(result: GradingResult, include_hidden: bool = True) -> str:
    """Totals per exercise. Students read it without the hidden checks (results.json's output):
    those are scored now and reported when the staff publish grades."""
    shown = [c for c in result.checks if include_hidden or c.visibility == "visible"]
    label = "Total" if include_hidden else "Visible checks"
    lines = [f"{label}: {sum(c.score for c in shown):g} / {sum(c.max_score for c in shown):g}"]
    for number in sorted({c.exercise for c in shown}):
        rows = [c for c in shown if c.exercise == number]
        lines.append(f"  {_title(number)}: {sum(c.score for c in rows):g} / {sum(c.max_score for c in rows):g}")
    hidden = [c for c in result.checks if c.visibility != "visible"]
    if hidden and not include_hidden:
        lines.append(f"Hidden checks ({sum(c.max_score for c in hidden):g} points) are graded now and shown "
                     "when grades are published.")
    return "\n".join(lines)


def terminal(result: GradingResult) -> str:
    """A table per exercise, hidden checks included (the TA's view), with the feedback of each
    failed check under it."""
    out = []
    for number in sorted({c.exercise for c in result.checks}):
        rows = [c for c in result.checks if c.exercise == number]
        got, out_of = sum(c.score for c in rows), sum(c.max_score for c in rows)
        title = _title(number).capitalize()
        out.append(f"{title:<66}{got:>6g} / {out_of:g}")
        width = max(len(c.check) for c in rows)
        for c in rows:
            mark = "PASS" if c.passed else "FAIL"
            out.append(f"  {mark}  {c.check:<{width}}  {c.score:>4g}/{c.max_score:<4g} {c.description}")
            if c.feedback and not c.passed:
                out += ["          " + line for line in c.feedback.splitlines()]
        out.append("")
    out.append(f"{'TOTAL':<66}{result.score:>6g} / {result.max_score:g}")
    return "\n".join(out)

"""Turn a GradingResult into what people read: a terminal report and Gradescope's results.json.

results.json follows Gradescope's autograder specification (score, execution_time, output,
tests[], extra_data) and is written last and atomically: whatever the submission wrote at that
path is replaced.

Part II (exercises 6-8) is bonus: its checks are tests named "Bonus (Part II) ..." with their
own max_score, and the top-level score adds their points to Part I's. Gradescope's format knows
no bonus but a score beyond the assignment's total, which stays Part I's 100 in Gradescope's
settings: that is extra credit there. extra_data states both parts apart for the staff.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from assignment.contract import exercise, is_bonus

from .grade import CheckResult, GradingResult


BONUS_TITLE = "Bonus (Part II)"


def test_name(c: CheckResult) -> str:
    if c.exercise == 0:
        return f"Training check: {c.check}"
    name = f"Exercise {c.exercise} ({exercise(c.exercise).name}): {c.check}"
    return f"{BONUS_TITLE} {name}" if c.bonus else name


def _title(number: int) -> str:
    return "training check" if number == 0 else f"exercise {number} ({exercise(number).name})"


def _not_attempted(result: GradingResult) -> set[int]:
    """The exercises whose every check met a blank (or no function)."""
    numbers = {c.exercise for c in result.checks}
    return {n for n in numbers if all(c.not_attempted for c in result.checks if c.exercise == n)}


def to_gradescope(result: GradingResult) -> dict:
    skipped = {n for n in _not_attempted(result) if is_bonus(n)}
    tests = [{
        "name": test_name(c),
        "score": c.score,
        "max_score": c.max_score,
        "status": "passed" if c.passed else "failed",
        "output": ("Not attempted (Part II is optional): " if c.exercise in skipped else "") + c.description
                  + ("\n\n" + c.feedback if c.feedback else ""),
        "visibility": c.visibility,
        "extra_data": {"exercise": c.exercise, "check": c.check, **({"bonus": True} if c.bonus else {})},
    } for c in result.checks]
    bonus = {"part_one_score": result.score, "part_one_max": result.max_score,
             "bonus_score": result.bonus_score, "bonus_max": result.bonus_max} if result.bonus_max else {}
    notes = {"hidden_check_failures": result.staff_notes} if result.staff_notes else {}  # stored, never shown
    return {
        "score": result.score + result.bonus_score,
        "execution_time": result.execution_time,
        "output": summary(result, include_hidden=False),
        "tests": tests,
        "extra_data": {**result.extra, **bonus, **notes},
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
    visible = [c for c in result.checks if include_hidden or c.visibility == "visible"]
    shown = [c for c in visible if not c.bonus]
    skipped = _not_attempted(result)
    label = "Total" if include_hidden else "Visible checks"
    lines = [result.notice] if result.notice else []
    lines.append(f"{label}: {sum(c.score for c in shown):g} / {sum(c.max_score for c in shown):g}")
    lines += _per_exercise(shown, skipped)
    bonus = [c for c in visible if c.bonus]
    if bonus and {c.exercise for c in bonus} <= skipped:
        lines.append(f"{BONUS_TITLE}, optional: not attempted")
    elif bonus:  # Part II apart: bonus points beyond the total above
        lines.append(f"{BONUS_TITLE}, beyond the total: {sum(c.score for c in bonus):g} / {sum(c.max_score for c in bonus):g}")
        lines += _per_exercise(bonus, skipped)
    hidden = [c for c in result.checks if c.visibility != "visible"]
    if hidden and not include_hidden:
        points = sum(c.max_score for c in hidden if not c.bonus)
        extra = sum(c.max_score for c in hidden if c.bonus)
        worth = " and ".join(part for part in (f"{points:g} points" if points else "",
                                               f"{extra:g} bonus points" if extra else "") if part)
        lines.append(f"Hidden checks ({worth}) are graded now and shown when grades are published.")
    return "\n".join(lines)


def _per_exercise(checks: list[CheckResult], skipped: set[int]) -> list[str]:
    lines = []
    for number in sorted({c.exercise for c in checks}):
        rows = [c for c in checks if c.exercise == number]
        lines.append(f"  {_title(number)}: {sum(c.score for c in rows):g} / {sum(c.max_score for c in rows):g}"
                     + (" (not attempted)" if number in skipped else ""))
    return lines


def terminal(result: GradingResult) -> str:
    """A table per exercise, hidden checks included (the TA's view), with the feedback of each
    failed check under it; Part II's exercises after Part I's total, with a bonus total of their own."""
    out = []
    part_one = sorted({c.exercise for c in result.checks if not c.bonus})
    part_two = sorted({c.exercise for c in result.checks if c.bonus})
    if result.notice:
        out += [result.notice, ""]
    for number in part_one:
        out += _table(result, number)
    out.append(f"{'TOTAL':<66}{result.score:>6g} / {result.max_score:g}")
    if part_two:
        out += ["", f"{BONUS_TITLE.upper()}: bonus points beyond the total", ""]
        for number in part_two:
            out += _table(result, number)
        out.append(f"{'BONUS':<66}{result.bonus_score:>6g} / {result.bonus_max:g}")
    return "\n".join(out)


def _table(result: GradingResult, number: int) -> list[str]:
    rows = [c for c in result.checks if c.exercise == number]
    got, out_of = sum(c.score for c in rows), sum(c.max_score for c in rows)
    title = _title(number).capitalize()
    out = [f"{title:<66}{got:>6g} / {out_of:g}"]
    width = max(len(c.check) for c in rows)
    for c in rows:
        mark = "PASS" if c.passed else "FAIL"
        out.append(f"  {mark}  {c.check:<{width}}  {c.score:>4g}/{c.max_score:<4g} {c.description}")
        if c.feedback and not c.passed:
            out += ["          " + line for line in c.feedback.splitlines()]
    out.append("")
    return out

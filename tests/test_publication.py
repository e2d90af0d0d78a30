"""Nothing of the hidden score before publication.

Gradescope's documentation (autograder specifications, "Controlling Test Case Visibility"):
`after_published` tests are shown "only when the assignment is explicitly published"; "If test
cases are hidden, students will not be able to see their total score. Test cases with visibility
set to `hidden` don't affect this"; stdout is "only shown to instructors" unless results.json sets
`stdout_visibility`; `extra_data` is stored, not shown. ``before_publication`` below is that rule: a
results.json as a student sees it before the staff publish grades.
"""

from __future__ import annotations

import dataclasses

import pytest

from autograder import config, report
from autograder.exercises import CHECK_IDS
from autograder.grade import CheckResult, GradingResult

from test_grader import CONFIG, FULL

RELEASED_BEFORE_PUBLICATION = ("visible", "after_due_date")  # after the due date, which comes first


def before_publication(data: dict) -> dict:
    """What a student sees of ``data`` (results.json) after the due date, before publication."""
    default = data.get("visibility", "visible")
    tests = [t for t in data.get("tests", []) if t.get("visibility", default) in RELEASED_BEFORE_PUBLICATION]
    unreleased = len(tests) < len([t for t in data.get("tests", []) if t.get("visibility", default) != "hidden"])
    seen = {"tests": tests, "output": data.get("output")}
    if not unreleased:
        seen["score"] = data.get("score")
    if data.get("stdout_visibility") in RELEASED_BEFORE_PUBLICATION:
        seen["stdout"] = "the grader's stdout"
    return seen


def result_with(hidden_score: float) -> GradingResult:
    """Every check of grading.yaml; the hidden ones all at ``hidden_score`` of their points."""
    checks = [CheckResult(n, name, "desc", c.points if c.visibility == "visible" else hidden_score * c.points,
                          c.points, c.visibility, "" if c.visibility == "visible" or hidden_score == 1 else "failed")
              for n, ex in FULL.exercises.items() for name, c in ex.items()]
    return GradingResult(checks, {"grader_version": "x"}, 12.0)


def test_a_student_sees_the_same_before_publication_whatever_the_hidden_checks_scored():
    full, none = (report.to_gradescope(result_with(s)) for s in (1.0, 0.0))
    assert full["score"] != none["score"]  # the record itself holds the hidden points...
    assert before_publication(full) == before_publication(none)  # ...but nothing a student sees differs
    seen = before_publication(none)
    assert "score" not in seen and "stdout" not in seen
    assert all(not t["name"].startswith("hidden") for t in seen["tests"])


def test_a_check_with_points_cannot_be_hidden_on_gradescope(tmp_path):
    """A `hidden` test does not hide the total: its points would be readable as total - visible."""
    text = CONFIG.read_text().replace("hidden_loss:     {points: 2, examples: 15, visibility: after_published",
                                      "hidden_loss:     {points: 2, examples: 15, visibility: hidden", 1)
    assert "visibility: hidden," in text
    bad = tmp_path / "grading.yaml"
    bad.write_text(text)
    with pytest.raises(config.ConfigError, match="cannot be 'hidden'"):
        config.load(bad, CHECK_IDS)
    # the shipped grading.yaml: every check with points is visible or released with the grades
    assert all(c.visibility in ("visible", "after_published") for ex in FULL.exercises.values() for c in ex.values())

"""One student of a class: grade, write ``results/<id>.json``, or record the grader's own failure.

``results/<id>.json`` is exactly what ``ppo-grade FILE --results`` writes for the same file. A
failure of the grader's own (never the student's fault) leaves no results file and the reason in
``grader-failures/<id>.json``, so that the next run retries that student.
"""

from __future__ import annotations

import json
import math
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import report, submission
from ..config import GradingConfig
from ..grade import GradingResult, grade, nothing_to_grade
from ..sandbox import GraderFailure, Sandbox
from .discovery import Student, shown

RESULTS, FAILURES = "results", "grader-failures"
GRADED, REFUSED, FAILED = "graded", "refused", "grader failed"


@dataclass(frozen=True)
class Setup:
    """What every grading process needs (pickled to it)."""
    cfg: GradingConfig
    config_path: Path
    out: Path
    exercises: tuple[int, ...] | None
    with_training: bool
    private: tuple[Path, ...] = ()  # hidden from every sandbox: the submissions, the out folder
    slots: tuple[Path, ...] = ()    # one temporary folder per grading process, hidden from the others
    # Modules a single grading has imported that each grading process imports too (pool.py says why);
    # the caller names them (the CLI names itself), so this package never imports the CLI.
    as_alone: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outcome:
    student: str
    status: str                     # graded, refused: reason, grader failed: reason
    score: float | None = None
    max_score: float | None = None
    seconds: float = 0.0
    log: tuple[str, ...] = ()
    details: str = ""               # the traceback of a grader bug, for the staff

    @property
    def failed(self) -> bool:
        return self.status.startswith(FAILED)


def results_path(out: Path, sid: str) -> Path:
    return Path(out) / RESULTS / f"{sid}.json"


def failure_path(out: Path, sid: str) -> Path:
    return Path(out) / FAILURES / f"{sid}.json"


def grade_student(student: Student, setup: Setup, get_sandbox: Callable[[], Sandbox | None] = lambda: None,
                  grade_fn: Callable[..., GradingResult] = grade) -> Outcome:
    """Grade one student and write their results file; a failure of the grader's own is recorded
    (grader-failures/<id>.json, no results file) and returned, never raised."""
    started = time.monotonic()
    try:
        result = _grade_or_refuse(student, setup, get_sandbox, grade_fn)
        data = report.to_gradescope(result)
        report.write_json_atomic(data, results_path(setup.out, student.id))
    except GraderFailure as err:
        return record_failure(setup.out, student.id, str(err), time.monotonic() - started)
    except Exception as err:  # a bug of the grader's own: the student keeps no result, a rerun retries
        return record_failure(setup.out, student.id, f"{type(err).__name__}: {err}", time.monotonic() - started,
                              traceback.format_exc())
    unlink(failure_path(setup.out, student.id))
    return Outcome(student.id, status_of(data), result.score, result.max_score,
                   round(time.monotonic() - started, 3), tuple(result.log))


def _grade_or_refuse(student: Student, setup: Setup, get_sandbox, grade_fn) -> GradingResult:
    if student.path is None:
        return nothing_to_grade(setup.cfg, student.problem)
    try:
        source = submission.read(student.path, student.folder)
    except submission.Refused as err:  # its words name the file: a name that is not UTF-8 as \xNN
        return nothing_to_grade(setup.cfg, shown(str(err)))
    return grade_fn(source, setup.cfg, setup.config_path, with_training=setup.with_training,
                    exercises=set(setup.exercises) if setup.exercises else None, sandbox=get_sandbox())


def record_failure(out: Path, sid: str, message: str, seconds: float = 0.0, details: str = "") -> Outcome:
    """The grader failed on ``sid``: no results file (a stale one is removed), the reason on file."""
    unlink(results_path(out, sid))
    reason = shown(" ".join(message.split())) or "unknown error"
    report.write_json_atomic({"student": sid, "reason": reason, "details": details}, failure_path(out, sid))
    return Outcome(sid, f"{FAILED}: {reason}", seconds=round(seconds, 3), details=details)


def status_of(data: dict) -> str:
    """graded, or refused: the reason. A refused file's results (grade.nothing_to_grade) record no
    sandbox, and every check carries the reason after its description."""
    if "sandbox" in data.get("extra_data", {}) or not data.get("tests"):
        return GRADED
    return f"{REFUSED}: " + data["tests"][0]["output"].split("\n\n", 1)[-1]


def read_results(out: Path, sid: str) -> dict | None:
    """The results file of ``sid`` if it is one the grader wrote (complete and consistent), else None."""
    try:
        data = json.loads(results_path(out, sid).read_text(encoding="utf-8"))
        tests = data["tests"]
        if all({"score", "max_score", "status"} <= t.keys() and {"exercise", "check"} <= t["extra_data"].keys()
               for t in tests) and math.isclose(data["score"], sum(t["score"] for t in tests)):
            return data
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def read_failure(out: Path, sid: str) -> str | None:
    """Why the grader failed on ``sid``, if it did on the last try."""
    try:
        return str(json.loads(failure_path(out, sid).read_text(encoding="utf-8"))["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

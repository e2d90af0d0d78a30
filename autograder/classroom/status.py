"""How each exercise of a student went, and the student's reason, read from their results file.

results.json must stay what ``ppo-grade FILE`` writes (Gradescope's format), so the statuses are
read back from the grader's own words in each check's feedback; the phrases below are the ones
grade.py and sandbox.py write (tests/test_classroom.py builds them from those modules where they
are functions, and the class tests see them come out of real gradings). An exercise is

* ``graded``: its checks ran on the student's function (whatever the score);
* ``not attempted``: the function raises NotImplementedError (the blank) or does not exist;
* ``syntax error`` / ``import error``: the file could not be imported (then every exercise is);
* ``timeout`` / ``out of memory``: a call hit the worker's time limit or memory cap, so the
  remaining checks of the exercise did not run;
* ``refused``: there was no file to grade (a link, a folder, not UTF-8, ...);
* ``grader failure``: the grader failed on this student (no results file; rerun to retry).

The reason is empty for a normal grading: every exercise graded, except that Part II's exercises
(optional, bonus) may be not attempted. The grader stages every submission as ``submission.py``
(sandbox.Sandbox.add), so an import error names that file; the reason names the student's.
"""

from __future__ import annotations

from dataclasses import dataclass

from assignment.contract import is_bonus

from ..grade import HIDDEN_FEEDBACK
from .grading import FAILED, REFUSED

GRADED = "graded"
NOT_ATTEMPTED = "not attempted"
IMPORT_ERROR = "import error"
SYNTAX_ERROR = "syntax error"
TIMEOUT = "timeout"
OUT_OF_MEMORY = "out of memory"
REFUSED_FILE = "refused"
GRADER_FAILURE = "grader failure"
NOT_GRADED = "not graded"
# Worst first: an exercise takes the worst status of its checks.
ORDER = (GRADER_FAILURE, REFUSED_FILE, SYNTAX_ERROR, IMPORT_ERROR, TIMEOUT, OUT_OF_MEMORY, NOT_ATTEMPTED, GRADED)

IMPORT_FAILED = "the submission could not be imported: "          # grade.grade
NOT_IMPLEMENTED = ("not implemented: ", "the submission defines no function",  # grade._run_check, grade._grade_all
                   HIDDEN_FEEDBACK["not implemented"])
TIMED_OUT = "took longer than its time limit"                      # sandbox.WorkerTimeout
NO_MEMORY = ("ran out of memory", "likely over the memory cap")    # grade._run_check, sandbox._death_reason
HIDDEN_PREFIX = "failed on the hidden inputs"                       # grade._hidden_feedback
SYNTAX = ("raised SyntaxError", "raised IndentationError", "raised TabError")
STAGED = "submission.py"                                            # sandbox.Sandbox.add


def feedback_of(test: dict) -> str:
    """A results test's feedback: its output after the check's description."""
    output = test.get("output", "")
    return output.split("\n\n", 1)[1] if "\n\n" in output else ""


def check_status(feedback: str) -> str:
    """The status one check's feedback implies (graded when nothing stopped the check)."""
    if feedback.startswith(IMPORT_FAILED):
        if any(s in feedback for s in SYNTAX):
            return SYNTAX_ERROR
        if TIMED_OUT in feedback:
            return TIMEOUT
        return OUT_OF_MEMORY if any(s in feedback for s in NO_MEMORY) else IMPORT_ERROR
    if any(feedback.startswith(s) or s in feedback.split("\n", 1)[0] for s in NOT_IMPLEMENTED):
        return NOT_ATTEMPTED
    first = feedback.split("\n", 1)[0]
    # An abort's message is the whole feedback; a counterexample's is not, and a hidden check's
    # words ("crashed, ran out of memory or ran out of time") do not say which.
    if not first.startswith(("Counterexample", HIDDEN_PREFIX)):
        if TIMED_OUT in first:
            return TIMEOUT
        if any(s in first for s in NO_MEMORY):
            return OUT_OF_MEMORY
    return GRADED


@dataclass(frozen=True)
class StudentStatus:
    exercises: dict[int, str]   # exercise number (0: the training check) -> status
    reason: str                 # empty when every exercise was graded normally


def student_status(data: dict | None, status: str, failure: str | None, numbers: list[int],
                   file: str = "") -> StudentStatus:
    """The per-exercise statuses and the reason of one student. ``status`` is grading.status_of's,
    ``failure`` the grader's failure reason when there is no results file, ``file`` the student's
    file as the TA knows it (the reason names it instead of the staged copy's name)."""
    if data is None:
        kind = GRADER_FAILURE if failure is not None else NOT_GRADED
        reason = f"{GRADER_FAILURE}: {failure}" if failure is not None else "not graded yet: rerun to grade"
        return StudentStatus({n: kind for n in numbers}, reason)
    if status.startswith(REFUSED):
        return StudentStatus({n: REFUSED_FILE for n in numbers}, status)
    found: dict[int, str] = {}
    first_words: dict[int, str] = {}
    for test in data.get("tests", []):
        n, fb = test["extra_data"]["exercise"], feedback_of(test)
        s = check_status(fb) if test.get("status") == "failed" else GRADED
        if n not in found or ORDER.index(s) < ORDER.index(found[n]):
            found[n], first_words[n] = s, fb.split("\n", 1)[0]
    statuses = {n: found.get(n, NOT_GRADED) for n in numbers} | found
    return StudentStatus(statuses, _reason(statuses, first_words, file))


def _reason(statuses: dict[int, str], words: dict[int, str], file: str = "") -> str:
    # An optional part left blank is a normal grading; attempted, it counts like any exercise.
    counted = {n: s for n, s in statuses.items() if not (is_bonus(n) and s == NOT_ATTEMPTED)} or statuses
    off = {n: s for n, s in counted.items() if s != GRADED}
    if not off:
        return ""
    kinds = set(off.values())
    if len(off) == len(counted) and len(kinds) == 1:
        kind = kinds.pop()
        if kind in (SYNTAX_ERROR, IMPORT_ERROR):  # the file as a whole: say what the import raised
            detail = words[next(iter(off))].removeprefix(IMPORT_FAILED)
            return f"{kind}: {detail.replace(STAGED, file) if file else detail}"
        return f"{kind} (every exercise)"
    return "; ".join(f"{_name(n)} {s}" for n, s in sorted(off.items(), key=lambda item: (item[0] == 0, item[0])))


def _name(number: int) -> str:
    return "training" if number == 0 else f"ex{number}"

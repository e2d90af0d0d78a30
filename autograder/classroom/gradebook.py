"""The gradebook: one row per student, built from the out folder's files alone, and its CSV.

Columns come from what the results files contain (every exercise and check, in the grader's
order, the training check last), not from a list here: an exercise or section the grader adds
(a bonus exercise, say) is a column without a change to this module.

One row per real student (discovery.Person): a group submission's grading gives each member a
row, keyed by the student (the key, then the name, ids and email the platform gives), with the
file that was graded. ``total`` and ``max`` are Part I's, the same denominator in every file
this package writes; ``bonus`` is what the optional Part II adds beyond it, out of ``bonus max``.

The CSV is UTF-8 with a byte-order mark: Excel reads a CSV without one in the system's legacy
code page and garbles "José Müller". LibreOffice does not go by the mark (its headless conversion,
version 7.4, read the file as Latin-1): in its Text Import dialog choose the character set
"Unicode (UTF-8)"; on the command line give its CSV filter the character set 76 (UTF-8),
``--infilter=CSV:44,34,76`` (README; tests/test_classroom.py converts a gradebook so). Python:
``open(path, encoding="utf-8-sig")``. Text cells that a spreadsheet would run as a formula
(starting with = + - @) get a leading apostrophe, since file names and exception messages in them
come from students.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from dataclasses import dataclass, field
from pathlib import Path

from assignment.contract import is_bonus

from .discovery import KEY_COLUMN, Student
from .grading import read_failure, read_results, status_of
from .status import NOT_GRADED, feedback_of, student_status

BOM = "\ufeff"
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


@dataclass
class Row:
    student: str                                 # the person's key (discovery.Person)
    status: str                                  # graded, refused: why, grader failed: why, not graded
    total: float | None = None                   # Part I's score (the assignment's total)
    max_score: float | None = None
    bonus: float | None = None                   # Part II's points beyond the total (None: none graded)
    bonus_max: float | None = None
    file: str = ""                               # what was graded, relative to the submissions folder
    exercises: dict[int, float] = field(default_factory=dict)
    exercise_max: dict[int, float] = field(default_factory=dict)
    checks: dict[tuple[int, str], float] = field(default_factory=dict)
    failed_checks: list[tuple[int, str]] = field(default_factory=list)
    statuses: dict[int, str] = field(default_factory=dict)    # per exercise: status.GRADED, ...
    reason: str = ""                                          # empty: graded normally
    feedback: dict[tuple[int, str], str] = field(default_factory=dict)  # of the failed checks
    hidden: set[tuple[int, str]] = field(default_factory=set)           # which checks are hidden
    extra: dict[str, str] = field(default_factory=dict)                 # name, sid, email, ... (platform, roster)


@dataclass
class Gradebook:
    exercises: list[int]                 # 0: the training check
    checks: list[tuple[int, str]]
    rows: list[Row]
    extra_columns: list[str] = field(default_factory=list)  # the platform's fields, then the roster's
    sid_column: str = KEY_COLUMN         # the platform's student id: the key itself, a field, "" (none)

    @property
    def has_bonus(self) -> bool:
        return any(is_bonus(n) for n in self.exercises)

    @property
    def out_of(self) -> float | None:
        """Part I's maximum, the denominator of every total."""
        return max((r.max_score for r in self.rows if r.max_score is not None), default=None)

    @property
    def bonus_out_of(self) -> float | None:
        """What Part II can add beyond it (None: no Part II graded)."""
        return max((r.bonus_max for r in self.rows if r.bonus_max is not None), default=None)

    def sid(self, row: Row) -> str:
        """The id a platform's CSV upload matches ``row``'s student by ("": none)."""
        return row.student if self.sid_column == KEY_COLUMN else row.extra.get(self.sid_column, "")

    def header(self) -> list[str]:
        return [KEY_COLUMN, *self.extra_columns, "file", "total", "max",
                *(["bonus", "bonus max"] if self.has_bonus else []), "reason",
                *(exercise_column(n) for n in self.exercises),
                *(f"{exercise_column(n)} status" for n in self.exercises),
                *(f"{n}/{c}" for n, c in self.checks), "status"]

    def table(self) -> list[list[str]]:
        return [[r.student, *(r.extra.get(c, "") for c in self.extra_columns), r.file, number_text(r.total),
                 number_text(r.max_score), *([number_text(r.bonus), number_text(r.bonus_max)] if self.has_bonus else []),
                 r.reason, *(number_text(r.exercises.get(n)) for n in self.exercises),
                 *(r.statuses.get(n, "") for n in self.exercises),
                 *(number_text(r.checks.get(k)) for k in self.checks), r.status] for r in self.rows]


def exercise_column(number: int) -> str:
    return "training" if number == 0 else f"ex{number}"


def _exercise_order(number: int) -> tuple[bool, int]:
    return number == 0, number  # the training check last, as the CSV always had it


def columns_from(results: list[dict]) -> tuple[list[int], list[tuple[int, str]]]:
    """The exercises and checks the results contain, in the grader's order."""
    checks: list[tuple[int, str]] = []
    for data in results:
        for t in data["tests"]:
            key = (t["extra_data"]["exercise"], t["extra_data"]["check"])
            if key not in checks:
                checks.append(key)
    numbers = sorted({n for n, _ in checks}, key=_exercise_order)
    return numbers, sorted(checks, key=lambda k: (_exercise_order(k[0]), checks.index(k)))


def build_gradebook(out: Path, students: list[Student], fallback: tuple[list[int], list[tuple[int, str]]],
                    roster: dict[str, dict[str, str]] | None = None, columns: list[str] = (),
                    sid_column: str = KEY_COLUMN) -> Gradebook:
    """The gradebook, from the files in ``out`` alone: a row for each person of each grading in
    ``students``, with the person's fields, then the roster's (keyed by the person's key; a
    value of the roster wins); a submission the platform lists but the folder lacks is "not
    graded", whatever results file an earlier run left. ``columns``: those fields, in order.
    ``fallback``: the columns when no student has a results file yet (every grading failed)."""
    found = {s.id: read_results(out, s.id) for s in students if not s.missing}
    numbers, checks = columns_from([d for d in found.values() if d is not None])
    if not checks:
        numbers, checks = fallback
    rows = []
    for s in sorted(students, key=lambda s: s.id):
        graded = Row(s.id, NOT_GRADED, statuses={n: NOT_GRADED for n in numbers}, reason=s.problem, file=s.file) \
            if s.missing else row_for(out, s.id, checks, numbers, found[s.id], s.file)
        for person in s.persons:
            extra = {**person.fields, **{k: v for k, v in (roster or {}).get(person.key, {}).items() if v}}
            rows.append(dataclasses.replace(graded, student=person.key, extra=extra,
                                            reason="; ".join(filter(None, [graded.reason, person.note]))))
    return Gradebook(numbers, checks, rows, list(columns), sid_column)


def row_for(out: Path, sid: str, checks: list[tuple[int, str]], numbers: list[int] | None = None,
            data: dict | None = None, file: str = "") -> Row:
    """The row of the grading ``sid`` (its results file, or why there is none), keyed by ``sid``."""
    numbers = numbers if numbers is not None else sorted({n for n, _ in checks}, key=_exercise_order)
    data = data if data is not None else read_results(out, sid)
    if data is None:
        failure = read_failure(out, sid)
        state = student_status(None, "", failure, numbers)
        status = f"grader failed: {failure}" if failure is not None else NOT_GRADED
        return Row(sid, status, statuses=state.exercises, reason=state.reason, file=file)
    tests = {(t["extra_data"]["exercise"], t["extra_data"]["check"]): t for t in data["tests"]}
    present = [k for k in checks if k in tests]
    status = status_of(data)
    state = student_status(data, status, None, numbers, file)
    # total and max are Part I's; Part II's bonus shows in its own exercise columns (ex6-ex8)
    part_one = [k for k in present if not is_bonus(k[0])]
    part_two = [k for k in present if is_bonus(k[0])]
    row = Row(sid, status, sum(tests[k]["score"] for k in part_one), sum(tests[k]["max_score"] for k in part_one),
              sum(tests[k]["score"] for k in part_two) if part_two else None,
              sum(tests[k]["max_score"] for k in part_two) if part_two else None, file,
              checks={k: tests[k]["score"] for k in present},
              failed_checks=[k for k in present if tests[k]["status"] == "failed"],
              statuses=state.exercises, reason=state.reason,
              hidden={k for k in present if tests[k].get("visibility") != "visible"})
    row.feedback = {k: feedback_of(tests[k]) for k in row.failed_checks}
    for number, check in present:
        row.exercises[number] = row.exercises.get(number, 0.0) + tests[number, check]["score"]
        row.exercise_max[number] = row.exercise_max.get(number, 0.0) + tests[number, check]["max_score"]
    return row


def to_csv(book: Gradebook) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(book.header())
    writer.writerows([[_cell(v) for v in row] for row in book.table()])
    return BOM + buffer.getvalue()


def _cell(value: str) -> str:
    if value.startswith(FORMULA_START) and not _is_number(value):
        return "'" + value
    return value


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def number_text(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else repr(float(value))

"""The files a TA uploads to a platform: ``grades.csv`` and, from a Canvas class, ``canvas-import.csv``.

``grades.csv`` is ``email,sid,name,score`` (``bonus`` after it when the course keeps Part II's
bonus in a column of its own), one row per student with a grade: a platform's CSV upload maps
its students by email or by student id (``sid``: the layout's, exports.SID_COLUMN; blank for a
Moodle download, whose participant id no import matches). ``score`` is Part I's total (of the
gradebook's ``max``) plus, unless the bonus has its own column, Part II's bonus. Left out, and
listed in summary.md and the terminal (``uploadable``): a student without a grade (the grader
failed, no submission, a submission missing from the export), so that an upload never overwrites
a grade with a blank or a 0; a row with neither email nor sid, which no platform could match;
and rows that share an email or sid (one student in two submissions), until the TA decides which
counts. UTF-8 without a byte-order mark: it is read by programs, not opened in a spreadsheet.

``canvas-import.csv`` is what Canvas's Grades, Import takes (its parser: lib/gradebook_importer.rb
in Canvas's source): the student columns of the TA's gradebook export, Student (or LastName,
FirstName) through Section, copied as exported, then the assignment's column under its exported
header ``<title> (<assignment id>)`` (and the bonus assignment's, when the bonus has its own).
Canvas finds each student by the ID column (the Canvas user id), then the SIS ids, then the name;
it finds the assignment by the id in the header. No "Points Possible" row: Canvas would set the
assignment's points from it. Only students with a grade are listed: a blank cell would clear a
grade already in Canvas, while an absent row leaves it.
"""

from __future__ import annotations

import csv
import io
from collections import Counter

from .gradebook import Gradebook, Row, number_text
from .roster import CanvasGradebook

GRADES_CSV, CANVAS_CSV = "grades.csv", "canvas-import.csv"
ADD, COLUMN = "add", "column"      # where Part II's bonus goes: added to the score, or a column of its own


NO_GRADE = "no grade (no submission, not graded, or a grader failure: rerun to retry it)"
NOBODY = "no email or sid to match the student by"
SHARED = "an email or sid on several rows (one student in two submissions): upload the one that counts by hand"


def uploadable(book: Gradebook) -> tuple[list[Row], dict[str, list[str]]]:
    """The rows whose grade is uploaded (a refused file's 0 is one), and the students left out,
    by why (NO_GRADE, NOBODY, SHARED)."""
    graded = [r for r in book.rows if r.total is not None]
    ids = {r.student: {i for i in (r.extra.get("email", ""), book.sid(r)) if i} for r in graded}
    count = Counter(i for found in ids.values() for i in found)
    left = {NO_GRADE: [r.student for r in book.rows if r.total is None],
            NOBODY: [r.student for r in graded if not ids[r.student]],
            SHARED: [r.student for r in graded if any(count[i] > 1 for i in ids[r.student])]}
    out = set(left[NOBODY] + left[SHARED])
    return [r for r in graded if r.student not in out], {why: keys for why, keys in left.items() if keys}


def score(row: Row, bonus: str) -> float:
    return row.total + ((row.bonus or 0.0) if bonus == ADD else 0.0)


def grades_csv(book: Gradebook, bonus: str = ADD) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["email", "sid", "name", "score", *(["bonus"] if bonus == COLUMN else [])])
    for r in uploadable(book)[0]:
        writer.writerow([r.extra.get("email", ""), book.sid(r), r.extra.get("name", ""), number_text(score(r, bonus)),
                         *([number_text(r.bonus or 0.0)] if bonus == COLUMN else [])])
    return buffer.getvalue()


def canvas_csv(book: Gradebook, canvas: CanvasGradebook, assignment: str, bonus_assignment: str | None,
               bonus: str = ADD) -> tuple[str, list[str]]:
    """canvas-import.csv, and notes for the TA: students the export does not know, an assignment
    whose points in Canvas differ from the grades' maximum. ``assignment`` and ``bonus_assignment``
    are columns of the export (CanvasGradebook.assignment)."""
    columns = [assignment, *([bonus_assignment] if bonus == COLUMN else [])]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*canvas.info, *columns])
    rows = {r.student: r for r in uploadable(book)[0]}
    for uid, info in canvas.students.items():  # in the export's order
        if uid in rows:
            r = rows[uid]
            writer.writerow([*info, number_text(score(r, bonus)), *([number_text(r.bonus or 0.0)] if bonus == COLUMN else [])])
    notes = []
    unknown = [key for key in rows if key not in canvas.students]
    if unknown:
        notes.append(f"{len(unknown)} graded students are not in the Canvas gradebook {canvas.path} and not in "
                     f"{CANVAS_CSV}: {', '.join(unknown)}")
    # Part I's maximum is the assignment's points; an added bonus goes beyond it (extra credit).
    out_of = {assignment: book.out_of, **({bonus_assignment: book.bonus_out_of} if bonus == COLUMN else {})}
    for column, top in out_of.items():
        points = canvas.assignments.get(column, "")
        if top is not None and points and _number(points) not in (None, top):
            notes.append(f"Canvas's {column} is worth {points} points and these grades are out of {number_text(top)}: "
                         "change its points in Canvas or scale the column before importing")
    return buffer.getvalue(), notes


def _number(text: str) -> float | None:
    """A number as Canvas exports it (a decimal comma in some locales)."""
    try:
        return float(text.replace(",", "."))
    except ValueError:
        return None

"""The roster: names and emails for the gradebook, keyed by the student's key.

``--roster roster.csv`` is a CSV with a header row: an ``id`` column (the student's key: the
submission's name without .py or its folder's name, or a platform's id, exports.py) and ``name``
and/or ``email`` columns, which the gradebook adds after ``student``. A roster saved by Excel
starts with a byte-order mark; that is read too. It is checked before anyone is graded: a
submission whose key is not in the roster stops the run (its grade could not reach a student),
naming every such key. Roster students without a submission are reported and get a row with the
reason "no submission" (a student who did not submit is common, and the TA needs that row to
enter a 0).

``--canvas-gradebook EXPORT.csv`` is a Canvas class's roster: Canvas's Grades, Export, as its
lib/gradebook_exporter.rb writes it. The header is ``Student`` (or ``LastName,FirstName`` when the
course shows them apart), ``ID`` (the Canvas user id, the key of a Canvas download), ``SIS User
ID``, ``SIS Login ID`` (and, where the account has them, ``Integration ID``, ``Root Account``),
``Section``; then the course's custom columns, one column per assignment headed ``<title> (<id>)``,
and the totals. Below the header, a row saying which assignments are muted or posted by hand (its
cells empty, "Muted" or "Manual Posting ..."), then ``    Points Possible`` with each assignment's
points, then one row per student by sortable name (Canvas's test student last). A name starting
with ``=`` is exported as ``="=Eve"``, so that a spreadsheet does not run it. The file may start
with a byte-order mark, and in some locales use ``;`` between cells and a decimal comma. The
export is a roster that is not strict: a student of the download it does not list is a warning
(a late enrolment, a test file), not a stop; its students without a submission get a row. It
also gives canvas-import.csv its columns (upload.py).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

ID, COPIED = "id", ("name", "email")
CANVAS_ID, CANVAS_SECTION = "ID", "Section"
CANVAS_COPIED = {"SIS User ID": "sis user id", "SIS Login ID": "sis login id", "Section": "section"}
CANVAS_ASSIGNMENT = re.compile(r"(?P<title>.*) \((?P<id>\d+)\)")


class RosterError(ValueError):
    """The roster cannot be read or does not match the submissions; the message says what to fix."""


@dataclass(frozen=True)
class CanvasGradebook:
    """What a Canvas gradebook export says, for its import file (upload.py)."""
    path: Path
    info: list[str]                       # the student columns, Student (or LastName, FirstName) to Section
    students: dict[str, list[str]]        # Canvas user id -> its values of ``info``, as exported
    assignments: dict[str, str]           # assignment column ("<title> (<id>)") -> points possible ("" if none)

    def assignment(self, asked: str, option: str) -> str:
        """The column of the assignment ``asked`` for: its whole header, its title or its id."""
        found = [h for h in self.assignments if asked in (h, *CANVAS_ASSIGNMENT.fullmatch(h).group("title", "id"))]
        if len(found) == 1:
            return found[0]
        listed = "; ".join(self.assignments) or "none"
        raise RosterError(f"{option} {asked!r}: {'no' if not found else 'more than one'} assignment of {self.path} "
                          f"is named so (its assignments: {listed})")


@dataclass(frozen=True)
class Roster:
    columns: list[str]                    # those of COPIED the roster has
    students: dict[str, dict[str, str]]   # id -> {column: value}
    strict: bool = True                   # a submission not in it stops the run (else: a warning)
    canvas: CanvasGradebook | None = field(default=None, compare=False)


def load(path: Path) -> Roster:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            header = [h.strip().lower() for h in (reader.fieldnames or [])]
            rows = list(reader)
    except OSError as err:
        raise RosterError(f"cannot read the roster {path}: {err.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as err:
        raise RosterError(f"the roster {path} is not a UTF-8 CSV file ({err}); save it as CSV UTF-8") from None
    if ID not in header:
        raise RosterError(f"the roster {path} has no '{ID}' column (its header: {', '.join(header) or 'empty'}); "
                          f"expected {ID},{','.join(COPIED)}")
    columns = [c for c in COPIED if c in header]
    if not columns:
        raise RosterError(f"the roster {path} has neither a 'name' nor an 'email' column: nothing to add")
    students: dict[str, dict[str, str]] = {}
    duplicates = []
    for raw in rows:
        row = {(k or "").strip().lower(): (v or "").strip() for k, v in raw.items() if isinstance(v, str) or v is None}
        sid = row.get(ID, "")
        if not sid:
            continue  # a blank line
        if sid in students:
            duplicates.append(sid)
        students[sid] = {c: row.get(c, "") for c in columns}
    if duplicates:
        raise RosterError(f"the roster {path} lists these ids more than once: {', '.join(sorted(set(duplicates)))}")
    return Roster(columns, students)


def load_canvas(path: Path) -> Roster:
    """Canvas's gradebook export as a roster keyed by Canvas user id (the module's docstring
    says what the export holds)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            text = f.read()
        first = text.split("\n", 1)[0]
        rows = list(csv.reader(io.StringIO(text), delimiter=";" if first.count(";") > first.count(",") else ","))
    except OSError as err:
        raise RosterError(f"cannot read the Canvas gradebook {path}: {err.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as err:
        raise RosterError(f"the Canvas gradebook {path} is not a UTF-8 CSV file ({err}): export it from Canvas "
                          "again (Grades, Export, Export Entire Gradebook)") from None
    header = [h.strip() for h in rows[0]] if rows else []
    first_last = header[:2] == ["LastName", "FirstName"]
    if not header or not (header[0].startswith("Student") or first_last) or CANVAS_ID not in header \
            or CANVAS_SECTION not in header:
        raise RosterError(f"{path} is not a Canvas gradebook export: its header should start with Student, ID and "
                          f"hold Section (it starts {', '.join(header[:4]) or 'empty'}); export it from Canvas "
                          "(Grades, Export, Export Entire Gradebook)")
    info = header[:header.index(CANVAS_SECTION) + 1]
    columns = {h: i for i, h in enumerate(header)}
    assignments = {h: "" for h in header[len(info):] if CANVAS_ASSIGNMENT.fullmatch(h)}
    students, fields = {}, {}
    for row in rows[1:]:
        row = row + [""] * (len(header) - len(row))
        if "Points Possible" in row[0]:
            assignments = {h: row[columns[h]].strip() for h in assignments}
        elif all(re.fullmatch(r"\s*(Muted|Manual Posting.*)?\s*", c, re.I) for c in row):
            continue  # the row saying which assignments are hidden, or an empty line
        elif row[columns[CANVAS_ID]].strip():
            uid = row[columns[CANVAS_ID]].strip()
            students[uid] = row[:len(info)]
            name = [_unquoted(row[1].strip()), _unquoted(row[0].strip())] if first_last else [_unquoted(row[0].strip())]
            fields[uid] = {"name": " ".join(name),
                           **{ours: row[columns[theirs]].strip() for theirs, ours in CANVAS_COPIED.items()
                              if theirs in columns}}
    copied = ["name", *(ours for theirs, ours in CANVAS_COPIED.items() if theirs in columns)]
    return Roster(copied, fields, strict=False, canvas=CanvasGradebook(Path(path), info, students, assignments))


def _unquoted(name: str) -> str:
    """A name as Canvas exports one that starts with = (="=x"), back to itself."""
    m = re.fullmatch(r'="(.*)"', name)
    return m.group(1) if m else name


def check(roster: Roster, ids: list[str], path: Path) -> list[str]:
    """The roster ids without a submission; raises RosterError for submissions not in a strict roster."""
    unknown = sorted(set(ids) - set(roster.students))
    if unknown and roster.strict:
        raise RosterError(f"{len(unknown)} submissions have an id that is not in the roster {path}: "
                          f"{', '.join(unknown)}. Add them to the roster (column '{ID}') or rename the submissions")
    return sorted(set(roster.students) - set(ids))

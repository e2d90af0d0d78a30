"""``--roster roster.csv``: names and emails for the gradebook, keyed by student id.

The roster is a CSV with a header row: an ``id`` column (the student id: the submission's name
without .py, or its folder's name) and ``name`` and/or ``email`` columns, which the gradebook
adds after ``student``. A roster saved by Excel starts with a byte-order mark; that is read too.

It is checked before anyone is graded: a submission whose id is not in the roster stops the run
(its grade could not reach a student), naming every such id. Roster students without a
submission are reported and get a row with the reason "no submission" (a student who did not
submit is common, and the TA needs that row to enter a 0).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

ID, COPIED = "id", ("name", "email")


class RosterError(ValueError):
    """The roster cannot be read or does not match the submissions; the message says what to fix."""


@dataclass(frozen=True)
class Roster:
    columns: list[str]                    # those of COPIED the roster has
    students: dict[str, dict[str, str]]   # id -> {column: value}


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


def check(roster: Roster, ids: list[str], path: Path) -> list[str]:
    """The roster ids without a submission; raises RosterError for submissions not in the roster."""
    unknown = sorted(set(ids) - set(roster.students))
    if unknown:
        raise RosterError(f"{len(unknown)} submissions have an id that is not in the roster {path}: "
                          f"{', '.join(unknown)}. Add them to the roster (column '{ID}') or rename the submissions")
    return sorted(set(roster.students) - set(ids))

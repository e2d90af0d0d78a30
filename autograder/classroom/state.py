"""Resuming a class: who needs grading, and what each kept result was graded from.

A student is skipped when their results file is valid and was graded from the same files (same
size, inode, mtime and ctime), under the same grading.yaml, exercises, grader version and hidden
seed. A grader failure leaves no results file, so the next run retries that student.
``--restart`` grades everyone again; ``--only NAME ...`` grades exactly those students, whatever
their results, and leaves everyone else's as it is (the gradebook is rebuilt from all of them).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, report
from .discovery import Student, stamp
from .grading import read_results

STATE = "batch-state.json"


def run_key(config_path: Path, exercises: tuple[int, ...] | None, training: bool, hidden_seed: int) -> str:
    """What a result depends on besides the submission: grading.yaml, the selection, the grader,
    and the hidden seed (set in the environment or a file, outside grading.yaml; only its hash
    reaches batch-state.json)."""
    digest = hashlib.sha256(Path(config_path).read_bytes())
    digest.update(json.dumps([__version__, list(exercises) if exercises else None, training, hidden_seed]).encode())
    return digest.hexdigest()[:16]


def load_state(out: Path) -> dict:
    try:
        state = json.loads((Path(out) / STATE).read_text(encoding="utf-8"))
        return state["students"] if isinstance(state.get("students"), dict) else {}
    except (OSError, ValueError, AttributeError):
        return {}


def save_state(out: Path, students: dict) -> None:
    report.write_json_atomic({"students": students}, Path(out) / STATE)


@dataclass(frozen=True)
class Plan:
    todo: list[Student]
    kept: list[Student]         # results kept from an earlier run
    stamps: dict[str, list]
    stale: list[str] = ()       # of ``kept``: left by --only though missing or older than their files


def plan(students: list[Student], out: Path, state: dict, key: str, restart: bool,
         only: frozenset[str] | None = None) -> Plan:
    """Who needs grading: with ``only``, exactly those students, whatever their results (the
    others are left as they are, the stale ones named); else everyone with ``restart``, else
    those without a valid results file graded from their present files under ``key``."""
    todo, kept, stale, stamps = [], [], [], {}

    def current(s: Student) -> bool:  # reads the results file: only where the answer matters
        return state.get(s.id) == {"run": key, "stamp": stamps[s.id]} and read_results(out, s.id) is not None

    for s in students:
        stamps[s.id] = stamp(s)
        if only is not None and s.id not in only:
            kept.append(s)
            if not current(s):
                stale.append(s.id)
        elif only is None and not restart and current(s):
            kept.append(s)
        else:
            todo.append(s)
    return Plan(todo, kept, stamps, stale)

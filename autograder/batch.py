"""Grade a class: a folder of submissions into per-student results.json, a CSV gradebook and a summary.

Layout of the folder: one file per student (``alice.py``, the student id is the stem) or one
folder per student (``alice/exercises.py``, the id is the folder's name; a folder without
exercises.py may hold exactly one .py file instead). Anything else under a student's name (a
link, a folder with no or several .py files, two submissions for one id) gets 0 points and the
reason, as a single grading of an unreadable file does. Hidden entries and top-level files that
are not .py are ignored (and listed in the summary).

Outputs in the out folder: ``results/<id>.json`` (exactly what ``ppo-grade FILE`` writes),
``gradebook.csv`` and ``summary.md`` (both rebuilt from the results files on every run), plus
``grader-failures/<id>.json`` for students the grader failed on and ``batch-state.json`` (what
each result was graded from, for resuming).

Isolation: ``jobs`` grading processes (spawned: the parent holds torch and threads), each with
its own sandbox, grade one student after another, as a single grading does. On top of what
``grade.open_sandbox`` hides, every sandbox hides the submissions folder, the out folder and the
other processes' stages, and each student's staged file is deleted once graded: otherwise a
submission could read its classmates' code and raise it into its own feedback.

Resume: a student is skipped when their results file is valid and was graded from the same
files (same size, inode, mtime and ctime), under the same grading.yaml, exercises and grader
version. A grader failure leaves no results file, so the next run retries that student.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import json
import math
import multiprocessing
import os
import shutil
import signal
import stat
import statistics
import sys
import tempfile
import time
import traceback
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable, Iterator, Protocol

from assignment.contract import exercise, is_bonus

from . import __version__, report, submission
from .config import GradingConfig, hidden_seed
from .exercises import CHECKS
from .grade import GradingResult, grade, nothing_to_grade, open_sandbox
from .sandbox import GraderFailure, Sandbox, check_unreadable, detect_strategy

RESULTS, FAILURES, STATE = "results", "grader-failures", "batch-state.json"
GRADED, REFUSED, FAILED = "graded", "refused", "grader failed"
MOST_FAILED = 10  # checks listed in summary.md


class BatchError(RuntimeError):
    """The class cannot be graded as asked (an empty folder, a folder that would hide the grader)."""


# ---- who is in the class ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Student:
    id: str
    path: Path | None           # the file to grade; None when the layout is wrong
    folder: Path                # the file must lie inside it once links are resolved
    problem: str = ""           # why there is nothing to grade, for the student
    watch: tuple[Path, ...] = ()  # what, changed, makes a result stale


@dataclass(frozen=True)
class Discovery:
    students: list[Student]
    ignored: list[str]


def discover(root: Path, skip: tuple[Path, ...] = ()) -> Discovery:
    """The students of the folder ``root``, sorted by id (``skip``: folders that are not students)."""
    root = Path(root)
    skipped = {os.path.abspath(p) for p in skip}
    entries: dict[str, list[Path]] = {}
    ignored = []
    for entry in sorted(root.iterdir()):
        name = entry.name
        if name.startswith(".") or name == "__pycache__" or os.path.abspath(entry) in skipped:
            continue
        if name.endswith(".py") or entry.is_symlink() or entry.is_dir():
            entries.setdefault(name[:-3] if name.endswith(".py") else name, []).append(entry)
        else:
            ignored.append(name)
    return Discovery([_student(sid, found, root) for sid, found in sorted(entries.items())], ignored)


def _student(sid: str, entries: list[Path], root: Path) -> Student:
    if len(entries) > 1:
        names = " and ".join(e.name + ("/" if e.is_dir() else "") for e in entries)
        return Student(sid, None, root, f"two submissions under one name: {names}; submit only one", tuple(entries))
    entry = entries[0]
    if not entry.is_dir() or entry.is_symlink() or entry.name.endswith(".py"):
        return Student(sid, entry, root, "", (entry,))  # submission.read refuses links, folders, FIFOs
    try:
        files = sorted(p for p in entry.iterdir() if p.name.endswith(".py") and not p.name.startswith("."))
    except OSError as err:
        return Student(sid, None, entry, f"{entry.name}/ cannot be listed ({err.strerror})", (entry,))
    chosen = entry / "exercises.py" if os.path.lexists(entry / "exercises.py") else \
        files[0] if len(files) == 1 else None
    if chosen is not None:
        return Student(sid, chosen, entry, "", (entry, chosen))
    problem = f"{entry.name}/ holds no .py file: submit exercises.py" if not files else \
        f"{entry.name}/ holds {len(files)} .py files ({', '.join(f.name for f in files)}) and no " \
        "exercises.py: submit only exercises.py"
    return Student(sid, None, entry, problem, (entry,))


def stamp(student: Student) -> list:
    """What the files of ``student`` look like now; any change (a touch, a new upload) changes it."""
    found = []
    for path in student.watch:
        try:
            st = os.lstat(path)
            found.append([st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns])
        except OSError:
            found.append(None)
    return found


# ---- one student ------------------------------------------------------------------------------------

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
    _unlink(failure_path(setup.out, student.id))
    return Outcome(student.id, status_of(data), result.score, result.max_score,
                   round(time.monotonic() - started, 3), tuple(result.log))


def _grade_or_refuse(student: Student, setup: Setup, get_sandbox, grade_fn) -> GradingResult:
    if student.path is None:
        return nothing_to_grade(setup.cfg, student.problem)
    try:
        source = submission.read(student.path, student.folder)
    except submission.Refused as err:
        return nothing_to_grade(setup.cfg, str(err))
    return grade_fn(source, setup.cfg, setup.config_path, with_training=setup.with_training,
                    exercises=set(setup.exercises) if setup.exercises else None, sandbox=get_sandbox())


def record_failure(out: Path, sid: str, message: str, seconds: float = 0.0, details: str = "") -> Outcome:
    """The grader failed on ``sid``: no results file (a stale one is removed), the reason on file."""
    _unlink(results_path(out, sid))
    reason = " ".join(message.split()) or "unknown error"
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


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ---- the grading processes ----------------------------------------------------------------------------

def open_private_sandbox(setup: Setup, slot: int) -> Sandbox:
    """grade.open_sandbox, hiding as well what is private to the class: the submissions, the out
    folder and the other grading processes' temporary folders (their stages)."""
    others = [s for i, s in enumerate(setup.slots) if i != slot]
    return open_sandbox(setup.cfg, setup.config_path, [*setup.private, *others])


class _SandboxHolder:
    """A grading process's one sandbox: opened when first needed, replaced after a grader failure."""

    def __init__(self, setup: Setup, slot: int):
        self.setup, self.slot, self.current = setup, slot, None

    def get(self) -> Sandbox:
        if self.current is None:
            self.current = open_private_sandbox(self.setup, self.slot)
        return self.current

    def after(self, outcome: Outcome) -> None:
        if outcome.failed:
            self.close()
        elif self.current is not None:  # the next submission must not find this one's file
            for staged in self.current.stage.glob("submission-*"):
                shutil.rmtree(staged, ignore_errors=True)

    def close(self) -> None:
        sandbox, self.current = self.current, None
        if sandbox is None:
            return
        try:
            sandbox.close()
        except BaseException:  # stopped mid-request: end the server the blunt way
            try:
                os.killpg(sandbox.server.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            shutil.rmtree(sandbox.stage, ignore_errors=True)


class _Stopped(BaseException):
    """SIGTERM or SIGINT in a grading process: close the sandbox and exit."""


def _stop(signum, frame) -> None:
    for number in (signal.SIGINT, signal.SIGTERM):  # once: the parent's SIGTERM follows a Ctrl-C
        signal.signal(number, _ignore)
    raise _Stopped


def _ignore(signum, frame) -> None:
    """Not SIG_IGN: a signal already pending when the handler changes would raise an OSError."""


def _examples_as_alone() -> None:
    """Have this process draw the examples that ``ppo-grade FILE`` draws.

    Hypothesis (6.170, pinned) draws some examples from the literals of every *local* module in
    sys.modules (hypothesis.internal.conjecture.providers._get_local_constants): an int literal
    of this module could become an exercise's seed. A single grading has imported
    autograder.cli and neither this module nor a spawn parent's __mp_main__, so the same here.
    """
    import autograder.cli  # noqa: F401

    try:
        from hypothesis.internal.conjecture import providers

        providers._seen_modules.update(id(sys.modules[name]) for name in (__name__, "__mp_main__")
                                       if name in sys.modules)
    except (ImportError, AttributeError):  # another Hypothesis: tests/test_batch.py would tell
        pass


def _serve(conn, setup: Setup, slot: int) -> None:
    """A grading process: students from ``conn``, one after another, until None or EOF."""
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    _examples_as_alone()
    tempfile.tempdir = str(setup.slots[slot])  # this process's stages, hidden from the other sandboxes
    holder = _SandboxHolder(setup, slot)
    try:
        while True:
            student = conn.recv()
            if student is None:
                break
            outcome = grade_student(student, setup, holder.get)
            holder.after(outcome)
            conn.send(outcome)
    except (_Stopped, EOFError, BrokenPipeError):
        pass
    finally:
        holder.close()


@dataclass
class _Process:
    process: multiprocessing.process.BaseProcess
    conn: object
    slot: int
    student: Student | None = None


def _start(ctx, setup: Setup, slot: int) -> _Process:
    ours, theirs = ctx.Pipe()
    process = ctx.Process(target=_serve, args=(theirs, setup, slot), name=f"ppo-grade-{slot}", daemon=True)
    process.start()
    theirs.close()
    return _Process(process, ours, slot)


def _give(p: _Process, queue: deque) -> None:
    if queue:
        p.student = queue.popleft()
        try:
            p.conn.send(p.student)
        except OSError:
            pass  # it died: its sentinel says so


def _collect(p: _Process, setup: Setup) -> Outcome:
    student, p.student = p.student, None
    try:
        if p.conn.poll():
            return p.conn.recv()
    except (EOFError, OSError):
        pass
    p.process.join(5)
    return record_failure(setup.out, student.id, f"the grading process died (exit status {p.process.exitcode})")


def run_pool(todo: list[Student], setup: Setup, jobs: int, on_done: Callable[[Outcome], None]) -> None:
    """Grade ``todo`` in ``jobs`` spawned processes; ``on_done`` gets each outcome as it comes.
    A process that dies costs its current student a grader failure and is replaced."""
    ctx = multiprocessing.get_context("spawn")
    queue = deque(todo)
    procs = [_start(ctx, setup, slot) for slot in range(min(jobs, len(todo)))]
    try:
        for p in procs:
            _give(p, queue)
        while busy := [p for p in procs if p.student is not None]:
            ready = set(wait([p.conn for p in busy] + [p.process.sentinel for p in busy]))
            for p in busy:
                if p.conn in ready or p.process.sentinel in ready:
                    on_done(_collect(p, setup))
                    if not p.process.is_alive() and queue:
                        p.conn.close()
                        procs[procs.index(p)] = p = _start(ctx, setup, p.slot)
                    _give(p, queue)
    except BaseException:
        _stop_all(procs, force=True)
        raise
    _stop_all(procs, force=False)


def _stop_all(procs: list[_Process], force: bool) -> None:
    """Ask each process to finish (None) or, when interrupted, stop it now (SIGTERM: it closes its
    sandbox first); kill what does not exit in time."""
    for p in procs:
        try:
            p.process.terminate() if force else p.conn.send(None)
        except OSError:
            pass
    for p in procs:
        p.process.join(15)
        if p.process.is_alive():
            p.process.kill()
            p.process.join()
        p.conn.close()


@contextmanager
def _slots(jobs: int) -> Iterator[tuple[Path, ...]]:
    """A private temporary folder per grading process (the sandboxes' stages go there)."""
    root = Path(tempfile.mkdtemp(prefix="ppo-batch-"))
    traverse_only = stat.S_IRWXU | stat.S_IXGRP | stat.S_IXOTH  # the user strategy's sandbox user reaches its stage
    try:
        os.chmod(root, traverse_only)
        slots = tuple(root / f"slot-{i}" for i in range(jobs))
        for slot in slots:
            slot.mkdir()
            os.chmod(slot, traverse_only)
        yield slots
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---- resuming ---------------------------------------------------------------------------------------

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
    kept: list[Student]
    stamps: dict[str, list]


def plan(students: list[Student], out: Path, state: dict, key: str, restart: bool) -> Plan:
    """Who needs grading: everyone with ``restart``, else those without a valid results file graded
    from their present files under ``key``."""
    todo, kept, stamps = [], [], {}
    for s in students:
        stamps[s.id] = stamp(s)
        fresh = not restart and state.get(s.id) == {"run": key, "stamp": stamps[s.id]} \
            and read_results(out, s.id) is not None
        (kept if fresh else todo).append(s)
    return Plan(todo, kept, stamps)


# ---- the gradebook ----------------------------------------------------------------------------------

@dataclass
class Row:
    student: str
    status: str
    total: float | None = None
    max_score: float | None = None
    exercises: dict[int, float] = field(default_factory=dict)
    exercise_max: dict[int, float] = field(default_factory=dict)
    checks: dict[tuple[int, str], float] = field(default_factory=dict)
    failed_checks: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class Gradebook:
    exercises: list[int]                 # 0: the training check
    checks: list[tuple[int, str]]
    rows: list[Row]

    def header(self) -> list[str]:
        return ["student", "total", "max", *(exercise_column(n) for n in self.exercises),
                *(f"{n}/{c}" for n, c in self.checks), "status"]

    def table(self) -> list[list[str]]:
        return [[r.student, _num(r.total), _num(r.max_score), *(_num(r.exercises.get(n)) for n in self.exercises),
                 *(_num(r.checks.get(k)) for k in self.checks), r.status] for r in self.rows]


def exercise_column(number: int) -> str:
    return "training" if number == 0 else f"ex{number}"


def columns(exercises: tuple[int, ...] | None, training: bool) -> tuple[list[int], list[tuple[int, str]]]:
    """The exercises and checks of a run, in the grader's order (the training check last)."""
    numbers = sorted(exercises) if exercises else sorted(CHECKS)
    checks = [(n, c.id) for n in numbers for c in CHECKS[n]] + ([(0, "learning")] if training else [])
    return numbers + ([0] if training else []), checks


def build_gradebook(out: Path, ids: list[str], exercises: list[int], checks: list[tuple[int, str]]) -> Gradebook:
    """The gradebook, from the files in ``out`` alone."""
    return Gradebook(exercises, checks, [row_for(out, sid, checks) for sid in sorted(ids)])


def row_for(out: Path, sid: str, checks: list[tuple[int, str]]) -> Row:
    data = read_results(out, sid)
    if data is None:
        try:
            reason = json.loads(failure_path(out, sid).read_text(encoding="utf-8"))["reason"]
            return Row(sid, f"{FAILED}: {reason}")
        except (OSError, ValueError, KeyError, TypeError):
            return Row(sid, "not graded")
    tests = {(t["extra_data"]["exercise"], t["extra_data"]["check"]): t for t in data["tests"]}
    present = [k for k in checks if k in tests]
    # total and max are Part I's; Part II's bonus shows in its own exercise columns (ex6-ex8)
    part_one = [k for k in present if not is_bonus(k[0])]
    row = Row(sid, status_of(data), sum(tests[k]["score"] for k in part_one),
              sum(tests[k]["max_score"] for k in part_one), checks={k: tests[k]["score"] for k in present},
              failed_checks=[k for k in present if tests[k]["status"] == "failed"])
    for number, check in present:
        row.exercises[number] = row.exercises.get(number, 0.0) + tests[number, check]["score"]
        row.exercise_max[number] = row.exercise_max.get(number, 0.0) + tests[number, check]["max_score"]
    return row


def to_csv(book: Gradebook) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(book.header())
    writer.writerows(book.table())
    return buffer.getvalue()


def _num(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def summary_markdown(book: Gradebook, ignored: list[str] = ()) -> str:
    """Class size, mean and median total, per-exercise means, the most-failed checks, the refused
    files and the students the grader failed on."""
    scored = [r for r in book.rows if r.total is not None]
    graded = [r for r in scored if r.status == GRADED]
    failed = [r for r in book.rows if r.status.startswith(FAILED)]
    refused = [r for r in scored if r.status.startswith(REFUSED)]
    lines = ["# Gradebook summary", "",
             f"- Students: {len(book.rows)} (graded {len(graded)}, refused {len(refused)}, grader failed {len(failed)})"]
    if scored:
        out_of = max(r.max_score for r in scored)
        lines.append(f"- Total over the {len(scored)} with a result: mean {statistics.mean(r.total for r in scored):.2f}, "
                     f"median {_num(statistics.median(r.total for r in scored))} (out of {_num(out_of)})")
        lines += ["", "## Per exercise", "", "| column | exercise | mean | max |", "|---|---|---:|---:|"]
        for n in book.exercises:
            mean = statistics.mean(r.exercises.get(n, 0.0) for r in scored)
            top = max(r.exercise_max.get(n, 0.0) for r in scored)
            name = "the learning check" if n == 0 else exercise(n).name
            lines.append(f"| {exercise_column(n)} | {name} | {mean:.2f} | {_num(top)} |")
    lines += _most_failed(book, graded)
    lines += _listing("Refused submissions (0 points, the reason is in their results)", refused)
    lines += _listing("Grader failures (no results file: rerun the same command to retry)", failed)
    if ignored:
        lines += ["", "## Ignored entries (not a student: no .py name, not a folder)", "",
                  *(f"- `{name}`" for name in ignored)]
    return "\n".join(lines) + "\n"


def _most_failed(book: Gradebook, graded: list[Row]) -> list[str]:
    counts = {k: sum(k in r.failed_checks for r in graded) for k in book.checks}
    worst = sorted((k for k in book.checks if counts[k]), key=lambda k: -counts[k])[:MOST_FAILED]
    lines = ["", f"## Most-failed checks (of the {len(graded)} graded submissions)", ""]
    if not worst:
        return lines + ["No check failed."]
    return lines + ["| check | failed |", "|---|---:|", *(f"| {n}/{c} | {counts[n, c]} |" for n, c in worst)]


def _listing(title: str, rows: list[Row]) -> list[str]:
    if not rows:
        return []
    return ["", f"## {title}", "", *(f"- {r.student}: {r.status.split(': ', 1)[-1]}" for r in rows)]


def write_gradebook(out: Path, book: Gradebook, ignored: list[str] = ()) -> tuple[Path, Path]:
    """gradebook.csv and summary.md, each replaced atomically."""
    paths = Path(out) / "gradebook.csv", Path(out) / "summary.md"
    report.write_text_atomic(to_csv(book), paths[0])
    report.write_text_atomic(summary_markdown(book, ignored), paths[1])
    return paths


# ---- a class ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Options:
    submissions: Path
    out: Path
    config_path: Path
    jobs: int | None = None          # default: the cores this process may use
    exercises: tuple[int, ...] | None = None
    with_training: bool = False
    restart: bool = False


class Progress(Protocol):
    def start(self, total: int, kept: int, jobs: int, notes: list[str]) -> None: ...
    def done(self, outcome: Outcome) -> None: ...


class _Silent:
    def start(self, total, kept, jobs, notes):
        pass

    def done(self, outcome):
        pass


@dataclass
class BatchResult:
    gradebook: Gradebook
    graded_now: list[str]      # graded (or refused) in this run
    kept: list[str]            # unchanged since an earlier run
    failed: list[str]          # the grader failed on them (no results file)
    ignored: list[str]
    jobs: int
    strategy: str
    notes: list[str]
    csv_path: Path
    summary_path: Path

    @property
    def exit_code(self) -> int:
        return 1 if any(r.status.startswith(FAILED) for r in self.gradebook.rows) else 0


def grade_class(options: Options, cfg: GradingConfig, progress: Progress = _Silent()) -> BatchResult:
    """Grade every student of ``options.submissions`` who needs it, then write the gradebook.
    Raises BatchError (nothing to grade, a folder that cannot be hidden, another run on the same
    out folder) or GraderFailure (the sandbox cannot keep the class private); KeyboardInterrupt
    leaves every finished result in place."""
    out = Path(options.out)
    found = discover(options.submissions, skip=(out,))
    if not found.students:
        raise BatchError(f"no submissions in {options.submissions}: expected NAME.py files or one folder per student")
    (out / RESULTS).mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        for folder, pattern in [(out, ".gradebook.csv-*"), (out, ".summary.md-*"), (out, ".results-*"),
                                (out / RESULTS, ".results-*"), (out / FAILURES, ".results-*")]:
            for leftover in folder.glob(pattern):  # temporary files of atomic writes cut short
                _unlink(leftover)
        return _grade_and_write(options, cfg, found, progress)


def _grade_and_write(options: Options, cfg: GradingConfig, found: Discovery, progress: Progress) -> BatchResult:
    out, exercises = Path(options.out), tuple(sorted(options.exercises)) if options.exercises else None
    training = options.with_training or cfg.training.enabled
    key, state = run_key(options.config_path, exercises, training, hidden_seed(cfg)[0]), load_state(out)
    todo = plan(found.students, out, state, key, options.restart)
    strategy, jobs, notes = _jobs(cfg, options.jobs, len(todo.todo))
    graded, failed = [], []

    def done(outcome: Outcome) -> None:
        (failed if outcome.failed else graded).append(outcome.student)
        if outcome.failed:
            state.pop(outcome.student, None)
        else:
            state[outcome.student] = {"run": key, "stamp": todo.stamps[outcome.student]}
        save_state(out, state)
        progress.done(outcome)

    with _slots(max(jobs, 1)) as slots:
        setup = Setup(cfg, Path(options.config_path), out, exercises, options.with_training,
                      (Path(options.submissions).resolve(), out.resolve()), slots)
        _preflight(setup, strategy)
        progress.start(len(todo.todo), len(todo.kept), jobs, notes)
        run_pool(todo.todo, setup, jobs, done)
    book = build_gradebook(out, [s.id for s in found.students], *columns(exercises, training))
    csv_path, summary_path = write_gradebook(out, book, found.ignored)
    return BatchResult(book, graded, [s.id for s in todo.kept], failed, found.ignored, jobs, strategy, notes,
                       csv_path, summary_path)


@contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """One run at a time per out folder: two would grade the same students and race on the state."""
    fd = os.open(out / ".lock", os.O_CREAT | os.O_RDWR, stat.S_IRUSR | stat.S_IWUSR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BatchError(f"another ppo-grade is grading into {out}: wait for it to finish") from None
        yield
    finally:
        os.close(fd)


def _jobs(cfg: GradingConfig, asked: int | None, todo: int) -> tuple[str, int, list[str]]:
    """The sandbox strategy and how many grading processes to run, with notes for the TA."""
    w = cfg.worker
    strategy, notes = detect_strategy(w.sandbox, w.sandbox_user), []
    jobs = asked or len(os.sched_getaffinity(0))
    if strategy == "user" and jobs > 1:
        notes.append(f"the user sandbox ends every process of {w.sandbox_user} between workers, so two sandboxes "
                     "would kill each other's workers: grading one student at a time")
        jobs = 1
    if strategy == "process":
        notes.append("sandbox 'process': submissions run as you, unisolated; grade untrusted code as root")
    return strategy, max(0, min(jobs, todo)), notes


def _preflight(setup: Setup, strategy: str) -> None:
    """Refuse before grading anyone if the sandboxes could not hide the class's folders."""
    prefix = Path(sys.prefix).resolve()
    for path in setup.private:
        for inner, what in ((prefix, "the Python environment"), (setup.slots[0], "the temporary folder")):
            if path == inner or path in inner.parents:
                raise BatchError(f"{path} holds {what} ({inner}); the sandbox hides it from submissions, "
                                 "so move the submissions or the out folder elsewhere")
    if strategy == "user":
        check_unreadable(list(setup.private), setup.cfg.worker.sandbox_user)

"""Grade a class: a folder of submissions into per-student results and what a TA acts on.

Outputs in the out folder (README, "Grading a class"):

* ``results/<id>.json``: exactly what ``ppo-grade FILE`` writes (Gradescope's format), one per
  grading (a group submission is graded once);
* ``gradebook.csv``: one row per student, keyed by the real student (a platform's export says
  who: exports.py): total, reason, per exercise its points and status, per check its points
  (UTF-8 with a BOM, for spreadsheets);
* ``grades.csv`` and, from a Canvas class with its gradebook export, ``canvas-import.csv``: the
  grades in the files platforms import (upload.py);
* ``summary.md`` (and ``score-distribution.png`` when matplotlib is importable): the spread,
  per-exercise means, who did not get a normal grading and why, mistakes by kind, every entry
  of the submissions folder that was not graded;
* ``similarity.md`` and ``similarity.csv``: alike pairs and matches of the answer key;
* ``feedback/<student>.md``: what each student sees;
* ``grader-failures/<id>.json`` for students the grader failed on and ``batch-state.json``
  (what each result was graded from, for resuming).

Everything but results/ is rebuilt from the results files on every run, so it never disagrees
with them. The roles live in their own modules, each importing only those before it:
discovery, exports, grading, pool, state, status, gradebook, roster, upload, summary, similarity,
feedback, run.
Nothing here imports the CLI; the CLI imports run.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import stat
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Protocol

from .. import report
from ..config import GradingConfig, hidden_seed
from ..exercises import CHECKS
from ..sandbox import check_unreadable, detect_strategy
from . import exports, feedback, roster as rosters, similarity, summary, upload
from .discovery import Discovery, Notice
from .gradebook import Gradebook, Row, build_gradebook, to_csv
from .grading import FAILED, FAILURES, GRADED, REFUSED, RESULTS, Outcome, Setup, unlink  # noqa: F401 (the CLI reads GRADED, REFUSED)
from .pool import run_pool, slots
from .state import load_state, plan, run_key, save_state

SUMMARY, GRADEBOOK, SIMILARITY_MD, SIMILARITY_CSV = "summary.md", "gradebook.csv", "similarity.md", "similarity.csv"
NO_SUBMISSION = "no submission"
# A Canvas group assignment's file comes under one member's user id: the others are in the
# gradebook export and not in the download.
NO_CANVAS_FILE = "no submission in this download (a group assignment's file comes under one member's user id only)"


class BatchError(RuntimeError):
    """The class cannot be graded as asked (an empty folder, a folder that would hide the grader,
    an export that cannot be read, a roster that does not match, an --only name that is no student)."""


@dataclass(frozen=True)
class Options:
    submissions: Path
    out: Path
    config_path: Path
    jobs: int | None = None          # default: the cores this process may use
    exercises: tuple[int, ...] | None = None
    with_training: bool = False
    restart: bool = False
    only: tuple[str, ...] = ()       # grade exactly these students again (the others are left as they are)
    roster: Path | None = None       # a CSV: id, name, email
    published: bool = False          # feedback/<id>.md with the hidden checks (after publication)
    as_alone: tuple[str, ...] = ()   # modules a single grading imports (pool._examples_as_alone)
    layout: str = "auto"             # exports.LAYOUTS: which platform wrote the submissions folder
    canvas_gradebook: Path | None = None   # Canvas's gradebook export: the roster, and canvas-import.csv's columns
    canvas_assignment: str | None = None   # its column for the grades (title, id or header)
    canvas_bonus_assignment: str | None = None  # its column for Part II's bonus (with bonus == column)
    bonus: str = upload.ADD          # Part II's bonus added to the score, or in a column of its own


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
    kept: list[str]            # unchanged since an earlier run (or left alone by --only)
    failed: list[str]          # the grader failed on them (no results file)
    notices: list[Notice]      # entries not graded, or graded under a bent name
    jobs: int
    strategy: str
    notes: list[str]           # for the TA: the sandbox, stale results left by --only, roster gaps
    csv_path: Path
    summary_path: Path
    similarity: similarity.Similarity
    similarity_path: Path
    feedback_path: Path
    png_path: Path | None = None
    absent: list[str] = field(default_factory=list)  # roster students without a submission
    uploads: list[Path] = field(default_factory=list)  # grades.csv, canvas-import.csv
    upload_notes: list[str] = field(default_factory=list)  # who is not in them, points that differ

    @property
    def ignored(self) -> list[str]:
        return [n.entry for n in self.notices if n.student is None]

    @property
    def exit_code(self) -> int:
        return 1 if any(r.status.startswith(FAILED) for r in self.gradebook.rows) else 0


def grade_class(options: Options, cfg: GradingConfig, progress: Progress = _Silent()) -> BatchResult:
    """Grade every student of ``options.submissions`` who needs it, then write the gradebook.
    Raises BatchError (nothing to grade, an export that cannot be read, a folder that cannot be
    hidden, another run on the same out folder, a roster, Canvas gradebook or --only that does
    not match) or GraderFailure (the sandbox cannot keep the class private); KeyboardInterrupt
    leaves every finished result in place."""
    out = Path(options.out)
    joined = _load_roster(options)
    try:
        found = exports.discover_class(options.submissions, skip=(out,), layout=options.layout,
                                       known=frozenset(joined.roster.students) if joined.roster else frozenset())
    except exports.ExportError as err:
        raise BatchError(str(err)) from None
    if not found.students:
        raise BatchError(f"no submissions in {options.submissions} (read as {exports.SOURCE[found.layout]}): expected "
                         "NAME.py files, one folder per student, or a Gradescope, Canvas or Moodle download")
    only = _only(options.only, found, options.submissions)
    joined = _join(options, joined, found)
    (out / RESULTS).mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        for folder, pattern in [(out, ".gradebook.csv-*"), (out, ".summary.md-*"), (out, ".results-*"),
                                (out, ".similarity.*-*"), (out, ".grades.csv-*"), (out, ".canvas-import.csv-*"),
                                (out / RESULTS, ".results-*"), (out / FAILURES, ".results-*"),
                                (out / feedback.FOLDER, ".*.md-*")]:
            for leftover in folder.glob(pattern):  # temporary files of atomic writes cut short
                unlink(leftover)
        return _grade_and_write(options, cfg, found, joined, only, progress)


def _only(names: tuple[str, ...], found: Discovery, submissions: Path) -> frozenset[str] | None:
    """The gradings --only names: by a student's key or a grading's id (a folder, a file's name)."""
    if not names:
        return None
    by_name = {s.id: s.id for s in found.students} | {p.key: s.id for s in found.students for p in s.persons}
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        keys = sorted({p.key for s in found.students for p in s.persons})
        raise BatchError(f"--only: no student {', '.join(unknown)} in {submissions} (students are named by their "
                         f"key, the gradebook's 'student': {', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''})")
    return frozenset(by_name[n] for n in names)


@dataclass(frozen=True)
class _Joined:
    """The roster (--roster, or Canvas's gradebook export) and what it says of the class."""
    roster: rosters.Roster | None = None
    canvas_columns: tuple[str, str | None] | None = None  # the export's columns for the grades and the bonus
    absent: list[str] = field(default_factory=list)      # its students without a submission
    notes: list[str] = field(default_factory=list)       # for the TA


def _load_roster(options: Options) -> _Joined:
    """The roster and, from a Canvas export, the assignment columns asked for; read before the
    folder (its Canvas user ids settle file names that read two ways) and before anyone is graded."""
    path = options.roster or options.canvas_gradebook
    if path is None:
        return _Joined()
    try:
        roster = rosters.load(path) if options.roster else rosters.load_canvas(path)
        if roster.canvas is None:
            return _Joined(roster)
        if not options.canvas_assignment:
            raise rosters.RosterError(f"--canvas-assignment: which assignment of {path} gets the grades? "
                                      f"(its assignments: {'; '.join(roster.canvas.assignments) or 'none'})")
        bonus = None
        if options.bonus == upload.COLUMN:
            if not options.canvas_bonus_assignment:
                raise rosters.RosterError("--bonus column: give --canvas-bonus-assignment TITLE, the Canvas "
                                          "assignment that gets Part II's bonus")
            bonus = roster.canvas.assignment(options.canvas_bonus_assignment, "--canvas-bonus-assignment")
        return _Joined(roster, (roster.canvas.assignment(options.canvas_assignment, "--canvas-assignment"), bonus))
    except rosters.RosterError as err:
        raise BatchError(str(err)) from None


def _join(options: Options, joined: _Joined, found: Discovery) -> _Joined:
    """The roster checked against the class: its students without a submission, and notes for the TA."""
    keys = [p.key for s in found.students for p in s.persons]
    notes = [] if found.layout == exports.PLAIN else \
        [f"read {options.submissions} as {exports.SOURCE[found.layout]}: {len(keys)} students in "
         f"{len(found.students)} gradings"]
    path = options.roster or options.canvas_gradebook
    if joined.roster is None:
        if found.layout == exports.CANVAS:
            notes.append("give --canvas-gradebook EXPORT.csv --canvas-assignment TITLE (Canvas: Grades, Export) to add "
                         f"names and write {upload.CANVAS_CSV}")
        return replace(joined, notes=notes)
    if options.canvas_gradebook is not None and found.layout != exports.CANVAS:
        raise BatchError(f"--canvas-gradebook joins a Canvas download, and {options.submissions} reads as "
                         f"{exports.SOURCE[found.layout]} (--layout canvas to say it is one)")
    try:
        absent = rosters.check(joined.roster, keys, path)
    except rosters.RosterError as err:
        raise BatchError(str(err)) from None
    unknown = sorted(set(keys) - set(joined.roster.students))
    if unknown:  # a non-strict roster: the file says who it is
        notes.append(f"warning: {len(unknown)} students are not in {path}: {', '.join(unknown)}")
    notes += [f"warning: {key} is in the roster but has no submission" for key in absent]
    return replace(joined, absent=absent, notes=notes)


def _grade_and_write(options: Options, cfg: GradingConfig, found: Discovery, joined: _Joined,
                     only: frozenset[str] | None, progress: Progress) -> BatchResult:
    out, exercises = Path(options.out), tuple(sorted(options.exercises)) if options.exercises else None
    training = options.with_training or cfg.training.enabled
    key, state = run_key(options.config_path, exercises, training, hidden_seed(cfg)[0]), load_state(out)
    todo = plan([s for s in found.students if not s.missing], out, state, key, options.restart, only)
    strategy, jobs, sandbox_notes = _jobs(cfg, options.jobs, len(todo.todo))
    notes = sandbox_notes + joined.notes + [f"warning: {n}" for n in found.notices]
    if todo.stale:
        notes.append(f"--only left {len(todo.stale)} students whose results are missing or older than their files "
                     f"({', '.join(todo.stale[:10])}{', ...' if len(todo.stale) > 10 else ''}): rerun without --only")
    graded, failed = [], []

    def done(outcome: Outcome) -> None:
        (failed if outcome.failed else graded).append(outcome.student)
        if outcome.failed:
            state.pop(outcome.student, None)
        else:
            state[outcome.student] = {"run": key, "stamp": todo.stamps[outcome.student]}
        save_state(out, state)
        progress.done(outcome)

    with slots(max(jobs, 1)) as private_slots:
        setup = Setup(cfg, Path(options.config_path), out, exercises, options.with_training,
                      (Path(options.submissions).resolve(), out.resolve()), private_slots, options.as_alone)
        _preflight(setup, strategy)
        # unchanged: kept and current (--only also keeps the stale ones it was not asked for, named above)
        progress.start(len(todo.todo), len(todo.kept) - len(todo.stale), jobs, notes)
        run_pool(todo.todo, setup, jobs, done)
    return _write_outputs(options, found, joined, exercises, training,
                          dict(graded=graded, kept=[s.id for s in todo.kept], failed=failed, jobs=jobs,
                               strategy=strategy, notes=notes))


def _write_outputs(options: Options, found: Discovery, joined: _Joined, exercises: tuple[int, ...] | None,
                   training: bool, run: dict) -> BatchResult:
    """Everything but results/, rebuilt from the out folder's files."""
    out, roster, absent = Path(options.out), joined.roster, joined.absent
    columns = [*found.columns, *(c for c in (roster.columns if roster else []) if c not in found.columns)]
    book = build_gradebook(out, found.students, fallback_columns(exercises, training),
                           roster.students if roster else None, columns, found.sid_column)
    why = NO_CANVAS_FILE if found.layout == exports.CANVAS else NO_SUBMISSION
    book.rows += [Row(key, NO_SUBMISSION, reason=why, extra={**exports.key_fields(found.layout, key),
                                                             **{k: v for k, v in roster.students[key].items() if v}})
                  for key in absent]
    book.rows.sort(key=lambda r: r.student)
    csv_path, summary_path = out / GRADEBOOK, out / SUMMARY
    report.write_text_atomic(to_csv(book), csv_path)
    uploads, upload_lines, upload_notes = _write_uploads(options, book, joined)
    png_path = out / summary.HISTOGRAM_PNG
    scored = [r.total for r in book.rows if r.total is not None]
    drawn = bool(scored) and summary.write_png(summary.histogram(scored, book.out_of), png_path)
    if not drawn:
        unlink(png_path)
    source = "" if found.layout == exports.PLAIN else exports.SOURCE[found.layout]
    report.write_text_atomic(summary.summary_markdown(book, found.notices, png_path.name if drawn else None, absent,
                                                      source, upload_lines), summary_path)
    gradings = [s for s in found.students if not s.missing]
    similar = similarity.report(gradings, _module_file("assignment.exercises"), _module_file("solutions.exercises"))
    titles = {r.student: summary.label(r) for r in book.rows}  # the key, and the name the platform or roster gives
    named = similarity.relabeled(similar, {s.id: " + ".join(titles[p.key] for p in s.persons) for s in gradings})
    report.write_text_atomic(similarity.to_markdown(named), out / SIMILARITY_MD)
    keyed = {s.id: "+".join(p.key for p in s.persons) for s in gradings}
    report.write_text_atomic(similarity.to_csv(similarity.relabeled(similar, keyed)), out / SIMILARITY_CSV)
    # a missing submission has no feedback, whatever results file an earlier run left
    feedback_path = feedback.write(out, [(p.key, None if s.missing else s.id, titles[p.key])
                                         for s in found.students for p in s.persons], options.published)
    return BatchResult(book, run["graded"], run["kept"], run["failed"], found.notices, run["jobs"], run["strategy"],
                       run["notes"], csv_path, summary_path, named, out / SIMILARITY_MD,
                       feedback_path, png_path if drawn else None, absent, uploads, upload_notes)


def _write_uploads(options: Options, book: Gradebook, joined: _Joined) -> tuple[list[Path], list[str], list[str]]:
    """grades.csv, and canvas-import.csv when Canvas's gradebook export was given; the summary's
    lines on them, and the notes among those the TA must read (who is left out, points that differ)."""
    out = Path(options.out)
    report.write_text_atomic(upload.grades_csv(book, options.bonus), out / upload.GRADES_CSV)
    written = [out / upload.GRADES_CSV]
    bonus = "Part I's total, the bonus in its own column" if options.bonus == upload.COLUMN else \
        "Part I's total plus Part II's bonus"
    rows, left = upload.uploadable(book)
    lines, notes = [f"`{upload.GRADES_CSV}`: {len(rows)} students, score = {bonus}"], []
    if joined.canvas_columns is not None:
        assignment, bonus_column = joined.canvas_columns
        text, notes = upload.canvas_csv(book, joined.roster.canvas, assignment, bonus_column, options.bonus)
        report.write_text_atomic(text, out / upload.CANVAS_CSV)
        written.append(out / upload.CANVAS_CSV)
        lines.append(f"`{upload.CANVAS_CSV}`: for Canvas's Grades, Import")
    files = " or ".join(p.name for p in written)
    notes += [f"not in {files}: {why}: {', '.join(keys)}" for why, keys in left.items()]
    return written, lines + notes, notes


def fallback_columns(exercises: tuple[int, ...] | None, training: bool) -> tuple[list[int], list[tuple[int, str]]]:
    """The exercises and checks of a run when no results file says (every grading failed)."""
    numbers = sorted(exercises) if exercises else sorted(CHECKS)
    checks = [(n, c.id) for n in numbers for c in CHECKS[n]] + ([(0, "learning")] if training else [])
    return numbers + ([0] if training else []), checks


def _module_file(name: str) -> Path:
    """A module's file, found without importing it (the starter and the key are compared as text)."""
    return Path(importlib.util.find_spec(name).origin)


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

"""Grade a class: a folder of submissions into per-student results and what a TA acts on.

Outputs in the out folder (README, "Grading a class"):

* ``results/<id>.json``: exactly what ``ppo-grade FILE`` writes (Gradescope's format);
* ``gradebook.csv``: one row per student: total, reason, per exercise its points and status,
  per check its points (UTF-8 with a BOM, for spreadsheets);
* ``summary.md`` (and ``score-distribution.png`` when matplotlib is importable): the spread,
  per-exercise means, who did not get a normal grading and why, mistakes by kind, every entry
  of the submissions folder that was not graded;
* ``similarity.md`` and ``similarity.csv``: alike pairs and matches of the answer key;
* ``feedback/<id>.md``: what each student sees;
* ``grader-failures/<id>.json`` for students the grader failed on and ``batch-state.json``
  (what each result was graded from, for resuming).

Everything but results/ is rebuilt from the results files on every run, so it never disagrees
with them. The roles live in their own modules, each importing only those before it:
discovery, grading, pool, state, status, gradebook, roster, summary, similarity, feedback, run.
Nothing here imports the CLI; the CLI imports run.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import stat
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

from .. import report
from ..config import GradingConfig, hidden_seed
from ..exercises import CHECKS
from ..sandbox import check_unreadable, detect_strategy
from . import feedback, roster as rosters, similarity, summary
from .discovery import Discovery, Notice, discover
from .gradebook import Gradebook, Row, build_gradebook, to_csv
from .grading import FAILED, FAILURES, GRADED, REFUSED, RESULTS, Outcome, Setup, unlink  # noqa: F401 (the CLI reads GRADED, REFUSED)
from .pool import run_pool, slots
from .state import load_state, plan, run_key, save_state, stale

SUMMARY, GRADEBOOK, SIMILARITY_MD, SIMILARITY_CSV = "summary.md", "gradebook.csv", "similarity.md", "similarity.csv"
NO_SUBMISSION = "no submission"


class BatchError(RuntimeError):
    """The class cannot be graded as asked (an empty folder, a folder that would hide the grader,
    a roster that does not match, an --only name that is no student)."""


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

    @property
    def ignored(self) -> list[str]:
        return [n.entry for n in self.notices if n.student is None]

    @property
    def exit_code(self) -> int:
        return 1 if any(r.status.startswith(FAILED) for r in self.gradebook.rows) else 0


def grade_class(options: Options, cfg: GradingConfig, progress: Progress = _Silent()) -> BatchResult:
    """Grade every student of ``options.submissions`` who needs it, then write the gradebook.
    Raises BatchError (nothing to grade, a folder that cannot be hidden, another run on the same
    out folder, a roster or --only that does not match) or GraderFailure (the sandbox cannot
    keep the class private); KeyboardInterrupt leaves every finished result in place."""
    out = Path(options.out)
    found = discover(options.submissions, skip=(out,))
    if not found.students:
        raise BatchError(f"no submissions in {options.submissions}: expected NAME.py files or one folder per student")
    ids = [s.id for s in found.students]
    unknown = sorted(set(options.only) - set(ids))
    if unknown:
        raise BatchError(f"--only: no student {', '.join(unknown)} in {options.submissions} "
                         f"(students are named by their file or folder: {', '.join(ids[:8])}{', ...' if len(ids) > 8 else ''})")
    roster = None
    if options.roster is not None:
        try:
            roster = rosters.load(options.roster)
            rosters.check(roster, ids, options.roster)
        except rosters.RosterError as err:
            raise BatchError(str(err)) from None
    (out / RESULTS).mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        for folder, pattern in [(out, ".gradebook.csv-*"), (out, ".summary.md-*"), (out, ".results-*"),
                                (out, ".similarity.*-*"), (out / RESULTS, ".results-*"),
                                (out / FAILURES, ".results-*"), (out / feedback.FOLDER, ".*.md-*")]:
            for leftover in folder.glob(pattern):  # temporary files of atomic writes cut short
                unlink(leftover)
        return _grade_and_write(options, cfg, found, roster, progress)


def _grade_and_write(options: Options, cfg: GradingConfig, found: Discovery, roster: rosters.Roster | None,
                     progress: Progress) -> BatchResult:
    out, exercises = Path(options.out), tuple(sorted(options.exercises)) if options.exercises else None
    training = options.with_training or cfg.training.enabled
    key, state = run_key(options.config_path, exercises, training, hidden_seed(cfg)[0]), load_state(out)
    only = frozenset(options.only) if options.only else None
    todo = plan(found.students, out, state, key, options.restart, only)
    strategy, jobs, notes = _jobs(cfg, options.jobs, len(todo.todo))
    notes += [f"warning: {n}" for n in found.notices]
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
        if only is not None:
            left = stale([s for s in found.students if s.id not in only], out, state, key, todo.stamps)
            if left:
                notes.append(f"--only left {len(left)} students whose results are missing or older than their files "
                             f"({', '.join(left[:10])}{', ...' if len(left) > 10 else ''}): rerun without --only")
        absent = rosters.check(roster, [s.id for s in found.students], options.roster) if roster else []
        notes += [f"warning: {sid} is in the roster but has no submission" for sid in absent]
        progress.start(len(todo.todo), len(todo.kept), jobs, notes)
        run_pool(todo.todo, setup, jobs, done)
    return _write_outputs(options, found, roster, absent, exercises, training,
                          dict(graded=graded, kept=[s.id for s in todo.kept], failed=failed, jobs=jobs,
                               strategy=strategy, notes=notes))


def _write_outputs(options: Options, found: Discovery, roster: rosters.Roster | None, absent: list[str],
                   exercises: tuple[int, ...] | None, training: bool, run: dict) -> BatchResult:
    """Everything but results/, rebuilt from the out folder's files."""
    out, ids = Path(options.out), [s.id for s in found.students]
    book = build_gradebook(out, ids, fallback_columns(exercises, training),
                           roster.students if roster else None, roster.columns if roster else [])
    book.rows += [Row(sid, NO_SUBMISSION, reason=NO_SUBMISSION, extra=dict(roster.students[sid])) for sid in absent]
    book.rows.sort(key=lambda r: r.student)
    csv_path, summary_path = out / GRADEBOOK, out / SUMMARY
    report.write_text_atomic(to_csv(book), csv_path)
    png_path = out / summary.HISTOGRAM_PNG
    scored = [r.total for r in book.rows if r.total is not None]
    drawn = bool(scored) and summary.write_png(
        summary.histogram(scored, max(r.max_score for r in book.rows if r.max_score is not None)), png_path)
    if not drawn:
        unlink(png_path)
    report.write_text_atomic(summary.summary_markdown(book, found.notices, png_path.name if drawn else None, absent),
                             summary_path)
    similar = similarity.report(found.students, _module_file("assignment.exercises"),
                                _module_file("solutions.exercises"))
    report.write_text_atomic(similarity.to_markdown(similar), out / SIMILARITY_MD)
    report.write_text_atomic(similarity.to_csv(similar), out / SIMILARITY_CSV)
    feedback_path = feedback.write(out, ids, options.published)
    return BatchResult(book, run["graded"], run["kept"], run["failed"], found.notices, run["jobs"], run["strategy"],
                       run["notes"], csv_path, summary_path, similar, out / SIMILARITY_MD, feedback_path,
                       png_path if drawn else None, absent)


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

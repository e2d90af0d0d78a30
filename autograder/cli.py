"""``ppo-grade``: grade one submission, print the report, write Gradescope's results.json.

Exit status: 0 whenever grading completed, whatever the score; 1 when the grader itself
failed (a results.json with 0 points and the reason is written even then); 2 for bad usage.
The grader's own log (staff notes, failures) goes to stderr, which Gradescope shows to
instructors only.

Given a folder of submissions and ``--out`` (autograder/classroom/), it grades a whole class:
per-student results.json, gradebook.csv, summary.md, similarity.md/.csv and feedback/; exit
status 1 if the grader failed on any student (the others are kept; rerun the same command to
retry them), 130 when interrupted. This module imports the classroom package, never the reverse.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import statistics
import sys
import traceback
from pathlib import Path

from . import __version__

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "grading.yaml"
# 130, as a shell reports Ctrl-C. Not a literal: Hypothesis draws examples from the int literals of
# the grader's modules (see classroom/pool._examples_as_alone), and a new one would change every grading's.
EXIT_INTERRUPTED = 2 ** 7 + signal.SIGINT


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ppo-grade", description="Grade a PPO exercises submission (one .py file), "
                                "or a class: a folder of submissions with --out.")
    p.add_argument("submission", type=Path,
                   help="the student's exercises.py, or a folder with one NAME.py or NAME/exercises.py per student")
    p.add_argument("--results", type=Path, default=None,
                   help="where to write Gradescope's results.json (default: results.json)")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="grading.yaml (default: the packaged one)")
    p.add_argument("--submission-folder", type=Path, default=None,
                   help="the folder the submission must lie in once links are resolved (default: its own folder)")
    p.add_argument("--exercise", type=int, action="append", choices=range(1, 9), metavar="N",
                   help="grade only exercise N (repeatable; default: all: 1-5, and 6-8 as bonus)")
    p.add_argument("--with-training", action="store_true", help="add the CPU learning check (exercise 0)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--version", action="version", version=f"ppo-grade {__version__}")
    batch = p.add_argument_group("a class (SUBMISSION is a folder)")
    batch.add_argument("--out", type=Path, default=None,
                       help="the gradebook folder: results/, gradebook.csv, summary.md, similarity.md, feedback/")
    batch.add_argument("--jobs", type=int, default=None, metavar="N",
                       help="grading processes, each with its own sandbox (default: the number of cores)")
    batch.add_argument("--restart", action="store_true",
                       help="grade everyone again (default: skip students graded from their present files)")
    batch.add_argument("--only", nargs="+", default=None, metavar="NAME",
                       help="grade exactly these students again (even if graded) and rebuild the gradebook")
    batch.add_argument("--roster", type=Path, default=None, metavar="CSV",
                       help="a CSV with columns id, name, email: adds name and email to the gradebook")
    batch.add_argument("--published", action="store_true",
                       help="feedback/<student>.md shows the hidden checks too (the view after grades are published)")
    batch.add_argument("--layout", choices=("auto", "plain", "gradescope", "canvas", "moodle"), default="auto",
                       help="who wrote the folder: recognised by default (Gradescope's Export Submissions, Canvas's or "
                            "Moodle's Download Submissions, or NAME.py / NAME/ per student)")
    batch.add_argument("--canvas-gradebook", type=Path, default=None, metavar="CSV",
                       help="Canvas's gradebook export (Grades, Export): names the students of a Canvas download and "
                            "makes canvas-import.csv")
    batch.add_argument("--canvas-assignment", default=None, metavar="TITLE",
                       help="the assignment of the Canvas gradebook that gets the grades (its title or id)")
    batch.add_argument("--canvas-bonus-assignment", default=None, metavar="TITLE",
                       help="the Canvas assignment that gets Part II's bonus (implies --bonus column)")
    batch.add_argument("--bonus", choices=("add", "column"), default=None,
                       help="Part II's bonus in the uploaded grades: added to the score (default) or a column of its own")
    return p


def run() -> None:
    """The command (``ppo-grade``, ``python -m autograder``): main(), then the process ends at once.
    Python's own shutdown takes half a second with torch imported, and by then everything is
    written, flushed and closed; only the exit handlers (logging's, multiprocessing's) still run."""
    code = main()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if _is_class(args, parser):
        return _main_class(args)
    args.results = args.results or Path("results.json")
    # imports here so that --help and usage errors answer fast
    from . import config, submission
    from .sandbox import GraderFailure, open_sandbox

    extra = {"grader_version": __version__}
    sandbox = None
    try:
        # The checks' names wait for the exercises' modules (torch): first the fork server starts,
        # so that it imports torch while this process does.
        cfg = config.load(args.config, None)
        try:
            source = submission.read(args.submission, args.submission_folder)
        except submission.Refused as err:
            source, refused = None, str(err)
        if source is not None:
            sandbox = open_sandbox(cfg, args.config)
        from . import grade, report
        from .exercises import CHECK_IDS

        config.check_names(cfg, CHECK_IDS, args.config)
        if source is None:
            result = grade.nothing_to_grade(cfg, refused)
        else:
            result = grade.grade(source, cfg, args.config, with_training=args.with_training,
                                 exercises=set(args.exercise) if args.exercise else None, sandbox=sandbox)
    except (GraderFailure, config.ConfigError) as err:  # ConfigError: also a malformed hidden seed
        return _grader_failed(str(err), extra, args.results)
    except Exception as err:  # a bug of the grader's own: say so, give 0, exit non-zero
        traceback.print_exc(file=sys.stderr)
        return _grader_failed(f"{type(err).__name__}: {err}", extra, args.results)
    finally:
        if sandbox is not None:
            sandbox.close()
    print(report.summary(result) if args.quiet else report.terminal(result))
    sys.stdout.flush()  # the staff notes come after the student's report, never before it
    for line in result.log + result.staff_notes:
        print(f"ppo-grade: note for course staff (students can ignore it): {line}", file=sys.stderr)
    report.write_json_atomic(report.to_gradescope(result), args.results)
    return 0


def _is_class(args: argparse.Namespace, parser: argparse.ArgumentParser) -> bool:
    """A folder of submissions (a class) rather than one file. A folder given with --results or
    --submission-folder is one student's unreadable upload: graded 0 as before."""
    folder = args.submission.is_dir() and not args.submission.is_symlink()
    single = args.results is not None or args.submission_folder is not None
    if args.out is None and (single or not folder):
        if args.jobs is not None or args.restart or args.only or args.roster or args.published or \
                args.layout != "auto" or args.canvas_gradebook or args.canvas_assignment or \
                args.canvas_bonus_assignment or args.bonus:
            parser.error("--jobs, --restart, --only, --roster, --published, --layout, --canvas-* and --bonus grade a "
                         "class: give a folder of submissions and --out")
        return False
    if single:
        parser.error("--results and --submission-folder grade one file; a class takes --out")
    if not folder:
        parser.error(f"--out grades a class: {args.submission} is not a folder of submissions")
    if args.out is None:
        parser.error(f"{args.submission} is a folder: give --out DIR for the class's gradebook")
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.only and args.restart:
        parser.error("--only grades the students named, --restart everyone: give one of them")
    if args.roster and args.canvas_gradebook:
        parser.error("--canvas-gradebook is the roster of a Canvas class: give it or --roster, not both")
    if (args.canvas_assignment or args.canvas_bonus_assignment) and not args.canvas_gradebook:
        parser.error("--canvas-assignment and --canvas-bonus-assignment name columns of --canvas-gradebook: give it")
    if args.canvas_bonus_assignment and args.bonus == "add":
        parser.error("--canvas-bonus-assignment puts the bonus in a column of its own, --bonus add into the score: "
                     "give one of them")
    args.bonus = args.bonus or ("column" if args.canvas_bonus_assignment else "add")
    return True


def _main_class(args: argparse.Namespace) -> int:
    from . import config
    from .classroom import run as batch
    from .exercises import CHECK_IDS
    from .sandbox import GraderFailure

    try:
        cfg = config.load(args.config, CHECK_IDS)
    except config.ConfigError as err:
        print(f"ppo-grade: the grader failed: {err}", file=sys.stderr)
        return 1
    # as_alone: this module, which a single grading runs under (classroom/pool.py says why)
    options = batch.Options(args.submission, args.out, args.config, args.jobs,
                            tuple(args.exercise) if args.exercise else None, args.with_training, args.restart,
                            tuple(args.only or ()), args.roster, args.published,
                            as_alone=(__spec__.name if __spec__ else __name__,), layout=args.layout,
                            canvas_gradebook=args.canvas_gradebook, canvas_assignment=args.canvas_assignment,
                            canvas_bonus_assignment=args.canvas_bonus_assignment, bonus=args.bonus)
    progress = _Progress()
    try:
        result = batch.grade_class(options, cfg, progress)
    except KeyboardInterrupt:
        progress.close()
        print(f"ppo-grade: interrupted after {progress.finished} students; what they got is kept in {args.out}: "
              "rerun the same command to grade the rest", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (batch.BatchError, GraderFailure, config.ConfigError) as err:  # ConfigError: a malformed hidden seed
        progress.close()
        print(f"ppo-grade: {err}", file=sys.stderr)
        return 1
    progress.close()
    print(_class_report(result, batch, args.quiet))
    return result.exit_code


class _Progress:
    """A tqdm bar on stderr; grader failures and the grader's log lines above it, each once."""

    def __init__(self):
        self.bar, self.seen, self.finished = None, set(), 0

    def start(self, total: int, kept: int, jobs: int, notes: list[str]) -> None:
        from tqdm import tqdm

        for note in notes:
            print(f"ppo-grade: {note}", file=sys.stderr)
        if kept:
            print(f"ppo-grade: {kept} students unchanged since the last run are kept (--restart grades them again)",
                  file=sys.stderr)
        if total:
            self.bar = tqdm(total=total, desc=f"grading ({jobs} at a time)", unit="student", file=sys.stderr,
                            dynamic_ncols=True)

    def done(self, outcome) -> None:
        self.finished += 1
        lines = []
        if outcome.failed:
            lines.append(f"the grader failed on {outcome.student}: {outcome.status.split(': ', 1)[-1]}")
        elif outcome.status == "graded":  # a refused file's log is its reason, listed in the summary
            lines += [line for line in outcome.log if line not in self.seen]
            self.seen.update(outcome.log)
        for line in lines:
            (self.bar.write if self.bar else print)(f"ppo-grade: {line}", file=sys.stderr)
        if self.bar:
            shown = f"{outcome.score:g}/{outcome.max_score:g}" if outcome.score is not None else outcome.status[:40]
            self.bar.set_postfix_str(f"{outcome.student}: {shown}", refresh=False)
            self.bar.update()

    def close(self) -> None:
        if self.bar:
            self.bar.close()
            self.bar = None


def _class_report(result, batch, quiet: bool) -> str:
    rows = result.gradebook.rows
    scored = [r.total for r in rows if r.total is not None]
    counts = {k: sum(r.status.startswith(k) for r in rows) for k in (batch.GRADED, batch.REFUSED, batch.FAILED)}
    lines = [f"{len(rows)} students: {counts[batch.GRADED]} graded, {counts[batch.REFUSED]} refused, "
             f"{counts[batch.FAILED]} grader failed ({len(result.graded_now) + len(result.failed)} this run"
             + (f", {result.jobs} at a time in sandbox {result.strategy}" if result.jobs else "")
             + f"; {len(result.kept)} kept from an earlier run)"]
    if scored:
        book = result.gradebook
        bonus = f"; Part II's bonus adds up to {book.bonus_out_of:g}" if book.bonus_out_of is not None else ""
        lines.append(f"total: mean {sum(scored) / len(scored):.2f}, median {statistics.median(scored):g} "
                     f"(out of {book.out_of:g}{bonus})")
    unusual = [r for r in rows if r.reason]
    if unusual:
        lines.append(f"without a normal grading: {len(unusual)} ({', '.join(r.student for r in unusual[:8])}"
                     f"{', ...' if len(unusual) > 8 else ''}): their reasons are in the summary and the CSV")
    similar = result.similarity
    if similar.missing:
        lines.append(f"similarity: not compared: {similar.missing}")
    else:
        lines.append(f"similarity: {len(similar.key)} students match the answer key, {len(similar.pairs)} pairs alike")
    lines += [f"warning: {note}" for note in result.upload_notes]
    if not quiet:
        lines += [f"gradebook:  {result.csv_path}", f"summary:    {result.summary_path}",
                  f"similarity: {result.similarity_path}", f"feedback:   {result.feedback_path}/<student>.md",
                  f"results:    {result.csv_path.parent / batch.RESULTS}/<grading>.json",
                  *(f"upload:     {path}" for path in result.uploads)]
    if counts[batch.FAILED]:
        lines.append(f"the grader failed on {counts[batch.FAILED]} students (see the summary): rerun to retry them")
    return "\n".join(lines)


def _grader_failed(message: str, extra: dict, results: Path) -> int:
    from . import report

    print(f"ppo-grade: the grader failed: {message}", file=sys.stderr)
    report.write_json_atomic(report.failure_results(message, extra), results)
    return 1


if __name__ == "__main__":
    run()

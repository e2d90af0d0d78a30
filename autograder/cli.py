"""``ppo-grade``: grade one submission, print the report, write Gradescope's results.json.

Exit status: 0 whenever grading completed, whatever the score; 1 when the grader itself
failed (a results.json with 0 points and the reason is written even then); 2 for bad usage.
The grader's own log (staff notes, failures) goes to stderr, which Gradescope shows to
instructors only.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from . import __version__

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "grading.yaml"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ppo-grade", description="Grade a PPO exercises submission (one .py file).")
    p.add_argument("submission", type=Path, help="the student's exercises.py")
    p.add_argument("--results", type=Path, default=Path("results.json"), help="where to write Gradescope's results.json")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="grading.yaml (default: the packaged one)")
    p.add_argument("--submission-folder", type=Path, default=None,
                   help="the folder the submission must lie in once links are resolved (default: its own folder)")
    p.add_argument("--exercise", type=int, action="append", choices=range(1, 6), metavar="N",
                   help="grade only exercise N (repeatable; default: all five)")
    p.add_argument("--with-training", action="store_true", help="add the CPU learning check (exercise 0)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--version", action="version", version=f"ppo-grade {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # imports here so that --help and usage errors answer fast
    from . import config, grade, report, submission
    from .exercises import CHECK_IDS
    from .sandbox import GraderFailure

    extra = {"grader_version": __version__}
    try:
        cfg = config.load(args.config, CHECK_IDS)
    except config.ConfigError as err:
        return _grader_failed(str(err), extra, args.results, report)
    try:
        source = submission.read(args.submission, args.submission_folder)
    except submission.Refused as err:
        result = grade.nothing_to_grade(cfg, str(err))
    else:
        try:
            result = grade.grade(source, cfg, args.config, with_training=args.with_training,
                                 exercises=set(args.exercise) if args.exercise else None)
        except GraderFailure as err:
            return _grader_failed(str(err), extra, args.results, report)
        except Exception as err:  # a bug of the grader's own: say so, give 0, exit non-zero
            traceback.print_exc(file=sys.stderr)
            return _grader_failed(f"{type(err).__name__}: {err}", extra, args.results, report)
    for line in result.log:
        print(f"ppo-grade: {line}", file=sys.stderr)
    print(report.summary(result) if args.quiet else report.terminal(result))
    report.write_json_atomic(report.to_gradescope(result), args.results)
    return 0


def _grader_failed(message: str, extra: dict, results: Path, report) -> int:
    print(f"ppo-grade: the grader failed: {message}", file=sys.stderr)
    report.write_json_atomic(report.failure_results(message, extra), results)
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""``ppo-grade``: grade one submission, print the report, write Gradescope's results.json.

Exit status: 0 whenever grading completed, whatever the score; 1 when the grader itself
failed (a results.json with 0 points and the reason is written even then); 2 for bad usage.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from . import __version__

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "grading.yaml"
MAX_SUBMISSION_BYTES = 1 << 20


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ppo-grade", description="Grade a PPO exercises submission (one .py file).")
    p.add_argument("submission", type=Path, help="the student's exercises.py")
    p.add_argument("--results", type=Path, default=Path("results.json"), help="where to write Gradescope's results.json")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="grading.yaml (default: the packaged one)")
    p.add_argument("--exercise", type=int, action="append", choices=range(1, 6), metavar="N",
                   help="grade only exercise N (repeatable; default: all five)")
    p.add_argument("--with-training", action="store_true", help="add the CPU learning check (exercise 0)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--version", action="version", version=f"ppo-grade {__version__}")
    return p


def _check_submission(path: Path) -> str | None:
    """Why ``path`` cannot be graded at all, or None. These are the student's problems: 0 points."""
    if not path.is_file():
        return f"no file at {path}: submit your assignment/exercises.py"
    if path.stat().st_size > MAX_SUBMISSION_BYTES:
        return f"{path.name} is larger than {MAX_SUBMISSION_BYTES // 1024} KiB; submit only exercises.py"
    try:
        path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return f"{path.name} is not UTF-8 text: submit the Python file itself"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # imports here so that --help and usage errors answer fast
    from . import checks, config, grade, report

    extra = {"grader_version": __version__}
    try:
        cfg = config.load(args.config, checks.CHECK_IDS)
    except config.ConfigError as err:
        print(f"ppo-grade: {err}", file=sys.stderr)
        report.write_json_atomic(report.failure_results(str(err), extra), args.results)
        return 1
    problem = _check_submission(args.submission)
    if problem:
        result = grade.nothing_to_grade(cfg, problem)
    else:
        try:
            result = grade.grade(args.submission.resolve(), cfg, args.config, with_training=args.with_training,
                                 exercises=set(args.exercise) if args.exercise else None)
        except Exception as err:  # the grader's own failure: say so, give 0, exit non-zero
            traceback.print_exc(file=sys.stderr)
            report.write_json_atomic(report.failure_results(f"{type(err).__name__}: {err}", extra), args.results)
            return 1
    print(report.summary(result) if args.quiet else report.terminal(result))
    report.write_json_atomic(report.to_gradescope(result), args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

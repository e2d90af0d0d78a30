"""``ppo-course``: staff tooling. The CLI only parses arguments and prints; the work is in
the modules it calls."""

from __future__ import annotations

import argparse
import sys

from pathlib import Path

from course import release, stubs


def _stubs(args: argparse.Namespace) -> int:
    try:
        if args.check:
            if stubs.is_fresh():
                print(f"{stubs.STUDENT_PATH.relative_to(stubs.ROOT)} is up to date with the solution.")
                return 0
            print(f"{stubs.STUDENT_PATH.relative_to(stubs.ROOT)} is stale: run `ppo-course stubs` and commit it.",
                  file=sys.stderr)
            return 1
        path = stubs.write()
    except stubs.StubError as err:
        print(f"ppo-course stubs: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path.relative_to(stubs.ROOT)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    """Grade the reference solution and the blank assignment; show both reports."""
    from autograder import config, report
    from autograder.exercises import CHECK_IDS
    from autograder.grade import grade

    cfg = config.load(args.config, CHECK_IDS)
    for title, path in (("the reference solution", stubs.SOLUTION_PATH), ("the blank assignment", stubs.STUDENT_PATH)):
        print(f"=== Grading {title}: {path.relative_to(stubs.ROOT)}\n")
        print(report.terminal(grade(path.read_text(), cfg, args.config)) + "\n")
    return 0


def _release(args: argparse.Namespace) -> int:
    try:
        out = release.build_student_release(args.out)
    except (stubs.StubError, release.LeakError, release.LinkError) as err:
        print(f"ppo-course release: {err}", file=sys.stderr)
        return 1
    print(f"wrote the student release to {out} (checked: no solution line in it, no broken link)")
    return 0


def _gradescope(args: argparse.Namespace) -> int:
    print(f"wrote {release.build_gradescope_zip(args.out)}: upload it as the Gradescope autograder")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppo-course", description="Course staff tooling for the PPO assignment.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("stubs", help="generate assignment/exercises.py from the solution's markers")
    p.add_argument("--check", action="store_true", help="only check that the committed copy is fresh")
    p.set_defaults(func=_stubs)
    p = sub.add_parser("demo", help="grade the solution and the blank assignment, show both reports")
    p.add_argument("--config", type=Path, default=stubs.ROOT / "grading.yaml")
    p.set_defaults(func=_demo)
    p = sub.add_parser("release", help="build the student release folder (checked for solution leaks)")
    p.add_argument("out", type=Path, help="folder to create (replaced if it exists)")
    p.set_defaults(func=_release)
    p = sub.add_parser("gradescope", help="build the Gradescope autograder zip")
    p.add_argument("out", type=Path, help="the .zip to write")
    p.set_defaults(func=_gradescope)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

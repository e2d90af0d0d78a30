"""``ppo-course``: staff tooling. The CLI only parses arguments and prints; the work is in
the modules it calls."""

from __future__ import annotations

import argparse
import sys

from solutions import stubs


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppo-course", description="Course staff tooling for the PPO assignment.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("stubs", help="generate assignment/exercises.py from the solution's markers")
    p.add_argument("--check", action="store_true", help="only check that the committed copy is fresh")
    p.set_defaults(func=_stubs)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: whether the messages a student gets name the mistake that was made, and only that one.

    python benchmarks/messages.py [--quick] [--only NAME ...] [--out reports/messages.md]

Every mutant of the corpus (tests/corpus.py, Part I's and Part II's: one realistic mistake each, in
an otherwise correct file) goes through the two channels a student meets: the public tests
(``pytest tests/public --impl FILE``, every failing test's message) and the grader (its exercise,
grading.yaml as shipped, the feedback of every failing visible check). A mutant's ``hint`` is the
phrase that names its mistake; the phrases of the other mutants name theirs. Per channel, each
mutant is

    silent      nothing fails (the public tests pass; the grader gives full marks)
    named       some message holds its own phrase
    misleading  some message holds another mistake's phrase and not its own (a mutant can be named
                by one message and misled by another)
    unnamed     it fails, and no message names any mistake

and each such message is a misleading message. corpus.REPORTED lists the cases found reported as
another mistake, or not at all, and the channel where each must now be named. --quick grades with
12 examples per check (as the tests do) instead of grading.yaml's. --out writes the table as
Markdown, with the command, the commit and the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import corpus  # noqa: E402  (tests/corpus.py)

@dataclasses.dataclass
class Verdict:
    """What one channel said about one mutant: its failing messages and what they name."""

    messages: list[str]
    variant: corpus.Variant

    @property
    def silent(self) -> bool:
        return not self.messages

    @property
    def named(self) -> bool:
        return bool(self.variant.hint) and any(self.variant.hint in m for m in self.messages)

    @property
    def misleading(self) -> list[str]:
        """The messages that name another mistake and not this one (corpus.misled)."""
        return [m for m in self.messages if corpus.misled(self.variant, m)]

    def label(self) -> str:
        if self.silent:
            return "silent"
        words = (["named"] if self.named else []) + ([f"misleading x{len(self.misleading)}"] if self.misleading else [])
        return ", ".join(words) or "unnamed"


class _Failures:
    """pytest plugin: the message of every failing test (its assertion's text, or the exception)."""

    def __init__(self):
        self.messages: list[str] = []

    def pytest_runtest_logreport(self, report):
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            self.messages.append(crash.message if crash else str(report.longrepr))


def public(path: Path) -> list[str]:
    """The failing public tests' messages on the exercises file at ``path``."""
    import pytest

    failures = _Failures()
    with contextlib.redirect_stdout(io.StringIO()):  # pytest's own report: the plugin keeps what counts
        pytest.main(["-q", "-p", "no:cacheprovider", "-W", "ignore", "-o", "addopts=", str(ROOT / "tests" / "public"),
                     "--impl", str(path)], plugins=[failures])
    return failures.messages


def grader_config(quick: bool):
    from autograder import config
    from autograder.exercises import CHECK_IDS

    cfg = config.load(ROOT / "grading.yaml", CHECK_IDS)
    if quick:
        for checks in (*cfg.exercises.values(), *cfg.bonus.values()):
            for name, check in checks.items():
                checks[name] = dataclasses.replace(check, examples=min(check.examples, 12))
    return cfg


def graded(text: str, exercise: int, cfg, sandbox) -> list[str]:
    """The feedback of every failing visible check of ``exercise``."""
    from autograder.grade import grade

    result = grade(text, cfg, ROOT / "grading.yaml", exercises={exercise}, sandbox=sandbox)
    return [c.feedback for c in result.checks if not c.passed and c.visibility == "visible"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="12 examples per check instead of grading.yaml's")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these mutants only")
    parser.add_argument("--out", type=Path, help="write the table as Markdown to this file")
    args = parser.parse_args(argv)
    from autograder.sandbox import open_sandbox

    mutants = [v for v in corpus.MUTANTS + corpus.PART2_MUTANTS if not args.only or v.name in args.only]
    cfg = grader_config(args.quick)
    started = time.monotonic()
    rows, verdicts = [], {}
    with tempfile.TemporaryDirectory(prefix="messages-") as tmp, open_sandbox(cfg, ROOT / "grading.yaml") as sandbox:
        for v in mutants:
            path = Path(tmp) / f"{v.name}.py"
            path.write_text(corpus.render(v))
            verdicts[v.name] = {"public": Verdict(public(path), v),
                                "grader": Verdict(graded(path.read_text(), v.exercise, cfg, sandbox), v)}
            pub, gra = verdicts[v.name]["public"], verdicts[v.name]["grader"]
            wrong = sorted({p for verdict in (pub, gra) for m in verdict.messages for p in corpus.misled(v, m)})
            rows.append(f"| {v.name} | {v.exercise} | {len(pub.messages)}: {pub.label()} | {len(gra.messages)}: "
                        f"{gra.label()} | {'; '.join(wrong)} |")
            print(rows[-1], flush=True)
    lines = ["| mutant | exercise | public tests failed: what they say | grader checks failed: what they say | "
             "other mistakes named instead |", "|---|---|---|---|---|", *rows, ""]
    for channel in ("public", "grader"):
        all_of = [verdicts[v.name][channel] for v in mutants]
        lines.append(f"{channel}: {len(all_of)} mutants, {sum(not x.silent for x in all_of)} caught, "
                     f"{sum(x.named for x in all_of)} named, {sum(bool(x.misleading) for x in all_of)} misled "
                     f"({sum(len(x.misleading) for x in all_of)} misleading messages), "
                     f"{sum(x.silent for x in all_of)} silent")
    reported = [(name, channel, verdicts[name][channel]) for name, channel in corpus.REPORTED.items() if name in verdicts]
    lines.append(f"the reported cases: {sum(x.named and not x.misleading for _, _, x in reported)} of {len(reported)} "
                 f"named in their channel by no other mistake's message"
                 + "".join(f"; {name} ({channel}): {x.label()}" for name, channel, x in reported
                           if not x.named or x.misleading))
    lines.append(f"{time.monotonic() - started:.0f} s")
    print("\n".join(lines[len(rows) + 2:]))
    if args.out:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
        command = "python " + " ".join(shlex.quote(a) for a in ["benchmarks/messages.py", *(argv or sys.argv[1:])])
        head = [f"# {__doc__.splitlines()[0].removesuffix('.')}", "",
                f"Written by `{command}` at commit {commit.stdout.strip() or 'unknown'} on {os.cpu_count()} cores, "
                f"Python {platform.python_version()} (the script's docstring says how it counts).", ""]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(head + [line if line.startswith("|") or not line else line + "  "
                                               for line in lines]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A reward control's run against the recipe's run, on the same problems (``reward.kind`` random
or format: configs/gsm8k_control_{random,format}.yaml against configs/gsm8k_qwen_coder.yaml).

    python -m course.controls reports/gsm8k_control_random.md --recipe reports/gsm8k_qwen_coder
    python -m course.controls reports/gsm8k_control_random.md --recipe reports/gsm8k_qwen_coder --check

Each run is a report folder (``ppo-train --report``: the Markdown page and, beside it, the folder
of the same name without ``.md``, with ``eval_before.jsonl.gz``, ``eval_after.jsonl.gz`` and
``config.yaml``). From those files alone it computes, before and after training, for each run:
greedy accuracy, the share of responses with a readable answer, accuracy among them, the mean
response length, and the mean length of the wrong answers and of the right ones; and the exact
McNemar test (``assignment.trainer.stats``) of the paired per-problem outcomes, right or wrong and
answered or not: each run before against after, and the two runs against each other after
training (before training they are the same model and should agree). It also says whether the
two configs differ in anything but the reward's kind. The section goes into the control's page
between two markers (replacing an earlier one, else at the end); ``--check`` exits 1 if the page's
section is not what the files give, without writing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from assignment.trainer.ablation import evaluations
from assignment.trainer.stats import McNemar, mcnemar_exact
from course.committed import changed, run_config, write_or_check

BEGIN = "<!-- control comparison: written by `python -m course.controls`; edit that, not this -->"
END = "<!-- end of the control comparison -->"
# What a control may change in the recipe's config: the kind, and the random coin's probability.
CONTROL_KEYS = {"reward.kind", "reward.random_p"}


@dataclass(frozen=True)
class Figures:
    """One greedy evaluation's figures, from its per-problem records."""

    n: int
    correct: int
    answered: int  # responses with a readable answer (answer not None)
    length: float | None  # mean response tokens; None where the records hold no length
    length_wrong: float | None
    length_right: float | None

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    @property
    def answer_rate(self) -> float:
        return self.answered / self.n

    @property
    def accuracy_answered(self) -> float | None:
        return self.correct / self.answered if self.answered else None


def _mean_length(records: list[dict]) -> float | None:
    lengths = [r["length"] for r in records if "length" in r]
    return sum(lengths) / len(lengths) if lengths else None


def figures(records: list[dict]) -> Figures:
    """The figures of one evaluation's records (each with ``correct``, ``answer``, ``length``)."""
    return Figures(len(records), sum(bool(r["correct"]) for r in records), sum(r["answer"] is not None for r in records),
                   _mean_length(records), _mean_length([r for r in records if not r["correct"]]),
                   _mean_length([r for r in records if r["correct"]]))


def _outcomes(records: list[dict], outcome: str) -> list[bool]:
    return [bool(r["correct"]) if outcome == "correct" else r["answer"] is not None for r in records]


def _same_problems(*evaluations: list[dict]) -> bool:
    questions = [[r["question"] for r in records] for records in evaluations]
    return all(q == questions[0] for q in questions)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _tokens(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _test(test: McNemar) -> str:
    return f"{test.c} / {test.b} | {test.p_value:.2g}"


def comparison(control: Path, recipe: Path) -> str:
    """The Markdown section comparing the control's report folder with the recipe's, markers
    included. Raises ValueError where the four evaluations are not the same problems in the same
    order (a paired test would pair different problems)."""
    runs = {"recipe": (recipe, *evaluations(recipe)), "control": (control, *evaluations(control))}
    if not _same_problems(*(records for _, before, after in runs.values() for records in (before, after))):
        raise ValueError(f"{control} and {recipe}: the evaluations are not the same problems in the same order")
    configs = {"control": run_config(control), "recipe": run_config(recipe)}
    differ = changed(configs["control"], configs["recipe"]) - CONTROL_KEYS
    (_, rb, ra), (_, cb, ca) = runs["recipe"], runs["control"]
    f = {name: (figures(before), figures(after)) for name, (_, before, after) in runs.items()}
    n = f["recipe"][0].n
    lines = [BEGIN, "", f"## Against the recipe's run: `{recipe.name}`", "",
             f"This run trained on `reward.kind={configs['control']['reward.kind']}`, the recipe's run on "
             f"`reward.kind={configs['recipe']['reward.kind']}`. Both are "
             f"evaluated greedily on the same {n} test problems, before and after training, on the true answers. "
             + ("Their configs differ in nothing else but where the runs' files went."
                if not differ else f"**Their configs also differ in {', '.join(sorted(differ))}: not a clean control.**"),
             "", "| figure | recipe, before | recipe, after | control, before | control, after |", "|---|---|---|---|---|"]
    rows = [("greedy accuracy", lambda x: f"{x.accuracy:.1%} ({x.correct})"),
            ("answered (a readable final answer)", lambda x: f"{x.answer_rate:.1%} ({x.answered})"),
            ("accuracy among the answered", lambda x: _pct(x.accuracy_answered)),
            ("mean response length (tokens)", lambda x: _tokens(x.length)),
            ("mean length of wrong answers", lambda x: _tokens(x.length_wrong)),
            ("mean length of right answers", lambda x: _tokens(x.length_right))]
    for title, cell in rows:
        lines.append(f"| {title} | " + " | ".join(cell(x) for name in ("recipe", "control") for x in f[name]) + " |")
    lines += ["", "Exact McNemar tests on the paired per-problem outcomes (A -> B: problems where B has the outcome "
              "and A not / the reverse, two-sided p):", "",
              "| outcome | pair | gained / lost | p |", "|---|---|---|---|"]
    pairs = [("recipe, before -> after", rb, ra), ("control, before -> after", cb, ca),
             ("control after -> recipe after", ca, ra), ("control before -> recipe before", cb, rb)]
    for outcome in ("correct", "answered"):
        for title, a, b in pairs:
            lines.append(f"| {outcome} | {title} | {_test(mcnemar_exact(_outcomes(a, outcome), _outcomes(b, outcome)))} |")
    gain = {name: 100 * (after.accuracy - before.accuracy) for name, (before, after) in f.items()}
    lines += ["", f"Accuracy gained in training: recipe {gain['recipe']:+.1f} points, control {gain['control']:+.1f}. "
              "Accuracy among the answered and the lengths are means over different sets of problems before and "
              "after: no paired test applies to them.", "", END]
    return "\n".join(lines) + "\n"


def with_section(page: str, section: str) -> str:
    """``page`` with its section between the markers replaced by ``section``, or ``section``
    appended after a blank line where it has none."""
    if BEGIN in page and END in page:
        start, end = page.index(BEGIN), page.index(END) + len(END)
        return page[:start] + section.rstrip("\n") + page[end:]
    return page.rstrip("\n") + "\n\n" + section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course.controls", description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="the control's report page, reports/NAME.md (its folder: reports/NAME)")
    parser.add_argument("--recipe", type=Path, required=True, help="the recipe's report folder")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page's section is stale; write nothing")
    args = parser.parse_args(argv)
    try:
        page = args.page.read_text()
        updated = with_section(page, comparison(args.page.with_suffix(""), args.recipe))
    except (OSError, ValueError) as err:  # a missing folder or file, an unreadable one (RunFileError), unpaired problems
        print(f"course.controls: {err}", file=sys.stderr)
        return 2
    return write_or_check(args.page, page, updated, args.check, "the control comparison",
                          "python -m course.controls without --check")

if __name__ == "__main__":
    sys.exit(main())

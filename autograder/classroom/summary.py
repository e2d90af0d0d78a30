"""summary.md: what a TA reads first, built from the gradebook alone.

Class size and totals (Part I's, out of the gradebook's ``max``, and what the optional Part II's
bonus adds), the score distribution (text, and a PNG beside the summary when matplotlib is
importable), per-exercise means, every student who did not get a normal grading with the reason,
mistakes by kind, the files to upload and who is not in them, and every entry of the submissions
folder that was not graded. Students are named by their key and, where the platform gives one,
their name.

Mistakes by kind group the class by what the grader recognised: for each exercise, each hint it
gave (a known mistake: flipped sign, unmasked mean, ...) and, for failures without a hint, the
kind of failure (raises an exception, a wrong result no hint matched, ...), with how many
students got it and who. A student counts once per kind and exercise; exercises a student did
not attempt (or that could not run: syntax error, timeout, ...) are left out, since they are
listed with their reason; a hidden check's failure is counted only when the student failed no
visible check of that exercise (else it is the same mistake seen again on other inputs).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from assignment.contract import exercise as contract_exercise, is_bonus

from .discovery import Notice
from .gradebook import Gradebook, Row, number_text, exercise_column
from .grading import FAILED, GRADED, REFUSED
from .status import GRADED as EXERCISE_GRADED, HIDDEN_PREFIX

HISTOGRAM_PNG = "score-distribution.png"
BINS = 10           # of the maximum total each
BAR = 40            # characters of the longest text bar
NO_HINT = "a wrong result that matches no known mistake"


@dataclass(frozen=True)
class Mistake:
    exercise: int
    kind: str
    students: tuple[str, ...]


def exercise_title(number: int) -> str:
    if number == 0:
        return "the learning check"
    try:
        return contract_exercise(number).name
    except (KeyError, IndexError, ValueError):  # an exercise the contract does not list (a bonus)
        return f"exercise {number}"


def failure_kind(feedback: str) -> str:
    """The kind of one failed visible check: its hint, or what went wrong without one."""
    lines = feedback.splitlines()
    for line in lines:
        if line.startswith("Hint: "):
            return line[len("Hint: "):].rstrip(".")
    for line in lines:
        if line.strip().startswith("raised "):
            return "raises " + line.strip()[len("raised "):].split(":", 1)[0]
    if feedback.startswith("the check could not conclude"):
        return "not deterministic (results differ between runs of the same input)"
    if lines and not lines[0].startswith("Counterexample"):
        return lines[0].split(";", 1)[0]
    return NO_HINT


def mistakes(book: Gradebook) -> list[Mistake]:
    """Mistakes by kind, most common first within each exercise."""
    found: dict[tuple[int, str], set[str]] = {}
    for row in book.rows:
        if row.total is None or not row.status == GRADED:
            continue
        for number in book.exercises:
            if row.statuses.get(number) != EXERCISE_GRADED:
                continue  # not attempted or could not run: listed with the reason instead
            failed = [k for k in row.failed_checks if k[0] == number]
            visible = [k for k in failed if k not in row.hidden]
            kinds = {failure_kind(row.feedback.get(k, "")) for k in visible}
            if not visible:
                kinds = {_hidden_kind(row.feedback.get(k, "")) for k in failed}
            for kind in kinds:
                found.setdefault((number, kind), set()).add(label(row))
    order = {n: i for i, n in enumerate(book.exercises)}
    return [Mistake(n, kind, tuple(sorted(who))) for (n, kind), who in
            sorted(found.items(), key=lambda item: (order[item[0][0]], -len(item[1]), item[0][1]))]


def _hidden_kind(feedback: str) -> str:
    words = feedback.removeprefix(HIDDEN_PREFIX + ": ").split(".", 1)[0]
    return f"passes the visible checks, fails the hidden ones ({words})"


def histogram(totals: list[float], out_of: float) -> list[tuple[float, float, int]]:
    """(low, high, count) for BINS equal bins of [0, out_of]; the last bin includes out_of."""
    width = out_of / BINS if out_of > 0 else 1.0
    counts = [0] * BINS
    for t in totals:
        counts[min(int(t / width), BINS - 1) if t > 0 else 0] += 1
    return [(i * width, (i + 1) * width, c) for i, c in enumerate(counts)]


def text_histogram(bins: list[tuple[float, float, int]]) -> list[str]:
    top = max((c for _, _, c in bins), default=0) or 1
    last = len(bins) - 1
    return [f"[{number_text(lo):>4}, {number_text(hi):>4}{']' if i == last else ')'} {'#' * round(BAR * c / top):<{BAR}} {c}"
            for i, (lo, hi, c) in enumerate(bins)]


def write_png(bins: list[tuple[float, float, int]], path: Path) -> bool:
    """The histogram as a PNG; False when matplotlib is not installed (the grading image)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    fig = Figure(figsize=(6, 3.2))  # the object API: no pyplot, no global backend state
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.bar([lo for lo, _, _ in bins], [c for _, _, c in bins], width=bins[0][1] - bins[0][0], align="edge",
           edgecolor="black")
    ax.set_xlabel("total")
    ax.set_ylabel("students")
    ax.set_title("Score distribution")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version string: same data, same file
    return True


def label(row: Row) -> str:
    """A student as the summary names them: the key, and the name where the platform gives one."""
    name = row.extra.get("name", "")
    return f"{row.student} ({name})" if name and name != row.student else row.student


def summary_markdown(book: Gradebook, notices: list[Notice] = (), png: str | None = None,
                     absent: list[str] = (), source: str = "", uploads: list[str] = ()) -> str:
    """``source``: what the submissions folder is (a platform's export); ``uploads``: lines on
    the files to upload (upload.py) and who is not in them."""
    scored = [r for r in book.rows if r.total is not None]
    graded = [r for r in scored if r.status == GRADED]
    failed = [r for r in book.rows if r.status.startswith(FAILED)]
    refused = [r for r in scored if r.status.startswith(REFUSED)]
    lines = ["# Gradebook summary", "", *([f"- Submissions: {source}"] if source else []),
             f"- Students: {len(book.rows)} (graded {len(graded)}, refused {len(refused)}, grader failed {len(failed)})"]
    if scored:
        out_of = book.out_of
        lines.append(f"- Total over the {len(scored)} with a result: mean {statistics.mean(r.total for r in scored):.2f}, "
                     f"median {number_text(statistics.median(r.total for r in scored))} (out of {number_text(out_of)})")
        if book.bonus_out_of is not None:
            tried = [r for r in scored if any(is_bonus(n) and r.statuses.get(n) == EXERCISE_GRADED for n in book.exercises)]
            lines.append(f"- Part II (optional) adds a bonus of up to {number_text(book.bonus_out_of)} points beyond the "
                         f"{number_text(out_of)}: attempted by {len(tried)}"
                         + (f", mean bonus {statistics.mean(r.bonus or 0.0 for r in tried):.2f} among them" if tried else ""))
        lines += ["", "## Score distribution", ""]
        if png:
            lines += [f"![score distribution]({png})", ""]
        lines += ["```", *text_histogram(histogram([r.total for r in scored], out_of)), "```"]
        lines += ["", "## Per exercise", "",
                  "Means over every student with a result; `graded` counts those whose function ran (attempted).",
                  "", "| column | exercise | mean | max | graded |", "|---|---|---:|---:|---:|"]
        for n in book.exercises:
            mean = statistics.mean(r.exercises.get(n, 0.0) for r in scored)
            top = max(r.exercise_max.get(n, 0.0) for r in scored)
            attempted = sum(r.statuses.get(n) == EXERCISE_GRADED for r in scored)
            lines.append(f"| {exercise_column(n)} | {exercise_title(n)} | {mean:.2f} | {number_text(top)} | {attempted} |")
    lines += _reasons(book.rows, absent)
    lines += _mistakes(book, graded)
    if uploads:
        lines += ["", "## Grades to upload", "", *(f"- {line}" for line in uploads)]
    lines += _notices(notices)
    return "\n".join(lines) + "\n"


def _reasons(rows: list[Row], absent: list[str]) -> list[str]:
    off = [r for r in rows if r.reason and r.student not in absent]
    if not off and not absent:
        return ["", "## Students without a normal grading", "",
                "None: every exercise of every student was graded (Part II, optional, may be left blank)."]
    lines = ["", "## Students without a normal grading", "",
             "Refused files got 0 and the reason in their results; after a grader failure (no results file)",
             "rerun the same command to retry. Leaving the optional Part II blank is a normal grading.", "",
             "| student | reason |", "|---|---|"]
    lines += [f"| {_cell(label(r))} | {_cell(r.reason)} |" for r in off]
    lines += [f"| {_cell(label(r))} | {_cell(r.reason)} |" for r in rows if r.student in absent]
    return lines


def _mistakes(book: Gradebook, graded: list[Row]) -> list[str]:
    found = mistakes(book)
    lines = ["", f"## Mistakes by kind (of the {len(graded)} graded submissions)", "",
             "Per exercise: each hint the grader gave, or the kind of failure when it had none; a student counts "
             "once per kind, exercises not attempted are left out, a hidden check only when no visible one failed.",
             ""]
    if not found:
        return lines + ["No mistake: every attempted exercise passed."]
    lines += ["| exercise | mistake | students | who |", "|---|---|---:|---|"]
    return lines + [f"| {exercise_column(m.exercise)} | {_cell(m.kind)} | {len(m.students)} | {', '.join(m.students)} |"
                    for m in found]


def _notices(notices: list[Notice]) -> list[str]:
    if not notices:
        return []
    return ["", "## Entries not graded, or graded under a bent name", "",
            "The rule: `NAME.py` or a folder `NAME/` with `exercises.py` (or one .py file) per student, or a "
            "platform's export as the platform writes it (README).", "",
            *(f"- `{n.entry}`: {n.why}" for n in notices)]


def _cell(text: str) -> str:
    """Markdown table cell: one line, no column breaks."""
    return " ".join(text.split()).replace("|", "\\|")

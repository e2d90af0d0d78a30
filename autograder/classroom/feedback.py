"""``feedback/<student>.md``: what a student sees, as a file a TA can mail or post.

One file per student (their key: a group's members get one each), built from the results file of
their grading alone. The default view is what Gradescope shows before grades are published: the
visible checks with their feedback (counterexamples, hints) and the visible total; hidden checks
are only counted. ``published=True`` is the view after publication: the hidden checks and the
total too, Part I's out of its maximum as in the gradebook, and what the optional Part II's bonus
adds beyond it. A student the grader failed on gets no feedback file (a stale one is removed):
there is nothing of theirs to say yet.

Student text (an exception message, a file name) goes inside code fences longer than any run of
backticks in it, so it cannot break out of the fence.
"""

from __future__ import annotations

import re
from pathlib import Path

from .. import report
from .grading import read_results, unlink

FOLDER = "feedback"


def fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}text\n{text}\n{ticks}"


def render(title: str, data: dict, published: bool = False) -> str:
    tests = [t for t in data.get("tests", []) if published or t.get("visibility") == "visible"]
    view = "after grades are published (hidden checks included)" if published else \
        "as Gradescope shows it before grades are published (visible checks)"
    lines = [f"# Feedback for {title}", "", f"_The view {view}._", ""]
    if published:
        every = data.get("tests", [])
        part_one = [t for t in every if not t.get("extra_data", {}).get("bonus")]
        bonus = [t for t in every if t.get("extra_data", {}).get("bonus")]
        lines.append(f"**Total: {_g(sum(t['score'] for t in part_one))} / {_g(sum(t['max_score'] for t in part_one))}**")
        if bonus:
            lines.append(f"**Bonus (Part II, optional): {_g(sum(t['score'] for t in bonus))} / "
                         f"{_g(sum(t['max_score'] for t in bonus))}**, beyond the total")
    else:
        lines += [fence(data.get("output", ""))]  # results.json's own summary: it counts the hidden checks
    for t in tests:
        mark = "passed" if t.get("status") == "passed" else "failed"
        lines += ["", f"## {t.get('name', '')}: {_g(t.get('score', 0))} / {_g(t.get('max_score', 0))} ({mark})", "",
                  fence(t.get("output", ""))]
    return "\n".join(lines) + "\n"


def write(out: Path, students: list[tuple[str, str | None, str]], published: bool = False) -> Path:
    """feedback/<key>.md for every student (key, their grading's id, how the file names them)
    whose grading has a results file (a grading id None: none to read); returns the folder."""
    folder = Path(out) / FOLDER
    for key, unit, title in students:
        data = read_results(out, unit) if unit is not None else None
        path = folder / f"{key}.md"
        if data is None:
            unlink(path)
            continue
        report.write_text_atomic(render(title, data, published), path)
    return folder


def _g(value: float) -> str:
    return f"{float(value):g}"

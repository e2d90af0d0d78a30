"""Generate the student module from the solution module with nbgrader's ClearSolutions.

Each solution region (``### BEGIN SOLUTION`` ... ``### END SOLUTION``) is replaced by a stub
that raises ``NotImplementedError`` naming its exercise. The replacement itself is nbgrader's
(``ClearSolutions(enforce_metadata=False)`` on an ``nbformat`` notebook), so the markers mean
exactly what they mean in an nbgrader course. The module is cut into one cell per top-level
function so that each region gets the stub of its own exercise.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
from nbgrader.preprocessors import ClearSolutions

from assignment.contract import NAMES

ROOT = Path(__file__).resolve().parent.parent
SOLUTION_PATH = ROOT / "solutions" / "exercises.py"
STUDENT_PATH = ROOT / "assignment" / "exercises.py"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


class StubError(ValueError):
    """The solution module's markers do not match the exercises."""


def stub_code(number: int, name: str) -> str:
    """The Python that replaces exercise ``number``'s solution region (before indentation)."""
    return f'# YOUR CODE HERE (exercise {number})\nraise NotImplementedError("Exercise {number} ({name}) is not implemented yet")'


def _cells(source: str) -> list[tuple[str | None, str]]:
    """Cut ``source`` at each top-level function: [(function name or None, exact text)]."""
    lines = source.splitlines(keepends=True)
    starts: list[tuple[int, str | None]] = [(0, None)]
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            starts.append((first, node.name))
    bounds = [s for s, _ in starts[1:]] + [len(lines)]
    return [(name, "".join(lines[start:end])) for (start, name), end in zip(starts, bounds)]


def generate(source: str) -> str:
    """Return the student module for the solution module ``source``.

    Raises StubError unless each exercise of the contract holds exactly one solution region
    and nothing else does.
    """
    out, seen = [], []
    for name, text in _cells(source):
        regions = text.count(BEGIN)
        if regions != text.count(END):
            raise StubError(f"unbalanced solution markers in {name or 'the module header'}")
        if regions == 0:
            out.append(text)
            continue
        if name not in NAMES or regions != 1:
            raise StubError(f"{name or 'the module header'} holds {regions} solution region(s); "
                            f"only the exercises may hold one each")
        number = NAMES.index(name) + 1
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(text)])
        clear = ClearSolutions(enforce_metadata=False, code_stub={"python": stub_code(number, name)})
        nb, _ = clear.preprocess(nb, {})
        out.append(nb.cells[0].source)
        seen.append(name)
    if tuple(seen) != NAMES:
        raise StubError(f"solution regions found in {seen}; expected one in each of {list(NAMES)}, in order")
    return "".join(out)


def is_fresh() -> bool:
    """True when the committed student module equals freshly generated output, byte for byte."""
    return STUDENT_PATH.exists() and STUDENT_PATH.read_text() == generate(SOLUTION_PATH.read_text())


def write() -> Path:
    """Regenerate ``assignment/exercises.py`` from the solution module."""
    STUDENT_PATH.write_text(generate(SOLUTION_PATH.read_text()))
    return STUDENT_PATH

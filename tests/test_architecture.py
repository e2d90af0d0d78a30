"""The shape of the house: imports point one way, and every declared dependency is used.

    assignment (the student package) <- solutions (the answer key) <- autograder, course
"""

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("assignment", "solutions", "autograder", "course")
# What each package may import of the others.
ALLOWED = {
    "assignment": set(),
    "solutions": {"assignment"},
    "autograder": {"assignment", "solutions"},
    "course": {"assignment", "solutions", "autograder"},
}


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (relative imports excluded)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_one_way(package):
    wrong = {}
    for path in (ROOT / package).rglob("*.py"):
        others = (imported_modules(path) & set(PACKAGES)) - {package} - ALLOWED[package]
        if others:
            wrong[str(path.relative_to(ROOT))] = sorted(others)
    assert not wrong, wrong


def test_the_worker_imports_nothing_of_the_grader():
    """It runs in the sandbox, from a copy of its own package and of the student package."""
    for path in (ROOT / "autograder" / "worker").rglob("*.py"):
        assert not imported_modules(path) & {"autograder", "solutions", "course"}, path


# A distribution's import name where code reaches it through another package.
IMPORT_NAMES = {"tensorboard": "torch.utils.tensorboard"}


def test_every_declared_dependency_is_imported_by_code_that_ships():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared += [d for d in extra if not d.startswith("ppo-llm-course")]
    sources = "\n".join(p.read_text() for d in (*PACKAGES, "tests", "benchmarks") for p in (ROOT / d).rglob("*.py"))
    unused = []
    for requirement in declared:
        name = re.split(r"[<>=!~\[; ]", requirement)[0]
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        if not re.search(rf"^\s*(import|from)\s+{re.escape(module)}\b", sources, flags=re.M):
            unused.append(name)
    assert not unused, f"declared but never imported: {unused}"

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


# A distribution's import name where it differs from the distribution's, or where code reaches it
# through another package.
IMPORT_NAMES = {"tensorboard": "torch.utils.tensorboard", "pyyaml": "yaml"}
# pytest plugins serve through an option in pytest's addopts (pyproject.toml), not an import.
PLUGIN_OPTIONS = {"pytest-xdist": "-n "}


def test_every_declared_dependency_is_imported_by_code_that_ships():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, addopts = pyproject["project"], pyproject["tool"]["pytest"]["ini_options"]["addopts"]
    declared = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared += [d for d in extra if not d.startswith("ppo-llm-course")]
    sources = "\n".join(p.read_text() for d in (*PACKAGES, "tests", "benchmarks") for p in (ROOT / d).rglob("*.py"))
    unused = []
    for requirement in declared:
        name = re.split(r"[<>=!~\[; ]", requirement)[0]
        if name in PLUGIN_OPTIONS:
            if PLUGIN_OPTIONS[name] not in f" {addopts} ":
                unused.append(name)
            continue
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        if not re.search(rf"^\s*(import|from)\s+{re.escape(module)}\b", sources, flags=re.M):
            unused.append(name)
    assert not unused, f"declared but never imported: {unused}"


# Class grading (autograder/classroom/): one module per role, each importing only those before it;
# the CLI imports the package and the package never imports the CLI (nor does the grader's core
# import the package).
CLASSROOM = ["discovery", "exports", "grading", "pool", "state", "status", "gradebook", "roster", "upload", "summary",
             "similarity", "feedback", "run"]


def autograder_imports(path: Path) -> set[str]:
    """The autograder modules ``path`` imports, as dotted names (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}  # from . import report: a module
    return {n for n in names if n == "autograder" or n.startswith("autograder.")}


def test_the_classroom_modules_cover_the_package():
    found = sorted(p.stem for p in (ROOT / "autograder" / "classroom").glob("*.py") if p.stem != "__init__")
    assert found == sorted(CLASSROOM)


@pytest.mark.parametrize("module", CLASSROOM)
def test_classroom_imports_point_one_way(module):
    imported = autograder_imports(ROOT / "autograder" / "classroom" / f"{module}.py")
    assert not {n for n in imported if n == "autograder.cli" or n.startswith("autograder.cli.")}, imported
    later = {f"autograder.classroom.{m}" for m in CLASSROOM[CLASSROOM.index(module):]}
    assert not imported & later, sorted(imported & later)


def test_only_the_cli_imports_the_classroom():
    for path in (ROOT / "autograder").rglob("*.py"):
        if "classroom" in path.parts or path.name == "cli.py":
            continue
        assert not {n for n in autograder_imports(path) if n.startswith("autograder.classroom")}, path
    assert "autograder.classroom.run" in autograder_imports(ROOT / "autograder" / "cli.py")


def test_the_grading_image_does_not_install_the_classroom_extra():
    """copydetect and matplotlib serve the TA's machine; Gradescope installs only `grade`."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("copydetect") for d in extras["classroom"])
    assert not any(d.startswith(("copydetect", "matplotlib")) or "classroom" in d for d in extras["grade"])
    setup = (ROOT / "autograder" / "gradescope" / "setup.sh").read_text()
    assert "'.[grade]'" in setup and "classroom" not in setup
    pinned = (ROOT / "autograder" / "gradescope" / "constraints.txt").read_text().splitlines()
    assert any(line.startswith("copydetect==") for line in pinned)

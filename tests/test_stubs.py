"""The student module is generated from the solution's markers and is a working blank."""

import ast
import importlib
import inspect
import re

import pytest
import torch

from assignment import EXERCISES
from course import stubs


def test_committed_student_module_equals_fresh_generation():
    assert stubs.STUDENT_PATH.read_text() == stubs.generate(stubs.SOLUTION_PATH.read_text()), (
        "assignment/exercises.py is stale: run `ppo-course stubs` and commit the result")


def test_no_solution_code_leaks_into_the_student_module():
    text = stubs.STUDENT_PATH.read_text()
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    solution = ast.parse(stubs.SOLUTION_PATH.read_text())
    for node in solution.body:
        if isinstance(node, ast.FunctionDef):
            body = ast.get_source_segment(stubs.SOLUTION_PATH.read_text(), node.body[-1])
            assert body not in text, f"solution line of {node.name} appears in the student module"


def test_student_module_imports_and_keeps_docstrings_and_signatures():
    student = importlib.import_module("assignment.exercises")
    solution = importlib.import_module("solutions.exercises")
    for name in EXERCISES:
        s, r = getattr(student, name), getattr(solution, name)
        assert inspect.signature(s) == inspect.signature(r)
        assert s.__doc__ == r.__doc__ and "Hints:" in s.__doc__


@pytest.mark.parametrize("number,name", list(enumerate(EXERCISES, start=1)))
def test_every_blank_raises_not_implemented_naming_its_exercise(number, name):
    student = importlib.import_module("assignment.exercises")
    fn = getattr(student, name)
    args = [torch.zeros(2, 2)] * (len(inspect.signature(fn).parameters))
    with pytest.raises(NotImplementedError, match=rf"Exercise {number} \({name}\)"):
        fn(*args)


def test_hints_are_numbered_in_exercise_order():
    solution = importlib.import_module("solutions.exercises")
    for number, name in enumerate(EXERCISES, start=1):
        hints = re.findall(r"^\s+(\d+)\.(\d+) ", getattr(solution, name).__doc__, flags=re.M)
        assert hints, f"{name} has no numbered hints"
        assert {int(major) for major, _ in hints} == {number}
        assert [int(minor) for _, minor in hints] == list(range(1, len(hints) + 1))


def test_docstrings_name_every_argument_with_a_shape():
    """Docstrings drift from signatures (verl and CS336 both let it happen); catch it here."""
    solution = importlib.import_module("solutions.exercises")
    for name in EXERCISES:
        fn = getattr(solution, name)
        doc = fn.__doc__
        for param in inspect.signature(fn).parameters:
            assert re.search(rf"^\s+{param}:", doc, flags=re.M), f"{name}: argument {param} undocumented"
        for arg, ann in fn.__annotations__.items():
            if "Tensor" in str(ann) and arg != "return":
                line = re.search(rf"^\s+{arg}:(.*)$", doc, flags=re.M).group(1)
                assert re.search(r"\((B|\))", line) or "()" in line, f"{name}: {arg} has no shape"


@pytest.mark.parametrize("source,message", [
    ("def compute_policy_loss():\n    pass\n", "expected one in each"),
    ("def helper():\n    ### BEGIN SOLUTION\n    x = 1\n    ### END SOLUTION\n", "only the exercises"),
    ("def compute_policy_loss():\n    ### BEGIN SOLUTION\n    x = 1\n", "unbalanced"),
])
def test_generator_rejects_broken_markers(source, message):
    with pytest.raises(stubs.StubError, match=message):
        stubs.generate(source)


def test_cli_check_reports_fresh(capsys):
    from course.cli import main
    assert main(["stubs", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out

"""Shared pytest options and fixtures."""

import importlib
import importlib.util
from pathlib import Path

import pytest

from assignment.trainer.impl import load_module

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser):
    parser.addoption(
        "--impl", default=None,
        help="whose exercises tests/public checks: 'assignment' (your file), 'solutions', or a path to a .py "
             "file. Default: solutions where that package exists, else assignment.")


def load_impl(spec: str):
    """The exercise module named by ``spec`` (see --impl)."""
    if spec in ("assignment", "solutions"):
        return importlib.import_module(f"{spec}.exercises")
    return load_module(Path(spec).resolve())


@pytest.fixture(scope="session")
def impl(request):
    spec = request.config.getoption("--impl")
    if spec is None:
        spec = "solutions" if importlib.util.find_spec("solutions") else "assignment"
    return load_impl(spec)

"""Staff repository only (the student release does not ship it): tests/public checks the answer
key unless --impl names another file. Loaded before tests/conftest.py, which then keeps this
registration of --impl.

The grader records the examples of every check a submission passes (autograder/replay.py): a
test session keeps its recordings in a folder of its own, deleted at the end, never in the
user's cache, so every session starts without them."""

import os
import shutil
import tempfile
from pathlib import Path

ANSWER_KEY = Path(__file__).resolve().parent / "solutions" / "exercises.py"
_recordings = []


def pytest_addoption(parser):
    parser.addoption("--impl", default=str(ANSWER_KEY),
                     help="whose five exercises tests/public checks: 'assignment' or the path of an exercises file "
                          "(default here: the answer key)")


def pytest_configure(config):
    from autograder.replay import CACHE_ENV

    if CACHE_ENV not in os.environ:
        _recordings.append(tempfile.mkdtemp(prefix="ppo-grade-recordings-"))
        os.environ[CACHE_ENV] = _recordings[-1]


def pytest_unconfigure(config):
    for folder in _recordings:
        shutil.rmtree(folder, ignore_errors=True)

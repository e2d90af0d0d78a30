"""Staff repository only (the student release does not ship it): tests/public checks the answer
key unless --impl names another file. Loaded before tests/conftest.py, which then keeps this
registration of --impl."""

from pathlib import Path

ANSWER_KEY = Path(__file__).resolve().parent / "solutions" / "exercises.py"


def pytest_addoption(parser):
    parser.addoption("--impl", default=str(ANSWER_KEY),
                     help="whose five exercises tests/public checks: 'assignment' or the path of an exercises file "
                          "(default here: the answer key)")

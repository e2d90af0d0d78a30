"""Staff repository only (the student release does not ship it): tests/public checks the answer
key unless --impl names another file. Loaded before tests/conftest.py, which then keeps this
registration of --impl.

The suite runs on every core through pytest-xdist (pyproject's addopts: ``-n auto --dist
loadgroup``; ``-n 0`` runs it in one process). Tests that share an expensive module fixture or a
machine-wide resource carry an ``xdist_group`` mark, so that one worker runs them one after another.

The grader records the examples of every check a submission passes (autograder/replay.py): a
test session keeps its recordings in a folder of its own, deleted at the end, never in the
user's cache, so every session starts without them (the xdist workers inherit the controller's)."""

import os
import shutil
import tempfile
from pathlib import Path

try:  # pytest's own helper (private): see _group_suffixes; without it, groups are left to xdist
    from _pytest.nodeid import coerce_node_id as _coerce_node_id
except ImportError:
    _coerce_node_id = None

ANSWER_KEY = Path(__file__).resolve().parent / "solutions" / "exercises.py"
_recordings = []


def pytest_addoption(parser):
    parser.addoption("--impl", default=str(ANSWER_KEY),
                     help="whose five exercises tests/public checks: 'assignment' or the path of an exercises file "
                          "(default here: the answer key)")


def _xdist_workers() -> int:
    """How many xdist workers share this machine (0 outside an xdist worker)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")) if os.environ.get("PYTEST_XDIST_WORKER") else 0


def pytest_configure(config):
    from autograder.config import RECORDINGS_ENV

    if RECORDINGS_ENV not in os.environ:
        _recordings.append(tempfile.mkdtemp(prefix="ppo-grade-recordings-"))
        os.environ[RECORDINGS_ENV] = _recordings[-1]
    workers = _xdist_workers()
    if workers:
        # Each worker gets its share of the cores for torch (in-process trainings) and for what it
        # starts (CLI runs, trainers, the fork servers set their own): N workers of N cores would
        # otherwise each start N threads.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = max(1, cores // workers)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, str(threads))
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    """Under xdist, the slow tests first (stable: a module's order is kept within each tier): the
    long trainings and gradings start while short tests can still fill the other workers, rather
    than one of them finishing alone at the end."""
    if _xdist_workers():
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if getattr(config.option, "loadgroup", False):
        _group_suffixes(items)


def _group_suffixes(items) -> None:
    """What pytest-xdist's loadgroup does with an ``xdist_group`` mark, for pytest 9: the group's
    name after an @ in the node id, which the scheduler reads to send the group to one worker.
    pytest-xdist 3.8 (the latest) sets ``item._nodeid``, which pytest 9 no longer reads (its node id
    lives in ``item._id``), so there every group was scattered over the workers."""
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid and hasattr(item, "_id") and _coerce_node_id is not None:
            item._id = _coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")


def pytest_unconfigure(config):
    for folder in _recordings:
        shutil.rmtree(folder, ignore_errors=True)

"""The sandbox starts its fork server from any path of the interpreter, and says which path it could
not execute, and why, when it cannot."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import config, sandbox
from autograder.exercises import CHECK_IDS

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "grading.yaml"


def test_the_grader_starts_from_an_interpreter_path_through_dotdot(tmp_path):
    """``../venv/bin/python -m autograder FILE`` from inside the project: sys.executable then walks
    through the project's folder, which the namespaces sandbox's root does not hold."""
    inside = ROOT / "tests"
    python = os.path.relpath(sys.executable, inside)
    assert python.startswith("..")
    proc = subprocess.run([python, "-m", "autograder", "../solutions/exercises.py", "--exercise", "8",
                           "--results", str(tmp_path / "results.json")], cwd=inside,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "4 / 4" in proc.stdout


@pytest.mark.parametrize("strategy", ["auto", "process"])  # auto: namespaces as root, where unshare's shell fails
def test_a_sandbox_that_cannot_execute_the_interpreter_names_it_and_why(monkeypatch, strategy):
    missing = "/nonexistent/bin/python3"
    monkeypatch.setattr(sandbox, "interpreter", lambda: missing)
    cfg = config.load(CONFIG, CHECK_IDS)
    cfg.worker = dataclasses.replace(cfg.worker, sandbox=strategy)
    with pytest.raises(sandbox.GraderFailure) as failure:
        with sandbox.open_sandbox(cfg, CONFIG) as box:
            box.preload()  # waits for the server's hello, which never comes
    assert missing in str(failure.value) and ("not found" in str(failure.value)
                                              or "No such file" in str(failure.value)), str(failure.value)

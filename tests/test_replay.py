"""Recorded examples (autograder/replay.py): a grading that replays them ends exactly as one that
draws them with Hypothesis, for a submission that passes and for one that fails (and shrinks).

Each test points PPO_GRADER_CACHE at a folder of its own, so it starts without recordings.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

import corpus
from autograder import grade as grade_module
from autograder import config, replay, report
from autograder.exercises import update
from autograder.grade import grade, open_sandbox
from autograder.sandbox import hidden_paths
from test_grader import CONFIG, QUICK, QUICK_EXAMPLES, ROOT, load_config

SOLUTION = (ROOT / "solutions" / "exercises.py").read_text()
# One mistake in exercise 1 and one in exercise 5: both shrink a counterexample and give a hint.
WRONG = corpus.render(corpus.by_name("update_no_temperature"), corpus.render(corpus.by_name("policy_sign_flipped")))


@pytest.fixture(scope="module")
def sandbox():
    with open_sandbox(QUICK, CONFIG) as shared:
        yield shared


@pytest.fixture
def recordings(tmp_path, monkeypatch):
    monkeypatch.setenv(config.RECORDINGS_ENV, str(tmp_path / "recordings"))
    return tmp_path / "recordings"


def _graded(source, sandbox, exercises={1, 5}) -> dict:
    out = report.to_gradescope(grade(source, QUICK, CONFIG, exercises=exercises, sandbox=sandbox))
    out.pop("execution_time")
    return out


def test_replayed_gradings_equal_drawn_ones(recordings, sandbox):
    wrong_drawn = _graded(WRONG, sandbox)  # records only the checks it passes
    solution_drawn = _graded(SOLUTION, sandbox)
    recorded = list(recordings.glob("*.safetensors"))
    assert len(recorded) == sum(1 for n in (1, 5) for _ in grade_module.CHECKS[n])
    assert stat.S_IMODE(recordings.stat().st_mode) == 0o700  # the hidden checks' recordings are the staff's
    assert _graded(SOLUTION, sandbox) == solution_drawn
    wrong_replayed = _graded(WRONG, sandbox)
    assert wrong_replayed == wrong_drawn
    assert wrong_replayed["score"] < solution_drawn["score"] and "Hint:" in str(wrong_replayed["tests"])


def test_a_recorded_check_draws_nothing(recordings, sandbox, monkeypatch):
    _graded(SOLUTION, sandbox, exercises={2})
    given = grade_module.given

    def drawn(case):
        raise AssertionError("Hypothesis drew an example of a recorded check")

    monkeypatch.setattr(grade_module, "given", lambda strategy: given(strategy.map(drawn)))
    result = grade(SOLUTION, QUICK, CONFIG, exercises={2}, sandbox=sandbox)
    assert result.score == result.max_score


def test_hidden_checks_record_under_their_own_seed(recordings, sandbox, monkeypatch):
    monkeypatch.setenv(QUICK.seeds.hidden_env, "987654321")
    _graded(SOLUTION, sandbox, exercises={2})
    first = set(recordings.glob("*.safetensors"))
    assert len(first) == len(grade_module.CHECKS[2])  # the visible and the hidden checks
    monkeypatch.setenv(QUICK.seeds.hidden_env, "123456789")  # another deployment: its own hidden examples
    _graded(SOLUTION, sandbox, exercises={2})
    hidden = [c for c in grade_module.CHECKS[2] if c.hidden]
    assert len(set(recordings.glob("*.safetensors")) - first) == len(hidden)


def test_the_process_sandbox_neither_records_nor_replays(recordings):
    """Its workers run as the grader's user: they could rewrite a recording, and with it what later
    gradings compare against."""
    process = load_config(QUICK_EXAMPLES, call_timeout_s=4.0, sandbox="process")
    result = grade(SOLUTION, process, CONFIG, exercises={2})
    assert result.score == result.max_score and not list(recordings.glob("*.safetensors"))


def test_a_folder_others_can_read_or_write_is_not_used(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv(config.RECORDINGS_ENV, str(shared))
    assert config.recordings_dir() is None and not replay.exists("any")
    replay.save("any", [])
    assert not list(shared.iterdir()) and stat.S_IMODE(shared.stat().st_mode) == 0o777  # left as it was
    shared.chmod(0o700)
    assert config.recordings_dir() == shared


@pytest.mark.slow
def test_no_grading_imports_a_local_module_while_it_draws(tmp_path):
    """A key counts the local modules imported before a check draws (replay.key); one that a
    grading imported later (a reference, a comparison or a hint importing lazily) would join
    Hypothesis's pool of literals in a grading that draws but not in one that replays. None does,
    beyond the model's, which a key counts in advance. A fresh process: this one imported much."""
    code = """
import json, sys
sys.path.insert(0, "tests")
from autograder import replay
from autograder.exercises import CHECKS
from autograder.grade import grade
import test_replay as t
before = set(replay._local_modules())
for text in (t.WRONG, t.SOLUTION):
    grade(text, t.QUICK, t.CONFIG, exercises=set(CHECKS))
print(json.dumps(sorted(set(replay._local_modules()) - before)))
"""
    env = dict(os.environ, **{config.RECORDINGS_ENV: str(tmp_path / "recordings")})  # none yet: both gradings draw
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert set(json.loads(out.stdout.splitlines()[-1])) <= set(update.MODEL_MODULES)


def test_every_sandbox_hides_the_recordings(recordings):
    """They hold the reference's results: a sandbox hides them from its workers (the user strategy
    refuses to grade if the sandbox user could read them), even before the first one is written."""
    assert not recordings.exists()
    assert recordings.resolve() in hidden_paths(QUICK, CONFIG)
    assert stat.S_IMODE(recordings.stat().st_mode) == 0o700


def test_a_key_changes_with_the_check_its_examples_and_the_code(monkeypatch):
    base = replay.key(1, "loss", 7, 12)
    assert len({base, replay.key(1, "loss", 7, 13), replay.key(1, "loss", 8, 12), replay.key(2, "loss", 7, 12)}) == 4
    monkeypatch.setattr(replay, "_local_modules", lambda: ("autograder.grade",))
    assert replay.key(1, "loss", 7, 12) != base


def test_model_modules_are_those_the_grading_model_imports():
    """A key counts update.MODEL_MODULES as imported before Hypothesis draws: they must be all the
    local modules that building the model adds (a fresh process: this one has imported them)."""
    code = ("import autograder.grade, json; from autograder import replay; from autograder.exercises import update; "
            "before = set(replay._local_modules()); update.grading_model(); "
            "print(json.dumps(sorted(set(replay._local_modules()) - before)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == sorted(update.MODEL_MODULES)

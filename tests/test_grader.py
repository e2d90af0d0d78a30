"""The autograder against the corpus: the solution, the blank, mutants, alternatives, attacks.

Full gradings use grading.yaml as shipped. The many-submission tests use the same checks,
tolerances and seeds with fewer examples per check (QUICK_EXAMPLES) and a shorter call
timeout, to keep the suite fast; every mutant must still be caught.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import corpus
from autograder import checks, config, report
from autograder.grade import grade

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "grading.yaml"
QUICK_EXAMPLES = 25
MAX_SCORES = {1: 20, 2: 15, 3: 15, 4: 25, 5: 25}


def load_config(examples: int | None = None, call_timeout_s: float | None = None,
                shrink_calls: int | None = None) -> config.GradingConfig:
    cfg = config.load(CONFIG, checks.CHECK_IDS)
    if shrink_calls is not None:
        cfg.hypothesis = dataclasses.replace(cfg.hypothesis, shrink_calls=shrink_calls)
    if examples is not None:
        for ex in cfg.exercises.values():
            for name, c in ex.items():
                ex[name] = dataclasses.replace(c, examples=min(c.examples, examples))
    if call_timeout_s is not None:
        cfg.worker = dataclasses.replace(cfg.worker, call_timeout_s=call_timeout_s)
    return cfg


FULL = load_config()
QUICK = load_config(QUICK_EXAMPLES, call_timeout_s=4.0, shrink_calls=15)


def grade_text(text: str, tmp_path: Path, cfg=QUICK, exercises=None):
    path = tmp_path / "exercises.py"
    path.write_text(text)
    return grade(path, cfg, CONFIG, exercises=exercises)


def by_exercise(result) -> dict[int, float]:
    scores = {c.exercise: 0.0 for c in result.checks}
    for c in result.checks:
        scores[c.exercise] += c.score
    return scores


def test_points_add_up_to_the_documented_maxima():
    assert {n: sum(c.points for c in FULL.exercises[n].values()) for n in FULL.exercises} == MAX_SCORES
    assert all(sum(c.examples for c in FULL.exercises[n].values()) >= 200 for n in FULL.exercises)


def test_solution_gets_full_marks(tmp_path):
    result = grade(ROOT / "solutions" / "exercises.py", FULL, CONFIG)
    failed = [(c.exercise, c.check, c.feedback) for c in result.checks if not c.passed]
    assert not failed
    assert result.score == result.max_score == 100


def test_blank_gets_zero_with_not_implemented_feedback():
    result = grade(ROOT / "assignment" / "exercises.py", FULL, CONFIG)
    assert result.score == 0
    for c in result.checks:
        assert "not implemented" in c.feedback.lower(), (c.exercise, c.check, c.feedback)
        assert "Traceback" not in c.feedback


@pytest.mark.parametrize("variant", corpus.MUTANTS, ids=lambda v: v.name)
def test_mutant_loses_points_on_its_own_exercise_only(variant, tmp_path):
    # Exercise 5 is graded with the reference's exercises 1-3 substituted (and never uses 4), so
    # a mutant of exercises 1-4 cannot reach it: grade 1-4 only, which saves a worker per mutant.
    # test_exercise_5_is_immune_to_mutants_of_1_to_4 shows the substitution at work.
    result = grade_text(corpus.render(variant), tmp_path, exercises=None if variant.exercise == 5 else {1, 2, 3, 4})
    scores = by_exercise(result)
    assert scores[variant.exercise] < MAX_SCORES[variant.exercise], f"{variant.name} was not caught"
    others = {n: s for n, s in scores.items() if n != variant.exercise and s != MAX_SCORES[n]}
    assert not others, f"{variant.name} also lost points on {others}: " + "; ".join(
        f"{c.exercise}/{c.check}: {c.feedback}" for c in result.checks if c.exercise in others and not c.passed)
    failing = [c for c in result.checks if c.exercise == variant.exercise and not c.passed and c.visibility == "visible"]
    assert failing and all(c.feedback for c in failing)


@pytest.mark.parametrize("variant", corpus.ALTERNATIVES, ids=lambda v: v.name)
def test_correct_alternative_gets_full_marks(variant, tmp_path):
    result = grade_text(corpus.render(variant), tmp_path, cfg=FULL)
    failed = [(c.exercise, c.check, c.feedback) for c in result.checks if not c.passed]
    assert not failed, failed


def test_exercise_5_is_immune_to_mutants_of_1_to_4(tmp_path):
    text = corpus.render(corpus.by_name("policy_sign_flipped"))
    text = corpus.render(corpus.by_name("entropy_sign_flipped"), text)
    scores = by_exercise(grade_text(text, tmp_path))
    assert scores[1] < MAX_SCORES[1] and scores[3] < MAX_SCORES[3]
    assert scores[5] == MAX_SCORES[5]


def test_exercise_filter_grades_only_the_named_exercises(tmp_path):
    result = grade_text(corpus.render(corpus.by_name("value_missing_half")), tmp_path, exercises={2})
    assert {c.exercise for c in result.checks} == {2} and result.score < MAX_SCORES[2]


def test_feedback_names_check_counterexample_error_and_hint(tmp_path):
    result = grade_text(corpus.render(corpus.by_name("policy_sign_flipped")), tmp_path)
    loss = next(c for c in result.checks if (c.exercise, c.check) == (1, "loss"))
    assert "Counterexample (shrunk)" in loss.feedback
    assert "expected" in loss.feedback and "got" in loss.feedback and "error" in loss.feedback
    assert "Hint: your loss has the opposite sign" in loss.feedback
    assert "shape (" in loss.feedback


def test_hidden_checks_do_not_reveal_their_inputs(tmp_path):
    result = grade_text(corpus.render(corpus.by_name("policy_sign_flipped")), tmp_path)
    hidden = next(c for c in result.checks if (c.exercise, c.check) == (1, "hidden"))
    assert not hidden.passed and hidden.visibility == "after_published"
    assert "Counterexample" not in hidden.feedback and "hidden set" in hidden.feedback


def test_three_gradings_are_identical(tmp_path):
    text = corpus.render(corpus.by_name("gae_reward_at_last_position"))
    runs = [report.to_gradescope(grade_text(text, tmp_path)) for _ in range(3)]
    for r in runs:
        r.pop("execution_time")
    assert runs[0] == runs[1] == runs[2]
    assert runs[0]["score"] < 100


def test_hidden_seed_changes_hidden_examples_only(tmp_path, monkeypatch):
    text = corpus.render(corpus.by_name("value_clipfrac_ge"))
    public = grade_text(text, tmp_path)
    monkeypatch.setenv(FULL.seeds.hidden_env, "987654321")
    secret = grade_text(text, tmp_path)
    assert secret.extra["hidden_seed_source"] == "env" and public.extra["hidden_seed_source"] == "public-fallback"
    for a, b in zip(public.checks, secret.checks):
        if a.check != "hidden":
            assert (a.score, a.feedback) == (b.score, b.feedback)


# ---- attacks -------------------------------------------------------------------------------------

ATTACK_BUDGET_S = 150


@pytest.mark.parametrize("variant", corpus.ATTACKS, ids=lambda v: v.name)
def test_attack_is_withstood_in_bounded_time(variant, tmp_path):
    started = time.monotonic()
    result = grade_text(corpus.render(variant), tmp_path)
    assert time.monotonic() - started < ATTACK_BUDGET_S
    scores = by_exercise(result)
    name = variant.name
    if name in ("attack_sys_exit_import", "attack_copy_reference_import"):
        assert result.score == 0, scores  # no import, or the blank bodies it could not fill
    elif variant.exercise == 0:
        # kill-parent, forks, fake results, spam: the grader survives; the code is the solution
        assert result.score == 100 or name == "attack_kill_parent_import", scores
    else:
        others = {n: s for n, s in scores.items() if n != variant.exercise}
        # Patching Tensor.__eq__ at import breaks torch inside the submission's own worker (the
        # model's attention masks use ==), so its other exercises may suffer: self-inflicted.
        if name != "attack_patch_comparisons":
            assert all(s == MAX_SCORES[n] for n, s in others.items()), scores
        if name != "attack_memory_hog_gae":  # the hog may legitimately recover after its allocation fails
            assert scores[variant.exercise] == 0, (name, scores)


def run_cli(*args, cwd=ROOT, timeout=300):
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def test_fake_results_are_overwritten_by_the_grader(tmp_path):
    sub = tmp_path / "exercises.py"
    sub.write_text(corpus.render(corpus.by_name("attack_fake_results_import")))
    results = tmp_path / "results.json"
    proc = run_cli(sub, "--results", results, "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(results.read_text())
    assert data["extra_data"]["grader_version"] and len(data["tests"]) == sum(len(c) for c in checks.CHECKS.values())
    assert data["score"] == sum(t["score"] for t in data["tests"])


def test_spam_never_reaches_the_report(tmp_path):
    sub = tmp_path / "exercises.py"
    sub.write_text(corpus.render(corpus.by_name("attack_spam_output_import")))
    proc = run_cli(sub, "--results", tmp_path / "r.json", "--quiet")
    assert proc.returncode == 0 and len(proc.stdout) < 5000 and len(proc.stderr) < 5000


# ---- the command line and results.json ------------------------------------------------------------

GRADESCOPE_SCHEMA = json.loads((Path(__file__).parent / "gradescope_results.schema.json").read_text())


def test_results_json_validates_against_the_gradescope_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    sub = tmp_path / "exercises.py"
    sub.write_text(corpus.render(corpus.by_name("entropy_sign_flipped")))
    proc = run_cli(sub, "--results", tmp_path / "results.json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    assert {t["extra_data"]["exercise"] for t in data["tests"]} == {1, 2, 3, 4, 5}
    assert {"torch_version", "hypothesis_version", "grader_version", "public_seed", "sandbox"} <= set(data["extra_data"])
    assert "Exercise 3: compute_entropy_loss" in proc.stdout and "FAIL" in proc.stdout


def test_missing_submission_gets_zero_and_a_clear_message(tmp_path):
    proc = run_cli(tmp_path / "nope.py", "--results", tmp_path / "r.json", "--quiet")
    data = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0 and data["score"] == 0
    assert "no file at" in data["tests"][0]["output"]


def test_broken_config_fails_the_grader_but_still_writes_results(tmp_path):
    bad = tmp_path / "grading.yaml"
    bad.write_text(CONFIG.read_text().replace("shrink_calls:", "shrink_cals:"))
    proc = run_cli(ROOT / "solutions" / "exercises.py", "--results", tmp_path / "r.json", "--config", bad)
    assert proc.returncode == 1
    assert "shrink_cals" in proc.stderr and "Traceback" not in proc.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["score"] == 0 and "autograder failed" in data["output"]


def test_unknown_check_in_config_names_the_closest_one(tmp_path):
    bad = tmp_path / "grading.yaml"
    bad.write_text(CONFIG.read_text().replace("    clip_frac:   {", "    clipfrac:   {"))
    with pytest.raises(config.ConfigError, match="did you mean 'clip_frac'"):
        config.load(bad, checks.CHECK_IDS)


def test_syntax_error_is_reported_as_an_import_failure(tmp_path):
    result = grade_text("def compute_policy_loss(:\n", tmp_path)
    assert result.score == 0
    assert all("could not be imported: raised SyntaxError" in c.feedback for c in result.checks)


# ---- the CPU learning check (exercise 0) ----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("variant,passes", [(None, True), ("policy_sign_flipped", False)])
def test_training_check_passes_the_solution_and_fails_a_sign_flip(variant, passes, tmp_path):
    text = (ROOT / "solutions" / "exercises.py").read_text() if variant is None else \
        corpus.render(corpus.by_name(variant))
    path = tmp_path / "exercises.py"
    path.write_text(text)
    started = time.monotonic()
    result = grade(path, FULL, CONFIG, with_training=True, exercises=set())  # the training check alone
    (check,) = result.checks
    assert check.exercise == 0 and check.passed is passes, check.feedback
    assert "mean reward of the first 10 steps" in check.feedback
    assert time.monotonic() - started < FULL.training.timeout_s


def test_user_sandbox_refuses_world_readable_secrets(tmp_path):
    from autograder.grade import _check_root_only

    secret = tmp_path / "solutions"
    secret.mkdir()
    secret.chmod(0o755)
    with pytest.raises(RuntimeError, match="readable by other users"):
        _check_root_only([secret])
    secret.chmod(0o700)
    _check_root_only([secret])

"""The autograder against the corpus: the solution, the blank, mutants, alternatives, attacks,
and the CPU learning check (the trainer, run with a submission's five exercises).

Full gradings use grading.yaml as shipped; the solution and the blank get one each. The
many-submission tests use the same checks, tolerances and seeds with fewer examples per check
(QUICK_EXAMPLES) and grade only the exercise a variant touches (exercises are graded
independently: exercise 5 runs the reference's 1-3, see test_exercise_5_is_immune...). They
share one sandbox, as a batch does, so the fork server imports torch once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import corpus
from assignment.contract import PART_I
from autograder import config, report
from autograder.exercises import CHECK_IDS, CHECKS
from autograder.grade import grade, open_sandbox
from autograder.sandbox import GraderFailure

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "grading.yaml"
SUBMISSIONS = Path(__file__).resolve().parent / "submissions"
QUICK_EXAMPLES = 12
MAX_SCORES = {1: 20, 2: 15, 3: 15, 4: 25, 5: 25}
BONUS_MAX = {6: 5, 7: 4, 8: 4}


def load_config(examples: int | None = None, **worker) -> config.GradingConfig:
    cfg = config.load(CONFIG, CHECK_IDS)
    if examples is not None:
        for ex in cfg.exercises.values():
            for name, c in ex.items():
                ex[name] = dataclasses.replace(c, examples=min(c.examples, examples))
        cfg.hypothesis = dataclasses.replace(cfg.hypothesis, shrink_calls=10)
    cfg.worker = dataclasses.replace(cfg.worker, **worker)
    return cfg


FULL = load_config()
QUICK = load_config(QUICK_EXAMPLES, call_timeout_s=4.0)


# Session-scoped: under xdist a worker comes back to this module's tests between others' (slow ones
# first); the fork server stays up meanwhile instead of importing torch again each time.
@pytest.fixture(scope="session")
def sandbox():
    with open_sandbox(QUICK, CONFIG) as shared:
        yield shared


# Gradings that several tests read: a mutant's own test and the feedback tests below grade the same
# text on the same exercises under QUICK. Grading is deterministic (test_three_gradings_are_identical
# grades for real, three times), so each is graded once per test process and every reader gets
# that grading and its warnings, re-emitted to each. Under xdist the readers are one group, on one worker.
SHARED = pytest.mark.xdist_group("shared-quick-gradings")
SHARED_MUTANTS = {"policy_sign_flipped", "entropy_naive_log_softmax", "update_zero_grad_first", "value_missing_half",
                  "value_clipfrac_ge", "update_no_temperature"}
_gradings: dict = {}


def graded(text: str, exercises: set[int], sandbox) -> tuple:
    """(result, warnings) of grade(text, QUICK, CONFIG, exercises, sandbox), once per text, exercises and
    hidden seed; the warnings it raised are raised again to each caller."""
    key = (text, frozenset(exercises), os.environ.get(QUICK.seeds.hidden_env))
    if key not in _gradings:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            result = grade(text, QUICK, CONFIG, exercises=exercises, sandbox=sandbox)
        _gradings[key] = result, tuple(seen)
    result, seen = _gradings[key]
    for w in seen:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return result, seen


def by_exercise(result) -> dict[int, float]:
    scores = {c.exercise: 0.0 for c in result.checks}
    for c in result.checks:
        scores[c.exercise] += c.score
    return scores


def failed(result) -> list:
    return [(c.exercise, c.check, c.feedback) for c in result.checks if not c.passed]


def test_points_and_examples_add_up():
    assert {n: sum(c.points for c in FULL.exercises[n].values()) for n in FULL.exercises} == MAX_SCORES
    assert all(sum(c.examples for c in FULL.exercises[n].values()) == 200 for n in FULL.exercises)
    assert all(any(c.hidden for c in CHECKS[n]) for n in CHECKS)


# ---- the reference and the blank, in full ------------------------------------------------------------

def test_solution_gets_full_marks():
    result = grade((ROOT / "solutions" / "exercises.py").read_text(), FULL, CONFIG)
    assert not failed(result)
    assert result.score == result.max_score == 100
    assert result.extra["network"] in ("seccomp", ) or result.extra["sandbox"] == "namespaces"


def test_blank_gets_zero_with_not_implemented_feedback():
    result = grade((ROOT / "assignment" / "exercises.py").read_text(), FULL, CONFIG)
    assert result.score == 0
    for c in result.checks:
        assert "not implemented" in c.feedback.lower(), (c.exercise, c.check, c.feedback)
        assert "Traceback" not in c.feedback


# ---- mutants, alternatives, the wrong ---------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("variant", [pytest.param(v, marks=SHARED) if v.name in SHARED_MUTANTS else v
                                     for v in corpus.MUTANTS + corpus.PART2_MUTANTS], ids=lambda v: v.name)
def test_mutant_loses_points_with_feedback(variant, sandbox):
    result, _ = graded(corpus.render(variant), {variant.exercise}, sandbox)
    assert by_exercise(result)[variant.exercise] < {**MAX_SCORES, **BONUS_MAX}[variant.exercise], \
        f"{variant.name} was not caught"
    visible = [c for c in result.checks if not c.passed and c.visibility == "visible"]
    assert visible and all(c.feedback for c in visible)
    # Hints that are true: every hint a mutant gets names its own mistake (its phrase), no feedback
    # names another mistake instead (corpus.misled), and the grader names those of NAMED at least; a
    # mutant with no phrase gets no hint.
    hints = {line for c in result.checks for line in c.feedback.splitlines() if line.startswith("Hint: ")}
    if variant.hint:
        assert all(variant.hint in h for h in hints), (variant.name, variant.hint, hints)
    else:
        assert not hints, (variant.name, hints)
    assert not [corpus.misled(variant, c.feedback) for c in visible if corpus.misled(variant, c.feedback)], \
        [c.feedback for c in visible]
    assert variant.name not in NAMED or any(variant.hint in c.feedback for c in visible), (variant.name, "lost its name")


# Mutants whose mistake the grader's feedback names (under QUICK's examples), kept here so that none loses it.
# The others give, on the cases shown, the same numbers as another known mistake (the grader then names
# neither: common.suggest), or no pattern for them is known.
NAMED = {"policy_sign_flipped", "policy_missing_minus", "policy_min_instead_of_max", "policy_clamp_log_ratio",
         "policy_clamp_product", "policy_ratio_by_division", "policy_unmasked_mean", "policy_clipfrac_unclipped_active",
         "policy_clipfrac_ge", "policy_kl_sign_flipped", "policy_kl_k3", "policy_metrics_not_detached",
         "policy_loss_detached", "value_missing_half", "value_clips_returns", "value_clip_absolute",
         "value_min_instead_of_max", "value_no_clipping", "value_clipfrac_ge", "value_unmasked_mean",
         "entropy_naive_log_softmax", "entropy_sign_flipped", "entropy_unmasked", "entropy_mean_over_all_positions",
         "entropy_softmax_wrong_dim", "entropy_mean_over_vocab", "entropy_mean_of_row_means", "entropy_no_upcast",
         "gae_reward_at_last_position", "gae_reward_at_first_token", "gae_reward_overwrites_kl", "gae_forward_loop",
         "gae_loop_skips_last", "gae_no_next_mask", "gae_returns_from_whitened", "gae_whiten_biased_variance",
         "gae_whiten_no_mean_shift", "gae_no_whitening", "gae_whiten_all_positions", "gae_gamma_lam_swapped",
         "gae_missing_gamma_in_trace", "gae_kl_sign_flipped", "update_slice_off_by_one", "update_no_temperature",
         "update_no_accum_division", "update_zero_grad_first", "update_no_grad_clipping", "update_clip_after_step",
         "update_missing_vf_coeff", "grpo_eps_inside_sqrt", "grpo_dr_divides_by_one_plus_eps", "grpo_population_std",
         "grpo_batch_mean", "grpo_ignores_norm_flag", "grpo_torch_std_singleton_nan", "agg_sum_norm_own_length",
         "agg_sum_norm_by_padded_width", "agg_sum_norm_no_batch", "agg_unknown_mode_falls_back",
         "agg_seq_mean_where_after_division", "kl_unknown_estimator_falls_back", "kl_exp_before_mask", "kl_k3_clamped",
         "kl_k3_ratio_flipped", "kl_k1_sign", "kl_k2_no_half", "kl_k3_no_minus_one"}


def test_an_edge_case_costs_its_own_check_only(sandbox):
    """Code right for every input the trainer sends, wrong for one it never sends (an empty row:
    scatter_add_ at index -1 raises) loses the edge_cases check alone, and is told why."""
    result, _ = graded(corpus.render(corpus.by_name("gae_final_reward_scatter")), {4}, sandbox)
    (edge,) = [c for c in result.checks if not c.passed]
    assert (edge.check, edge.max_score) == ("edge_cases", 1) and "index -1 is out of bounds" in edge.feedback
    mask = edge.feedback.split("response_mask:")[1].split("(where")[0]
    assert re.search(r"\[0(, 0)*\]", mask), mask  # the counterexample keeps its empty row


def test_exercise_5_is_immune_to_mutants_of_1_to_4(sandbox):
    text = corpus.render(corpus.by_name("policy_sign_flipped"))
    text = corpus.render(corpus.by_name("entropy_sign_flipped"), text)
    scores = by_exercise(grade(text, QUICK, CONFIG, exercises={1, 3, 5}, sandbox=sandbox))
    assert scores[1] < MAX_SCORES[1] and scores[3] < MAX_SCORES[3]
    assert scores[5] == MAX_SCORES[5]


def _correct_submissions():
    """(text, the Part I exercises it may grade otherwise than the solution) of each correct file:
    a corpus alternative's edited exercises (corpus.exercises_edited), all five for the
    independently written files."""
    part_one = {e.number for e in PART_I}
    files = sorted(SUBMISSIONS.glob("correct_*.py"))
    return [pytest.param(corpus.render(v), corpus.exercises_edited(v) or part_one, id=v.name) for v in corpus.ALTERNATIVES] + \
        [pytest.param(path.read_text(), part_one, id=path.stem) for path in files]


@pytest.mark.slow
@pytest.mark.parametrize("text, exercises", _correct_submissions())
def test_correct_alternative_gets_full_marks(text, exercises, sandbox):
    # Part I's alternatives (the independently written files have no Part II: tests/test_part2.py
    # grades Part II's own alternatives)
    assert not failed(grade(text, QUICK, CONFIG, exercises=exercises, sandbox=sandbox))


# Hidden seeds under which every correct file keeps full marks: 918273645, under which exercise 5's
# former error scale cost float32 code a point, and two drawn at random (secrets.randbelow(2**32))
# when this test was written, kept here so that it reproduces.
HIDDEN_SEEDS = (918273645, 468035695, 126309220)
# The hidden checks as shipped; the visible ones (which no hidden seed changes) at one example each.
HIDDEN_AS_SHIPPED = load_config(call_timeout_s=4.0)
for _number, _checks in (*HIDDEN_AS_SHIPPED.exercises.items(), *HIDDEN_AS_SHIPPED.bonus.items()):
    for _name, _check in _checks.items():
        if _check.visibility == "visible":
            _checks[_name] = dataclasses.replace(_check, examples=1)


def _correct_files_by_part():
    return _correct_submissions() + [pytest.param(corpus.render(v), corpus.exercises_edited(v) or {6, 7, 8}, id=v.name)
                                     for v in corpus.PART2_ALTERNATIVES]


@pytest.mark.slow
@pytest.mark.parametrize("seed", HIDDEN_SEEDS)
@pytest.mark.parametrize("text, exercises", _correct_files_by_part())
def test_correct_files_keep_full_marks_under_other_hidden_seeds(text, exercises, seed, sandbox, monkeypatch):
    monkeypatch.setenv(HIDDEN_AS_SHIPPED.seeds.hidden_env, str(seed))
    result = grade(text, HIDDEN_AS_SHIPPED, CONFIG, exercises=exercises, sandbox=sandbox)
    assert result.extra["hidden_seed_source"] == "env"
    assert not failed(result), result.log


def test_wrong_everywhere_gets_no_point(sandbox):
    """Right types, shapes, dtypes and gradient flags, wrong values: property-only checks (no
    gradient, shapes) give nothing on their own."""
    result = grade(corpus.render(corpus.WRONG_EVERYWHERE), QUICK, CONFIG, sandbox=sandbox)
    assert result.score == 0, [(c.exercise, c.check) for c in result.checks if c.score]


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(SUBMISSIONS.glob("wrong_*.py")), ids=lambda p: p.stem)
def test_independently_written_wrong_files_lose_points_on_every_exercise(path, sandbox):
    """Each is wrong in every function, though not on every input: exercise 5 of wrong_scaled
    is right once the reference stands in for its exercises 1-3, and wrong_zeros backpropagates
    the right loss while it reports zeros."""
    scores = by_exercise(grade(path.read_text(), QUICK, CONFIG, sandbox=sandbox))
    assert all(scores[n] < MAX_SCORES[n] for n in (1, 2, 3, 4)), scores
    if path.stem != "wrong_scaled":
        assert scores[5] < MAX_SCORES[5], scores


# ---- feedback ----------------------------------------------------------------------------------------

@SHARED
def test_feedback_names_check_counterexample_error_and_hint(sandbox):
    result, _ = graded(corpus.render(corpus.by_name("policy_sign_flipped")), {1}, sandbox)
    loss = next(c for c in result.checks if c.check == "loss")
    assert "Counterexample (shrunk)" in loss.feedback
    assert "expected" in loss.feedback and "got" in loss.feedback and "allowed" in loss.feedback
    assert "Hint: your loss has the opposite sign" in loss.feedback
    assert "shape (" in loss.feedback and "[[" in loss.feedback  # tensors printed in their shapes


@SHARED
def test_exercise_5_feedback_gives_a_snippet_that_reruns_the_case(sandbox, tmp_path):
    text = corpus.render(corpus.by_name("update_no_temperature"))
    result, seen = graded(text, {5}, sandbox)  # seen: every warning the grading raised
    # Hypothesis's warnings are for its users (e.g. "Generating overly large repr"): none reaches a TA
    assert not [w for w in seen if "hypothesis" in type(w.message).__module__], [str(w.message) for w in seen]
    check = next(c for c in result.checks if c.check == "metrics")
    assert "Hint: divide the sliced logits by cfg.temperature" in check.feedback
    snippet = check.feedback.split("To rerun this case yourself")[1].split(":\n", 1)[1]
    code = "\n".join(line[4:] for line in snippet.splitlines())
    (tmp_path / "exercises.py").write_text(text)
    run = subprocess.run([sys.executable, "-c", code.replace("from assignment.exercises import", "from exercises import")],
                         cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert run.returncode == 0, run.stderr
    assert "loss/policy" in run.stdout


@SHARED
def test_naive_entropy_is_named_not_called_a_padding_leak(sandbox):
    result, _ = graded(corpus.render(corpus.by_name("entropy_naive_log_softmax")), {3}, sandbox)
    feedback = "\n".join(c.feedback for c in result.checks if not c.passed and c.visibility == "visible")
    assert "log(softmax(z)) underflows" in feedback or "log(0) = -inf" in feedback
    assert "padding leaks" not in feedback


@SHARED
def test_zero_grad_first_gets_a_hint(sandbox):
    result, _ = graded(corpus.render(corpus.by_name("update_zero_grad_first")), {5}, sandbox)
    feedback = "\n".join(c.feedback for c in result.checks if not c.passed)
    assert "Zero them only after optimizer.step()" in feedback
    assert max(len(c.feedback.split("To rerun")[0].splitlines()) for c in result.checks) < 60


# ---- hidden checks -----------------------------------------------------------------------------------

@SHARED
def test_hidden_checks_show_only_the_graders_words(sandbox):
    result, _ = graded(corpus.render(corpus.by_name("policy_sign_flipped")), {1}, sandbox)
    hidden = [c for c in result.checks if c.check.startswith("hidden")]
    assert all(c.visibility == "after_published" for c in hidden)
    assert {c.check for c in hidden if not c.passed} == {"hidden_loss", "hidden_gradient"}  # partial credit
    for c in hidden:
        if c.passed:
            continue
        assert c.feedback.startswith("failed on the hidden inputs: a value differs from the reference")
        assert "Counterexample" not in c.feedback
    # the staff log (stderr) says which value and by how much, results.json stores it for the TA;
    # the student's output does not show it
    notes = result.staff_notes
    assert len(notes) == 2 and all("expected" in n and "error" in n and "allowed" in n for n in notes), notes
    data = report.to_gradescope(result)
    assert data["extra_data"]["hidden_check_failures"] == notes and ", hidden check " not in data["output"]
    assert not any(", hidden check " in t["output"] for t in data["tests"])


def test_visible_feedback_never_carries_text_from_after_a_hidden_check(sandbox, monkeypatch):
    monkeypatch.setenv(QUICK.seeds.hidden_env, "987654321")
    result = grade(corpus.render(corpus.by_name("attack_leak_hidden_inputs")), QUICK, CONFIG, exercises={1, 2},
                   sandbox=sandbox)
    visible = next(c for c in result.checks if (c.exercise, c.check) == (2, "loss"))
    pids = [w for w in visible.feedback.split() if w.startswith("pid")]
    assert "LEAK" in visible.feedback and len(set(pids)) == 1, visible.feedback  # the visible worker only
    hidden = next(c for c in result.checks if (c.exercise, c.check) == (2, "hidden_loss"))
    assert "LEAK" not in hidden.feedback and "pid" not in hidden.feedback


def test_exercise_5_oracle_answers_only_the_cases_own_tensors(sandbox):
    result = grade(corpus.render(corpus.by_name("attack_query_oracle_update")), QUICK, CONFIG, exercises={5},
                   sandbox=sandbox)
    feedback = "\n".join(c.feedback for c in result.checks)
    assert result.score == 0 and "ORACLE SAYS" not in feedback
    assert "the grader's reference answers only those" in feedback


@SHARED
def test_student_output_shows_visible_totals_and_no_staff_note(sandbox):
    result, _ = graded(corpus.render(corpus.by_name("value_missing_half")), {2}, sandbox)
    out = report.to_gradescope(result)
    assert out["output"].startswith("Visible checks: ")
    hidden_points = sum(c.max_score for c in result.checks if c.visibility != "visible")
    assert f"Hidden checks ({hidden_points:g} points)" in out["output"]
    assert "seed" not in out["output"] and any("public seed" in line for line in result.log)


def test_three_gradings_are_identical(sandbox):
    text = corpus.render(corpus.by_name("gae_reward_at_last_position"))
    runs = [report.to_gradescope(grade(text, QUICK, CONFIG, exercises={4}, sandbox=sandbox)) for _ in range(3)]
    for r in runs:
        r.pop("execution_time")
    assert runs[0] == runs[1] == runs[2]
    assert runs[0]["score"] < MAX_SCORES[4]


@SHARED
def test_hidden_seed_changes_hidden_examples_only(sandbox, monkeypatch):
    text = corpus.render(corpus.by_name("value_clipfrac_ge"))
    public, _ = graded(text, {2}, sandbox)
    monkeypatch.setenv(QUICK.seeds.hidden_env, "987654321")
    secret = grade(text, QUICK, CONFIG, exercises={2}, sandbox=sandbox)
    assert secret.extra["hidden_seed_source"] == "env" and public.extra["hidden_seed_source"] == "public-fallback"
    for a, b in zip(public.checks, secret.checks):
        if not a.check.startswith("hidden"):
            assert (a.score, a.feedback) == (b.score, b.feedback)


# ---- attacks -----------------------------------------------------------------------------------------

ATTACK_BUDGET_S = 120


def _sleepers() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and open(f"/proc/{entry}/cmdline", "rb").read() == b"sleep\x004242.5\x00":
                found.append(int(entry))
        except OSError:
            pass
    return found


# The sandbox uid's process limit (worker.nproc) is per uid and machine-wide: while the fork bomb
# holds it, a worker of another grading as that uid cannot start a thread (the training check's
# second torch thread: libgomp aborts). Under xdist the two never run at once: one worker runs
# this group's tests one after another.
NPROC_GROUP = pytest.mark.xdist_group("sandbox-uid-nproc")


@pytest.mark.slow
@pytest.mark.parametrize("variant", [pytest.param(v, marks=NPROC_GROUP) if v.name == "attack_fork_bomb_import" else v
                                     for v in corpus.ATTACKS], ids=lambda v: v.name)
def test_attack_is_withstood_in_bounded_time(variant, sandbox):
    started = time.monotonic()
    name = variant.name
    exercises = None if variant.exercise == 0 else {variant.exercise}
    result = grade(corpus.render(variant), QUICK, CONFIG, exercises=exercises, sandbox=sandbox)
    assert time.monotonic() - started < ATTACK_BUDGET_S
    scores = by_exercise(result)
    feedback = "\n".join(c.feedback for c in result.checks)
    if name in ("attack_sys_exit_import", "attack_copy_reference_import"):
        assert result.score == 0, scores  # no import, or the blank bodies it could not fill
    elif name == "attack_kill_parent_import":
        # The worker runs as an unprivileged uid (namespaces and user strategies alike), so its
        # SIGKILL to the server (root) fails with EPERM at import: the grader goes on and says so.
        assert result.score == 0 and "could not be imported: raised PermissionError" in feedback, feedback[:500]
    elif variant.exercise == 0:
        # kill-parent, forks, fake results, spam, a daemon: the grader survives; the code is the solution
        assert result.score == 100, scores
    elif name not in ("attack_memory_hog_gae",):  # the hog may legitimately recover after its allocation fails
        assert scores[variant.exercise] == 0, (name, scores)
    if name == "attack_infinite_loop_entropy":  # the message names the limit (QUICK: 4 s per call)
        assert f"time limit of {QUICK.worker.call_timeout_s:g} s" in feedback, feedback
    if name == "attack_daemon_import":
        assert not _sleepers(), "a daemon outlived its grading"
    if name == "attack_network_policy":
        assert "NETWORK" in feedback and "connected" not in feedback.split("NETWORK", 1)[1].split("\n")[0]


# ---- the command line and results.json ---------------------------------------------------------------

def run_cli(*args, cwd=ROOT, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the grader from this checkout, whatever cwd is
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


GRADESCOPE_SCHEMA = json.loads((Path(__file__).parent / "gradescope_results.schema.json").read_text())


def test_results_json_validates_and_fake_results_are_overwritten(tmp_path):
    import jsonschema
    sub = tmp_path / "exercises.py"
    sub.write_text(corpus.render(corpus.by_name("attack_fake_results_import")))
    results = tmp_path / "results.json"
    proc = run_cli(sub, "--results", results, "--exercise", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # staff notes (the hidden seed) go to stderr, labelled, never into what the student reads
    assert "seed" not in proc.stdout, proc.stdout
    if not os.environ.get(FULL.seeds.hidden_env):
        assert "ppo-grade: note for course staff (students can ignore it): hidden checks used the public seed" \
            in proc.stderr, proc.stderr
    data = json.loads(results.read_text())
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    assert data["extra_data"]["grader_version"] and len(data["tests"]) == len(CHECKS[3])
    assert data["score"] == sum(t["score"] for t in data["tests"])
    assert {"torch_version", "hypothesis_version", "public_seed", "sandbox", "network"} <= set(data["extra_data"])
    assert "Exercise 3 (compute_entropy_loss)" in proc.stdout


def test_spam_never_reaches_the_report(tmp_path):
    sub = tmp_path / "exercises.py"
    sub.write_text(corpus.render(corpus.by_name("attack_spam_output_import")))
    proc = run_cli(sub, "--results", tmp_path / "r.json", "--quiet", "--exercise", "1")
    assert proc.returncode == 0 and len(proc.stdout) < 5000 and len(proc.stderr) < 5000


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "no file at"),
    (lambda d: (d / "exercises.py").symlink_to(ROOT / "solutions" / "exercises.py"), "symbolic link"),
    (lambda d: (d / "exercises.py").mkdir(), "not a regular file"),
    (lambda d: os.mkfifo(d / "exercises.py"), "not a regular file"),
    (lambda d: (d / "exercises.py").write_bytes(b"\xff\xfe junk"), "not UTF-8"),
])
def test_anything_but_a_regular_file_gets_zero_and_says_why(tmp_path, make, message):
    folder = tmp_path / "submission"
    folder.mkdir()
    make(folder)
    proc = run_cli(folder / "exercises.py", "--results", tmp_path / "r.json", "--quiet",
                   "--submission-folder", folder)
    data = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0 and data["score"] == 0
    assert message in data["tests"][0]["output"]


def test_a_file_reached_through_a_linked_folder_is_refused(tmp_path):
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "sub").symlink_to(ROOT / "solutions")
    proc = run_cli(folder / "sub" / "exercises.py", "--results", tmp_path / "r.json", "--quiet",
                   "--submission-folder", folder)
    data = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0 and data["score"] == 0 and "outside the submission folder" in data["tests"][0]["output"]


def test_broken_config_fails_the_grader_but_still_writes_results(tmp_path):
    bad = tmp_path / "grading.yaml"
    bad.write_text(CONFIG.read_text().replace("shrink_calls:", "shrink_cals:"))
    proc = run_cli(ROOT / "solutions" / "exercises.py", "--results", tmp_path / "r.json", "--config", bad)
    assert proc.returncode == 1
    assert "shrink_cals" in proc.stderr and "Traceback" not in proc.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["score"] == 0 and "autograder failed" in data["output"]


def test_a_malformed_hidden_seed_fails_the_grader_without_a_traceback(tmp_path, monkeypatch, capsys):
    from autograder import cli

    monkeypatch.setenv("PPO_GRADER_HIDDEN_SEED", "abc")
    assert cli.main([str(ROOT / "assignment" / "exercises.py"), "--results", str(tmp_path / "r.json")]) == 1
    err = capsys.readouterr().err
    assert "the hidden seed from env is not an integer" in err and "Traceback" not in err
    assert "autograder failed" in json.loads((tmp_path / "r.json").read_text())["output"]


def test_a_worker_that_never_says_hello_is_the_graders_failure(monkeypatch):
    """The Gradescope failure this guards against: a worker that cannot read what it must is the grader's
    fault, not an import error charged to the student."""
    from autograder import sandbox as sandbox_module

    staged = sandbox_module.Sandbox.add

    def unreadable(self, source):
        path = staged(self, source)
        path.chmod(0o000)
        return path

    monkeypatch.setattr(sandbox_module.Sandbox, "add", unreadable)
    with pytest.raises(GraderFailure, match="never said hello|could not start"):
        grade((ROOT / "solutions" / "exercises.py").read_text(), QUICK, CONFIG, exercises={1})


def test_a_grader_failure_exits_1_and_says_it_is_not_the_students_fault(tmp_path, monkeypatch, capsys):
    from autograder import cli
    from autograder import grade as grade_module

    def broken(*args, **kwargs):
        raise GraderFailure("the exercises 1-4 worker never said hello: the worker stopped answering")

    monkeypatch.setattr(grade_module, "grade", broken)
    code = cli.main([str(ROOT / "solutions" / "exercises.py"), "--results", str(tmp_path / "r.json")])
    data = json.loads((tmp_path / "r.json").read_text())
    assert code == 1 and data["score"] == 0 and data["tests"] == []
    assert "not your fault" in data["output"] and "never said hello" in capsys.readouterr().err


def test_unknown_check_in_config_names_the_closest_one(tmp_path):
    bad = tmp_path / "grading.yaml"
    bad.write_text(CONFIG.read_text().replace("    clip_frac:        {", "    clipfrac:        {"))
    with pytest.raises(config.ConfigError, match="did you mean 'clip_frac'"):
        config.load(bad, CHECK_IDS)


def test_syntax_error_is_reported_as_an_import_failure(sandbox):
    result = grade("def compute_policy_loss(:\n", QUICK, CONFIG, exercises={1, 2}, sandbox=sandbox)
    assert result.score == 0
    assert all("could not be imported: raised SyntaxError" in c.feedback for c in result.checks)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can grade as another user")
def test_user_sandbox_refuses_staff_files_another_user_can_read(tmp_path):
    from autograder.sandbox import check_unreadable

    import tempfile

    secret = Path(tempfile.mkdtemp(dir="/tmp")) / "solutions"  # every folder above it searchable by all
    secret.parent.chmod(0o755)
    secret.mkdir()
    secret.chmod(0o755)
    with pytest.raises(GraderFailure, match="readable by the sandbox user"):
        check_unreadable([secret], "nobody")
    secret.chmod(0o700)
    check_unreadable([secret], "nobody")


# ---- the CPU learning check (exercise 0) ---------------------------------------------------------------

@pytest.mark.slow
@NPROC_GROUP
@pytest.mark.parametrize("variant,passes", [(None, True), ("policy_sign_flipped", False)])
def test_training_check_passes_the_solution_and_fails_a_sign_flip(variant, passes):
    text = (ROOT / "solutions" / "exercises.py").read_text() if variant is None else \
        corpus.render(corpus.by_name(variant))
    started = time.monotonic()
    result = grade(text, FULL, CONFIG, with_training=True, exercises=set())  # the training check alone
    (check,) = result.checks
    assert check.exercise == 0 and check.passed is passes, check.feedback
    assert "mean reward of the first 10 steps" in check.feedback and "threshold +0.150" in check.feedback
    assert check.description.endswith(f"by at least {FULL.training.threshold:g}")
    assert time.monotonic() - started < FULL.training.timeout_s
    if passes:  # the arithmetic, not only the format: well above the 20% of the best input-blind
        # policy (always answering 4, the most frequent sum of two operands in [0, 4])
        after = float(check.feedback.split("greedy accuracy ")[1].split(" -> ")[1].split(";")[0])
        assert after >= 0.35, check.feedback


def test_hidden_paths_are_the_outermost_ones():
    """A --config inside the project tree is hidden with the tree: a second mount inside an
    already hidden folder would fail under the namespaces strategy."""
    from autograder.sandbox import PROJECT_ROOT, secret_paths

    nested = PROJECT_ROOT / "configs" / "gsm8k_qwen_coder.yaml"
    hidden = secret_paths([nested])
    assert PROJECT_ROOT / "configs" in hidden and nested not in hidden
    assert not any(a != b and a in b.parents for a in hidden for b in hidden)


# ---- deny by default: a key copy outside the project ---------------------------------------------------

def key_copy_probe(planted: list[Path]) -> str:
    """A submission that looks for the answer key outside the project: the planted copies by their
    paths, then any .py under / holding the solution marker (for at most 8 s: it runs at each worker's import), and raises what it
    found into the visible feedback of every exercise-1 check."""
    return f'''
import os, time
MARK = "### BEGIN " + "SOLUTION"  # not spelled out here, or this file would match itself
found = []
def look(path):
    try:
        text = open(path, encoding="utf-8", errors="replace").read(400000)
    except OSError as err:
        return type(err).__name__
    if MARK in text:
        found.append(path + ": " + text.split(MARK, 1)[1][:300])
    return "read"
tried = [p + " " + look(p) for p in {[str(p) for p in planted]!r}]
started = time.monotonic()
for folder, dirs, files in os.walk("/"):
    if folder == "/" :
        dirs[:] = [d for d in dirs if d not in ("proc", "sys")]
    if time.monotonic() - started > 8:
        break
    for name in files:
        if name.endswith(".py"):
            look(os.path.join(folder, name))
def compute_policy_loss(*args, **kwargs):
    raise RuntimeError("PROBE RAN; tried " + " | ".join(tried) + "; found " + " | ".join(found))
'''


@pytest.fixture
def planted_keys():
    """Two copies of the answer key with a token no submission can guess: one in the host's /tmp
    (a TA unzipped the release there), one in the home folder (a second clone)."""
    import shutil
    import tempfile
    import uuid

    token = f"KEY_COPY_TOKEN_{uuid.uuid4().hex}"
    key = (ROOT / "solutions" / "exercises.py").read_text().replace(
        "### BEGIN SOLUTION", f"### BEGIN SOLUTION\n    # {token}")
    folders = [Path(tempfile.mkdtemp(dir="/tmp", prefix="unzipped-release-")),
               Path(tempfile.mkdtemp(dir=Path.home(), prefix=".ppo-second-clone-"))]
    paths = []
    for folder in folders:
        folder.chmod(0o755)  # as unzip leaves it: readable by all; root-owned
        (folder / "solutions").mkdir(mode=0o755)
        paths.append(folder / "solutions" / "exercises.py")
        paths[-1].write_text(key)
        paths[-1].chmod(0o644)
    yield token, paths
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="the namespaces strategy needs root")
def test_no_submission_reads_a_key_copy_outside_the_project(planted_keys, tmp_path):
    """Single grading and class grading (ppo-grade on a folder), under the namespaces strategy."""
    token, paths = planted_keys
    probe = key_copy_probe(paths)
    single = grade(probe, QUICK, CONFIG, exercises={1})
    assert single.extra["sandbox"] == "namespaces"
    feedback = "\n".join(c.feedback for c in single.checks)
    assert "PROBE RAN" in feedback, feedback  # the probe did run and report
    assert token not in feedback and "BEGIN SOLUTION" not in feedback, feedback
    assert all(f"{p} FileNotFoundError" in feedback for p in paths), feedback

    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    (subs / "probe.py").write_text(probe)
    quick = tmp_path / "grading.yaml"
    quick.write_text(CONFIG.read_text())
    proc = run_cli(subs, "--out", out, "--exercise", 1, "--jobs", 1, "--config", quick)
    assert proc.returncode == 0, proc.stderr
    feedback = "\n".join(t["output"] for t in json.loads((out / "results" / "probe.json").read_text())["tests"])
    assert "PROBE RAN" in feedback and token not in feedback and "BEGIN SOLUTION" not in feedback, feedback

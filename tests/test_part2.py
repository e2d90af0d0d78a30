"""Part II (exercises 6-8, bonus) against its corpus: the answer key gets full marks and the blanks 0
(bonus points, apart from Part I's 100), every mutant loses points on its exercise and says why,
every correct alternative gets full marks; Part I's score is untouched by Part II's checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import corpus
from autograder import config, report
from autograder.exercises import CHECK_IDS
from autograder.grade import grade, open_sandbox

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "grading.yaml"
PART_II = {6, 7, 8}
BONUS_MAX = {6: 5, 7: 4, 8: 4}


def _config(examples: int | None = None) -> config.GradingConfig:
    cfg = config.load(CONFIG, CHECK_IDS)
    if examples is not None:
        for ex in cfg.bonus.values():
            for name, c in ex.items():
                ex[name] = dataclasses.replace(c, examples=min(c.examples, examples))
    return cfg


FULL, QUICK = _config(), _config(15)


# Session-scoped: under xdist a worker comes back to this module's tests between others' (slow ones
# first); the fork server stays up meanwhile instead of importing torch again each time.
@pytest.fixture(scope="session")
def sandbox():
    with open_sandbox(QUICK, CONFIG) as shared:
        yield shared


def _by_exercise(result) -> dict[int, float]:
    scores: dict[int, float] = {}
    for c in result.checks:
        scores[c.exercise] = scores.get(c.exercise, 0.0) + c.score
    return scores


def test_bonus_points_are_apart_from_the_hundred():
    assert {n: sum(c.points for c in FULL.bonus[n].values()) for n in FULL.bonus} == BONUS_MAX
    assert {n: sum(c.points for c in FULL.exercises[n].values()) for n in FULL.exercises} == \
        {1: 20, 2: 15, 3: 15, 4: 25, 5: 25}


def test_answer_key_full_blank_zero_reported_apart(sandbox):
    key = grade((ROOT / "solutions" / "exercises.py").read_text(), FULL, CONFIG, exercises=PART_II, sandbox=sandbox)
    assert all(c.passed for c in key.checks), [(c.exercise, c.check, c.feedback) for c in key.checks if not c.passed]
    assert (key.score, key.max_score, key.bonus_score, key.bonus_max) == (0, 0, 13, 13)
    data = report.to_gradescope(key)
    assert data["score"] == 13 and data["extra_data"]["bonus_score"] == 13
    assert all(t["name"].startswith("Bonus (Part II)") for t in data["tests"])
    assert "BONUS" in report.terminal(key) and "Bonus (Part II), beyond the total: 10.5 / 10.5" in report.summary(key, False)
    blank = grade((ROOT / "assignment" / "exercises.py").read_text(), FULL, CONFIG, exercises=PART_II, sandbox=sandbox)
    assert blank.bonus_score == 0 and all("not implemented" in c.feedback for c in blank.checks)


def test_part_one_score_ignores_part_two(sandbox):
    """A Part I-only file (Part II blank) and the key score the same Part I points; bonus never enters score."""
    text = (ROOT / "solutions" / "exercises.py").read_text()
    blank_part_two = text[: text.index("def compute_grpo_advantages(")]
    result = grade(blank_part_two, QUICK, CONFIG, exercises={1, 6}, sandbox=sandbox)
    assert result.score == result.max_score == 20 and result.bonus_score == 0
    assert report.to_gradescope(result)["score"] == 20


# Every Part II mutant loses points with its own hint or none: test_grader.py's
# test_mutant_loses_points_with_feedback grades them with Part I's.


def test_a_group_of_one_costs_one_point_with_its_hint(sandbox):
    """torch.std per group, right for every group of 2 or more and NaN for a group of one (what the
    trainer never sends): only the edge-case check, one point, with the group-of-one hint."""
    result = grade(corpus.render(corpus.by_name("grpo_torch_std_singleton_nan")), FULL, CONFIG, exercises={6},
                   sandbox=sandbox)
    assert result.bonus_score == BONUS_MAX[6] - 1, [(c.check, c.score) for c in result.checks]
    (edge,) = [c for c in result.checks if not c.passed]
    assert edge.check == "edge_cases" and "Hint: a group of one response gives NaN" in edge.feedback


@pytest.mark.slow
@pytest.mark.parametrize("variant", corpus.PART2_ALTERNATIVES, ids=lambda v: v.name)
def test_part2_alternative_gets_full_marks(variant, sandbox):
    result = grade(corpus.render(variant), QUICK, CONFIG, exercises=PART_II, sandbox=sandbox)
    assert result.bonus_score == result.bonus_max == 13, \
        [(c.exercise, c.check, c.feedback) for c in result.checks if not c.passed]


def test_the_singleton_hint_needs_a_group_of_one():
    """The "group of one gives NaN" hint only when every response with non-finite advantages is
    alone in its group; NaN in a larger group (a forgotten eps on equal rewards: 0 / 0) says
    something else, and must not get that hint."""
    from autograder.calls import Called
    from autograder.cases import Case
    from autograder.exercises import grpo

    def evidence(ids, rewards, nan_rows):
        mask = torch.ones(len(ids), 2, dtype=torch.bool)
        case = Case(tensors={"rewards": torch.tensor(rewards), "group_ids": torch.tensor(ids), "response_mask": mask},
                    scalars={"norm_by_std": True, "eps": 1e-6})
        advantages = torch.zeros(len(ids), 2)
        advantages[nan_rows] = float("nan")
        return [(case, Called({"advantages": advantages}, {"advantages": False}, None), None)]

    # response 2 alone in its group: torch.std of one value is NaN
    assert grpo.hint(evidence([0, 0, 1], [1.0, 0.0, 1.0], [2]), 4.0) == grpo.SINGLETON
    # group 0 of two equal rewards, divided by a std of 0 without eps
    assert grpo.hint(evidence([0, 0, 1, 1], [1.0, 1.0, 0.0, 1.0], [0, 1]), 4.0) != grpo.SINGLETON


def test_a_hint_rests_on_the_case_shown(sandbox):
    """A CS336-style file with two bugs, torch.std per group (a group of one gives NaN) and Dr. GRPO
    divided by a std of 1 + eps: each failing check's hint names the mistake its counterexample
    shows, whatever the other cases Hypothesis met showed."""
    text = corpus.render(corpus.by_name("grpo_dr_divides_by_one_plus_eps"),
                         corpus.render(corpus.by_name("grpo_torch_std_singleton_nan")))
    result = grade(text, QUICK, CONFIG, exercises={6}, sandbox=sandbox)
    failed = [c for c in result.checks if not c.passed and c.visibility == "visible"]
    assert {c.check for c in failed} >= {"dr_grpo", "edge_cases"}, [c.check for c in failed]
    for check in failed:
        shown_nan = "advantages is nan" in check.feedback
        assert ("Hint: a group of one response gives NaN" in check.feedback) == shown_nan, check.feedback
        assert ("yours divides by 1 + eps" in check.feedback) != shown_nan, check.feedback


def test_counterexamples_hold_no_row_they_do_not_need(sandbox):
    """Hypothesis left exercise 6's edge-case counterexample for Dr. GRPO's 1 + eps at 11 rows, 10 of
    them empty; the grader drops rows while the case still fails and stays an edge case: a group of
    one beside a group of two, 3 rows, is the fewest that show it there (2 in the other checks)."""
    result = grade(corpus.render(corpus.by_name("grpo_dr_divides_by_one_plus_eps")), QUICK, CONFIG, exercises={6},
                   sandbox=sandbox)
    rows = {c.check: c.feedback.split("rewards: shape (")[1].split(",")[0] for c in result.checks
            if not c.passed and c.visibility == "visible"}
    assert rows == {"dr_grpo": "2", "trainer_layout": "2", "edge_cases": "3"}, rows

"""The CPU learning check: the reference solution learns the synthetic task, a sign-flipped
policy loss does not. Slow: each run trains for a minute or two on CPU."""

from pathlib import Path

import pytest

from assignment.trainer.impl import load_impl
from assignment.trainer.learning_check import run

SOLUTION_FILE = Path(__file__).resolve().parents[1] / "solutions" / "exercises.py"


def sign_flipped(tmp_path):
    """The solution with the surrogate's sign flipped (-A -> A): gradient ascent on the loss."""
    source = SOLUTION_FILE.read_text()
    flipped = source.replace("unclipped = -advantages * ratio", "unclipped = advantages * ratio")
    flipped = flipped.replace("clipped = -advantages * torch.clamp", "clipped = advantages * torch.clamp")
    assert flipped.count("advantages * ") - flipped.count("-advantages * ") == 2, "the solution changed shape"
    path = tmp_path / "flipped.py"
    path.write_text(flipped)
    return load_impl(str(path))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_solution_learns(seed):
    check = run(load_impl(str(SOLUTION_FILE)), seed=seed)
    assert check.passed, (check.first10_mean, check.last10_mean)
    # The arithmetic, not only the format: well above the 20% of the best input-blind policy
    # (always answering 4, the most frequent sum of two operands in [0, 4]).
    assert check.accuracy_after >= 0.35, check.accuracy_after


@pytest.mark.slow
def test_sign_flipped_policy_loss_does_not_learn(tmp_path):
    check = run(sign_flipped(tmp_path), seed=0)
    assert not check.passed, (check.first10_mean, check.last10_mean)

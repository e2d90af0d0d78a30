"""Part II (the bonus: handout.md, section 8) against its contract: hand-computed cases for
exercises 6-8. Independent of the autograder. ``pytest tests/public -m ex7`` runs one exercise's.

Part II is optional: while an exercise still raises NotImplementedError its tests are skipped,
so the public suite stays green for Part I alone.

Tolerances: as in test_contract.py (``near``): a few float32 roundings of the magnitudes involved.
"""

import math

import pytest
import torch

from test_contract import MASK, near, with_junk

pytestmark = pytest.mark.bonus


def attempt(impl, name, *args):
    """impl.name(*args), or skip the test while the exercise is a blank or not in the file."""
    fn = getattr(impl, name, None)
    if fn is None:
        pytest.skip(f"Part II not attempted: the file defines no {name}")
    try:
        return fn(*args)
    except NotImplementedError as err:
        pytest.skip(f"Part II not attempted yet: {err}")


# ---- exercise 6 ---------------------------------------------------------------------------

REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5], dtype=torch.float64)
GROUPS = torch.tensor([0, 0, 0, 7, 3])  # group 0 of three, then two groups of one
MASK6 = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1], [0, 0]], dtype=torch.bool)  # the last row is empty


@pytest.mark.ex6
def test_grpo_advantages_hand_computed(impl):
    eps = 1e-6
    adv = attempt(impl, "compute_grpo_advantages", REWARDS, GROUPS, MASK6, True, eps)
    # group 0: mean 2/3, sample std sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3)
    std = math.sqrt(1 / 3)
    expected = [(1 - 2 / 3) / (std + eps), (0 - 2 / 3) / (std + eps), (1 - 2 / 3) / (std + eps)]
    for row, value in enumerate(expected):
        assert adv[row][MASK6[row]].tolist() == [near(value, scale=2)] * int(MASK6[row].sum()), \
            f"row {row}: (r - group mean) / (group's sample std (n - 1) + eps) on every real token"
    assert adv[3].tolist() == [0.0, 0.0], "a group of one response: advantage 0 (its reward is its own baseline)"
    assert adv[~MASK6].abs().max().item() == 0.0, "padded positions are 0"
    assert not adv.requires_grad, "advantages carry no gradient"


@pytest.mark.ex6
def test_dr_grpo_advantages_drop_the_std(impl):
    adv = attempt(impl, "compute_grpo_advantages", REWARDS, GROUPS, MASK6, False, 0.5)
    assert adv[:2, 0].tolist() == [near(1 / 3, scale=1), near(-2 / 3, scale=1)], \
        "Dr. GRPO: r - group mean alone (eps plays no part)"
    assert adv[3].tolist() == [0.0, 0.0] and adv[~MASK6].abs().max().item() == 0.0


@pytest.mark.ex6
def test_grpo_adds_eps_to_the_std_not_to_the_variance(impl):
    eps = 0.5  # large, so that (r - mean) / (std + eps) and (r - mean) / sqrt(var + eps) differ plainly
    adv = attempt(impl, "compute_grpo_advantages", torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([4, 4]),
                  torch.ones(2, 1, dtype=torch.bool), True, eps)
    std = math.sqrt(0.5)  # of [1, 0], with n - 1
    assert adv[:, 0].tolist() == [near(0.5 / (std + eps), scale=2), near(-0.5 / (std + eps), scale=2)], \
        "(r - group mean) / (group std + eps): eps goes outside the square root"


@pytest.mark.ex6
def test_grpo_advantages_of_equal_rewards_are_zero(impl):
    adv = attempt(impl, "compute_grpo_advantages", torch.ones(4, dtype=torch.float64), torch.tensor([0, 0, 1, 1]),
                  torch.ones(4, 2, dtype=torch.bool), True, 1e-6)
    assert adv.abs().max().item() == 0.0, "a group whose rewards are all equal: 0, not NaN"


# ---- exercise 7 ---------------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
MASK7 = torch.cat([MASK, torch.zeros(1, 3, dtype=torch.bool)])  # a third, empty row


@pytest.mark.ex7
@pytest.mark.parametrize("mode, expected", [
    ("token-mean", 15 / 5),                       # the 5 real tokens
    ("seq-mean-token-mean", (6 / 3 + 9 / 2) / 2),  # the two non-empty rows' means
    ("seq-mean-token-sum-norm", 15 / (3 * 4)),      # B = 3 rows, budget 4, whatever the lengths
])
def test_aggregate_loss_hand_computed(impl, mode, expected):
    loss_mat = with_junk(LOSS, MASK7).requires_grad_()
    loss = attempt(impl, "aggregate_loss", loss_mat, MASK7, mode, 4)
    assert loss.dim() == 0 and loss.item() == near(expected, scale=15), f"{mode}: see the docstring's formula"
    loss.backward()
    assert loss_mat.grad[~MASK7].abs().max().item() == 0.0, "junk in padding must not reach the loss"


@pytest.mark.ex7
def test_aggregate_loss_refuses_an_unknown_mode(impl):
    with pytest.raises(ValueError):
        attempt(impl, "aggregate_loss", LOSS, MASK7, "seq-mean-token-sum", 4)


# ---- exercise 8 ---------------------------------------------------------------------------

LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -9.0]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0, -0.5], [-0.3, -2.0, -1.0]], dtype=torch.float64)


@pytest.mark.ex8
@pytest.mark.parametrize("estimator, per_token", [
    ("k1", lambda log_r: -log_r),
    ("k2", lambda log_r: 0.5 * log_r ** 2),
    ("k3", lambda log_r: math.exp(log_r) - 1 - log_r),
])
def test_kl_estimators_hand_computed(impl, estimator, per_token):
    logprobs = with_junk(LOGPROBS, MASK, junk=-300.0).requires_grad_()
    kl = attempt(impl, "compute_kl", logprobs, REF, MASK, estimator)
    log_r = (REF - LOGPROBS)[MASK].tolist()  # 0.5 -> -0.5, ... with ref - policy
    assert kl[MASK].tolist() == [near(per_token(x), scale=8) for x in log_r], \
        f"{estimator} per real token, with log_r = ref_logprobs - logprobs"
    assert kl[~MASK].abs().max().item() == 0.0, "padded positions are 0"
    kl[MASK].sum().backward()
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all(), "a finite gradient reaches logprobs"
    assert logprobs.grad[~MASK].abs().max().item() == 0.0, "no gradient through padding"


@pytest.mark.ex8
def test_k3_has_no_clamp(impl):
    # log_r = ref_logprobs - logprobs = 4: k3 = e^4 - 5 = 49.6, past verl's clamp at 10
    logprobs = torch.tensor([[-5.0, -1.0]], dtype=torch.float64, requires_grad=True)
    ref, mask = torch.tensor([[-1.0, -1.0]], dtype=torch.float64), torch.tensor([[True, False]])
    kl = attempt(impl, "compute_kl", logprobs, ref, mask, "k3")
    assert kl[0, 0].item() == near(math.exp(4) - 5, scale=60), "k3 = exp(log_r) - 1 - log_r, with no clamp"
    kl[mask].sum().backward()
    assert logprobs.grad[0, 0].item() == near(1 - math.exp(4), scale=60), \
        "d k3 / d logprobs = 1 - exp(log_r): a clamp would make it 0 here"


@pytest.mark.ex8
def test_kl_refuses_an_unknown_estimator(impl):
    with pytest.raises(ValueError):
        attempt(impl, "compute_kl", LOGPROBS, REF, MASK, "k4")

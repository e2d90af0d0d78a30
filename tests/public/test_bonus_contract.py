"""Part II (the bonus: handout.md, section 8) against its contract: hand-computed cases for
exercises 6-8. Independent of the autograder. ``pytest tests/public -m ex7`` runs one exercise's.

Part II is optional: while an exercise still raises NotImplementedError its tests are skipped,
so the public suite stays green for Part I alone.

Tolerances and messages: as in test_contract.py (``near``: a few float32 roundings of the
magnitudes involved; ``explain``: a message names a mistake where the value returned is that
mistake's on the test's inputs).
"""

import math

import pytest
import torch

from test_contract import MASK, explain, near, with_junk

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


POPULATION = "you divide by n (the population std); the contract's std is the sample std, Bessel's n - 1, as " \
             "torch.std computes by default"
WHOLE_BATCH = "the mean and std are per group (the responses to one prompt), not over the whole batch"


@pytest.mark.ex6
def test_grpo_advantages_hand_computed(impl):
    eps = 1e-6
    adv = attempt(impl, "compute_grpo_advantages", REWARDS, GROUPS, MASK6, True, eps)
    # group 0: mean 2/3, sample std sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3); divided by 3 instead,
    # sqrt(2/9). The whole batch's rewards 1, 0, 1, 1, 0.5: mean 0.7, sample std sqrt(0.8 / 4); row 0 is then
    # 1/3 / (sqrt(0.2) + eps) with the batch's std, and 0.3 over its group's std with the batch's mean (the
    # group's 0.3, -0.7, 0.3 spread around 0 by sqrt(0.67 / 2), or around their own mean by sqrt(1/3))
    std = math.sqrt(1 / 3)
    expected = [(1 - 2 / 3) / (std + eps), (0 - 2 / 3) / (std + eps), (1 - 2 / 3) / (std + eps)]
    got = adv[0, 0].item()
    assert got == near(expected[0], scale=2), explain(
        "row 0: (r - group mean) / (group's sample std + eps)", got, expected[0],
        [((1 / 3) / (math.sqrt(2 / 9) + eps), POPULATION), ((1 / 3) / (math.sqrt(0.2) + eps), WHOLE_BATCH),
         (0.3 / (math.sqrt(0.67 / 2) + eps), WHOLE_BATCH), (0.3 / (std + eps), WHOLE_BATCH)], scale=2)
    for row, value in enumerate(expected):
        assert adv[row][MASK6[row]].tolist() == [near(value, scale=2)] * int(MASK6[row].sum()), \
            f"row {row}: (r - group mean) / (group's sample std (n - 1) + eps) on every real token"
    assert not adv[3].isnan().any(), "a group of one response gives NaN: torch.std of a single value divides by " \
                                     "n - 1 = 0. The contract gives it advantage 0 (its reward is its own baseline)"
    assert adv[3].tolist() == [0.0, 0.0], "a group of one response: advantage 0 (its reward is its own baseline)"
    assert adv[~MASK6].abs().max().item() == 0.0, "padded positions are 0"
    assert not adv.requires_grad, "advantages carry no gradient"


@pytest.mark.ex6
def test_dr_grpo_advantages_drop_the_std(impl):
    adv = attempt(impl, "compute_grpo_advantages", REWARDS, GROUPS, MASK6, False, 0.5)
    # rows 0 and 1: 1/3 and -2/3. Divided by std + eps = sqrt(1/3) + 0.5, or by 1 + eps; centred on the whole
    # batch's mean 0.7: 0.3 and -0.7
    got = tuple(adv[:2, 0].tolist())
    assert got == (near(1 / 3, scale=1), near(-2 / 3, scale=1)), explain(
        "Dr. GRPO, rows 0 and 1: r - group mean alone (eps plays no part)", got, (1 / 3, -2 / 3),
        [((1 / 3 / (math.sqrt(1 / 3) + 0.5), -2 / 3 / (math.sqrt(1 / 3) + 0.5)),
          "with norm_by_std=False (Dr. GRPO) the advantage is r - mean alone: no std"),
         ((1 / 3 / 1.5, -2 / 3 / 1.5), "Dr. GRPO's advantage is r - mean with no divisor; yours divides by 1 + eps"),
         ((0.3, -0.7), WHOLE_BATCH)])
    assert adv[3].tolist() == [0.0, 0.0] and adv[~MASK6].abs().max().item() == 0.0


@pytest.mark.ex6
def test_grpo_adds_eps_to_the_std_not_to_the_variance(impl):
    # eps large, so that (r - mean) / (std + eps) and (r - mean) / sqrt(var + eps) differ plainly; a group of
    # three, where the sample and the population std differ from these and from each other (of two rewards,
    # sqrt(var_pop + 0.5) would equal the population std + 0.5)
    eps = 0.5
    adv = attempt(impl, "compute_grpo_advantages", torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64),
                  torch.tensor([4, 4, 4]), torch.ones(3, 1, dtype=torch.bool), True, eps)
    # mean 1/3, centred 2/3, -1/3, -1/3: sample variance (4/9 + 1/9 + 1/9) / 2 = 1/3, population 2/9
    got = adv[0, 0].item()
    expected = (2 / 3) / (math.sqrt(1 / 3) + eps)
    assert got == near(expected, scale=2), explain(
        "row 0: (r - group mean) / (group std + eps)", got, expected,
        [((2 / 3) / math.sqrt(1 / 3 + eps), "eps goes outside the square root: (r - group mean) / (group std + eps)"),
         ((2 / 3) / (math.sqrt(2 / 9) + eps), POPULATION)], scale=2)


@pytest.mark.ex6
def test_grpo_advantages_of_equal_rewards_are_zero(impl):
    adv = attempt(impl, "compute_grpo_advantages", torch.ones(4, dtype=torch.float64), torch.tensor([0, 0, 1, 1]),
                  torch.ones(4, 2, dtype=torch.bool), True, 1e-6)
    assert adv.abs().max().item() == 0.0, "a group whose rewards are all equal: 0, not NaN"


# ---- exercise 7 ---------------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
MASK7 = torch.cat([MASK, torch.zeros(1, 3, dtype=torch.bool)])  # a third, empty row


# the rows' sums 6, 9 and 0 over 3, 2 and 0 real tokens: GRPO's mean over three rows (2 + 4.5 + 0) / 3, the
# token-mean 15 / 5; Dr. GRPO's sum over the padded width T = 3 instead of the budget 4, over the budget alone,
# each row over its own length
AGGREGATION_MISTAKES = {
    "token-mean": [((6 / 3 + 9 / 2) / 2, "token-mean divides the sum over all real tokens by their number, not a "
                                         "mean of per-row means")],
    "seq-mean-token-mean": [(6.5 / 3, "a response with no real token has no mean: leave it out of the mean over "
                                      "responses"),
                            (3.0, "seq-mean-token-mean averages each response's token-mean, then averages over "
                                  "responses")],
    "seq-mean-token-sum-norm": [(15 / 9, "divide by max_response_length (the generation budget), not by T, the "
                                         "batch's padded width"),
                                (15 / 4, "divide by B * max_response_length: the mean over the B responses stays"),
                                ((6 / 3 + 9 / 2) / 2, "Dr. GRPO's mode divides each response's sum by one constant, "
                                                      "not by the response's own length")],
}


@pytest.mark.ex7
@pytest.mark.parametrize("mode, expected", [
    ("token-mean", 15 / 5),                       # the 5 real tokens
    ("seq-mean-token-mean", (6 / 3 + 9 / 2) / 2),  # the two non-empty rows' means
    ("seq-mean-token-sum-norm", 15 / (3 * 4)),      # B = 3 rows, budget 4, whatever the lengths
])
def test_aggregate_loss_hand_computed(impl, mode, expected):
    loss_mat = with_junk(LOSS, MASK7).requires_grad_()
    loss = attempt(impl, "aggregate_loss", loss_mat, MASK7, mode, 4)
    assert loss.dim() == 0, f"{mode}: the loss is a scalar"
    assert loss.item() == near(expected, scale=15), explain(f"{mode}: see the docstring's formula", loss.item(),
                                                            expected, AGGREGATION_MISTAKES[mode], scale=15)
    loss.backward()
    assert mode != "seq-mean-token-mean" or torch.isfinite(loss_mat.grad[2]).all(), \
        "the gradient is NaN or inf in row 2, which holds no real token: an empty row's count of real tokens is 0, " \
        "so dividing by it gives 0 / 0, and selecting the result away afterwards (torch.where, or indexing the other " \
        "rows) still sends 0 * inf = NaN back through the division. Divide by a clamped count (count.clamp(min=1)), " \
        "or select the non-empty rows before dividing"
    assert loss_mat.grad[~MASK7].abs().max().item() == 0.0, "junk in padding must not reach the loss"


@pytest.mark.ex7
def test_aggregate_loss_refuses_an_unknown_mode(impl):
    with pytest.raises(ValueError):
        attempt(impl, "aggregate_loss", LOSS, MASK7, "seq-mean-token-sum", 4)
        pytest.fail("aggregate_loss returned a value for 'seq-mean-token-sum', which is none of the three modes: "
                    "the contract raises ValueError")


# ---- exercise 8 ---------------------------------------------------------------------------

LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -9.0]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0, -0.5], [-0.3, -2.0, -1.0]], dtype=torch.float64)


KL_MISTAKES = {
    "k1": [(lambda log_r: log_r, "k1 is logprobs - ref_logprobs (= -log r with r = pi_ref / pi): the sign is flipped")],
    "k2": [(lambda log_r: log_r ** 2, "k2 is half the squared log-ratio: 0.5 * (ref_logprobs - logprobs)**2")],
    "k3": [(lambda log_r: math.exp(-log_r) - 1 + log_r, "k3's ratio is r = pi_ref / pi = exp(ref_logprobs - "
                                                          "logprobs); the other way up it estimates KL(pi_ref || pi)"),
           (lambda log_r: math.exp(log_r) - log_r, "k3 = r - 1 - log r: subtract the 1")],
}


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
    got = tuple(kl[MASK].tolist())
    assert got == tuple(near(per_token(x), scale=8) for x in log_r), explain(
        f"{estimator} per real token, with log_r = ref_logprobs - logprobs", got, tuple(map(per_token, log_r)),
        [(tuple(mistake(x) for x in log_r), text) for mistake, text in KL_MISTAKES[estimator]], scale=8)
    assert kl[~MASK].abs().max().item() == 0.0, "padded positions are 0"
    kl[MASK].sum().backward()
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all(), "a finite gradient reaches logprobs"
    assert logprobs.grad[~MASK].abs().max().item() == 0.0, "no gradient through padding"


@pytest.mark.ex8
def test_k3_in_float32_keeps_the_padding_junk_out_of_the_gradient(impl):
    """Log-probs of -300 at padding, a reference's -1 there: in float32, exp(-1 - (-300)) is inf, and
    exp taken before the padding is selected away sends 0 * inf = NaN back through the select (in
    float64, test_kl_estimators_hand_computed's, e^299 is finite)."""
    logprobs = with_junk(LOGPROBS.float(), MASK, junk=-300.0).requires_grad_()
    kl = attempt(impl, "compute_kl", logprobs, REF.float(), MASK, "k3")
    assert kl[~MASK].abs().max().item() == 0.0, "padded positions are 0"
    kl[MASK].sum().backward()
    assert torch.isfinite(logprobs.grad).all(), \
        "NaN or inf in the gradient at the padded position: exp(ref_logprobs - logprobs) overflows float32 on the " \
        "padding junk (inf above 88.7), and selecting it away afterwards still sends 0 * inf = NaN back to " \
        "logprobs: select the padding away before exp"
    assert logprobs.grad[~MASK].abs().max().item() == 0.0, "no gradient through padding"


@pytest.mark.ex8
def test_k3_has_no_clamp(impl):
    # log_r = ref_logprobs - logprobs = 4: k3 = e^4 - 5 = 49.6, past verl's clamp at 10
    logprobs = torch.tensor([[-5.0, -1.0]], dtype=torch.float64, requires_grad=True)
    ref, mask = torch.tensor([[-1.0, -1.0]], dtype=torch.float64), torch.tensor([[True, False]])
    kl = attempt(impl, "compute_kl", logprobs, ref, mask, "k3")
    assert kl[0, 0].item() == near(math.exp(4) - 5, scale=60), explain(
        "k3 = exp(log_r) - 1 - log_r at log_r = 4", kl[0, 0].item(), math.exp(4) - 5,
        [(10.0, "the contract's k3 has no clamp: verl clamps it to [-10, 10], which changes k3 and zeroes its "
                "gradient wherever k3 > 10")] + [(mistake(4.0), text) for mistake, text in KL_MISTAKES["k3"]], scale=60)
    kl[mask].sum().backward()
    assert logprobs.grad[0, 0].item() == near(1 - math.exp(4), scale=60), \
        "d k3 / d logprobs = 1 - exp(log_r): a clamp would make it 0 here"


@pytest.mark.ex8
def test_kl_refuses_an_unknown_estimator(impl):
    with pytest.raises(ValueError):
        attempt(impl, "compute_kl", LOGPROBS, REF, MASK, "k4")
        pytest.fail("compute_kl returned a value for 'k4', which is none of k1, k2 and k3: the contract raises "
                    "ValueError")

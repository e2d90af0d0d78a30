"""The five exercises against the contract itself (handout.md, section 4): hand-computed cases and the properties the
contract implies. Independent of the autograder.

Runs against ``--impl`` (see tests/conftest.py): your own ``assignment/exercises.py`` by
default, or any exercises file given by path. One exercise's tests: ``pytest tests/public -m ex3``.

Tolerances: the contract lets you compute in float32 even for float64 inputs and sum in any
order, so a value may differ from the exact one by a few float32 roundings. ``near`` allows
exactly that (its docstring derives it); exact comparisons remain where the contract makes a
result exact whatever the precision (junk in padding must change nothing, a count is a count).

Messages: a failing check says what it expected and what it got, and names a mistake only where
the value you returned is, on that test's inputs, what that mistake gives (``explain``): the values
of the common mistakes are worked out beside each test.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from assignment.helpers import logprobs_from_logits, masked_mean
from assignment.model import PolicyWithValueHead, tiny_llama

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
gen = torch.Generator().manual_seed(0)
U = 2.0 ** -24  # float32 unit roundoff


def near(expected, scale, roundings=32):
    """pytest.approx allowing what a float32 computation may err: ``roundings`` roundings (the
    casts, the arithmetic, a sum of up to ~20 terms in any order) of magnitudes up to ``scale``,
    u each, doubled because exp and log are accurate to one float32 ulp (2u), not u."""
    return pytest.approx(expected, rel=0, abs=2 * U * roundings * scale)


def same(got, value, scale, roundings=32) -> bool:
    """Whether ``got`` is ``value`` within ``near``'s rounding (a NaN is a NaN); sequences elementwise."""
    if isinstance(value, (list, tuple)):
        return len(got) == len(value) and all(same(g, v, scale, roundings) for g, v in zip(got, value))
    if math.isnan(value):
        return math.isnan(got)
    return got == near(value, scale, roundings)


def explain(what, got, expected, mistakes=(), scale=1.0, roundings=32) -> str:
    """A failing value's message: what was expected and what came, then the mistake whose value on
    these inputs ``got`` is, if exactly one of ``mistakes`` ((value, text) pairs, worked out beside
    each test) is: a message names a mistake only where the number shows it."""
    return f"{what}: expected {_fmt(expected)}, got {_fmt(got)}" + \
        the_one({text for value, text in mistakes if same(got, value, scale, roundings)})


def assert_near(got, want, scale, what="the values", mistakes=(), roundings=32):
    """Elementwise ``near``: any dtype of float32 or wider. ``mistakes``: (values, text) as in
    ``explain``, the text given when ``got`` is those values instead."""
    assert got.dtype in (torch.float32, torch.float64), f"dtype {got.dtype}: reduce in float32 or wider"
    bound = 2 * U * roundings * float(scale)
    got = got.detach().double()
    err = (got - want.double()).abs().max().item()
    assert err <= bound, f"{what}: largest error {err:.3g}" + \
        the_one({text for values, text in mistakes if (got - values.double()).abs().max().item() <= bound})


def the_one(texts: set) -> str:
    """The text of the one mistake a value shows, or nothing where several (or none) show it."""
    return f". {texts.pop()}" if len(texts) == 1 else ""


def _fmt(x) -> str:
    return "(" + ", ".join(map(_fmt, x)) + ")" if isinstance(x, (list, tuple)) else f"{x:.6g}"


def rand(*shape, scale=1.0, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=dtype) * scale


def with_junk(x, mask, junk=1234.5):
    """x with every padded position overwritten by junk."""
    return torch.where(mask, x, torch.full_like(x, junk))


# What the common mistakes are called when a value shows one (each test works out their values).
SIGN = "your loss has the opposite sign: the per-token loss is max(-A * ratio, -A * clamp(ratio)), and we minimise it"
MINIMUM = "you take the minimum of the two terms; the loss takes the maximum (the pessimistic bound)"
PADDED = "your mean includes padded positions: take the token-mean over the real tokens (masked_mean)"
EVERY_POSITION = "you zero the padding but divide by every position, B * T: divide by the number of real tokens"
ROW_MEANS = "you average per-row means; the token-mean divides the sum over all real tokens by their number"
NO_CLIPPED_TERM = "your loss ignores the clipped term: take the larger of -A * ratio and -A * clamp(ratio)"
STRICT = "use a strict > in clip_frac: where both terms are equal (ratio 1, or a ratio inside the clip range), " \
         "nothing is clipped"


# ---- exercise 1 ---------------------------------------------------------------------------

@pytest.mark.ex1
def test_policy_loss_hand_computed(impl):
    eps = 0.2
    new = torch.log(torch.tensor([[1.5, 0.5, 1.0], [1.1, 1.0, 9.0]], dtype=torch.float64))
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, -2.0, 3.0], [-1.0, 0.0, 5.0]], dtype=torch.float64)
    loss, clip_frac, kl = impl.compute_policy_loss(new, old, adv, MASK, eps)
    # per token: max(-A r, -A clamp(r)): (1.5, A=1) -> max(-1.5, -1.2) = -1.2 (clipped)
    # (0.5, A=-2) -> max(1.0, 1.6) = 1.6 (clipped); (1.0, A=3) -> -3; (1.1, A=-1) -> 1.1; (1.0, A=0) -> 0
    # padded (9, A=5): max(-45, -6) = -6. Mistakes: min(A r, A clip r) maximised gives +0.3; max(A r, A clip r)
    # 1.5 - 1 + 3 - 1.1 = 2.4 / 5; the minimum of the two terms -1.5 + 1 - 3 + 1.1 = -2.4 / 5, which -A * r alone
    # gives too (so neither is named: test_policy_clip_fraction_... tells them apart); A * r clamped to
    # [0.8, 1.2]: -1.2 + 1 - 1.2 + 1.1 + 0 = -0.3 / 5; the log-ratio clamped to [-0.2, 0.2]: -e^0.2 + 2 e^-0.2
    # - 3 + 1.1; the inverted ratio: -2/3 + 4 - 3 + 1/1.1; the mean over all 6 positions with the padded -6:
    # -7.5 / 6, with 0 there: -1.5 / 6; the rows' means: (-2.6 / 3 + 1.1 / 2) / 2
    expected = (-1.2 + 1.6 - 3.0 + 1.1 + 0.0) / 5
    assert loss.item() == near(expected, scale=5 * 9), explain(
        "loss: the token-mean over the 5 real tokens of max(-A * ratio, -A * clamp(ratio, 0.8, 1.2))", loss.item(),
        expected, [(0.3, SIGN), (2.4 / 5, SIGN), (-2.4 / 5, MINIMUM), (-2.4 / 5, NO_CLIPPED_TERM),
                   (-0.3 / 5, CLAMP_PRODUCT),
                   ((-math.exp(0.2) + 2 * math.exp(-0.2) - 1.9) / 5, CLAMP_LOG_RATIO),
                   ((-2 / 3 + 1 + 1 / 1.1) / 5, INVERTED), (-7.5 / 6, PADDED), (-1.5 / 6, EVERY_POSITION),
                   ((-2.6 / 3 + 1.1 / 2) / 2, ROW_MEANS)], scale=45)  # |A| * ratio <= 45
    # clipped (strict >): tokens 1 and 2; with >= the three whose terms are equal count too: 5 of 5; where the
    # unclipped term is the larger: none (with the loss right, the ratio is not inverted, nor the sign flipped)
    assert clip_frac.item() == near(2 / 5, scale=1), explain(
        "clip_frac: 2 of the 5 real tokens have the clipped term active", clip_frac.item(), 2 / 5,
        [(1.0, STRICT), (0.0, "clip_frac counts tokens where the clipped term is the larger one; yours counts those "
                              "where the unclipped one is")])
    # k1 = -log r per token; with k3 (r - 1 - log r) the tokens add 0.5 - 0.5 + 0.1 = 0.1 in all
    expected = -(math.log(1.5) + math.log(0.5) + 0 + math.log(1.1) + 0) / 5
    assert kl.item() == near(expected, scale=3), explain(
        "approx_kl: the token-mean of logprobs_old - logprobs_new", kl.item(), expected,
        [(expected + 0.1 / 5, "approx_kl is the k1 estimator, token-mean(logprobs_old - logprobs_new), not k3"),
         (-expected, "approx_kl is token-mean(logprobs_old - logprobs_new); yours is "
                     "token-mean(logprobs_new - logprobs_old)"),
         ((expected * 5 - math.log(9)) / 6, "your approx_kl includes padded positions: use masked_mean")])


CLAMP_PRODUCT = "you clamp A * ratio; clamp the ratio alone: -A * clamp(ratio, 1 - eps, 1 + eps)"
CLAMP_LOG_RATIO = "clamp the ratio to [1 - eps, 1 + eps], not the log-ratio to [-eps, eps]"
INVERTED = "your ratio is inverted: ratio = exp(logprobs_new - logprobs_old)"


@pytest.mark.ex1
def test_policy_clip_fraction_counts_only_tokens_where_the_clipped_term_is_active(impl):
    # ratio 1.5 outside [0.8, 1.2], but A < 0: the unclipped term -A * r = 1.5 is the larger, so
    # nothing is clipped; ratio 0.5 with A < 0: the clipped term -A * 0.8 = 0.8 is active.
    # Counting every ratio outside the range gives 2 of 2; clamping A * r (to 0.8, its terms -0.8)
    # clips none, with a loss of (1.5 + 0.5) / 2, which -A * r alone gives too; the minimum: (1.2 + 0.5) / 2
    new = torch.log(torch.tensor([[1.5, 0.5]], dtype=torch.float64))
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, clip_frac, _ = impl.compute_policy_loss(new, torch.zeros(1, 2, dtype=torch.float64),
                                                  torch.tensor([[-1.0, -1.0]], dtype=torch.float64), mask, 0.2)
    assert loss.item() == near((1.5 + 0.8) / 2, scale=2), explain(
        "loss: the larger of -A * ratio and -A * clamp(ratio)", loss.item(), (1.5 + 0.8) / 2,
        [(-1.15, SIGN), (-0.85, SIGN), (0.85, MINIMUM), (1.0, CLAMP_PRODUCT), (1.0, NO_CLIPPED_TERM), (1.4, INVERTED)],
        scale=2)
    assert clip_frac.item() == near(1 / 2, scale=1), explain(
        "clip_frac counts [-A * clamp(ratio) > -A * ratio]", clip_frac.item(), 1 / 2,
        [(1.0, "clip_frac counts tokens where the clipped term is active, not every ratio outside "
               "[1 - eps, 1 + eps]: with A < 0, a ratio above the range leaves the unclipped term the larger")])


@pytest.mark.ex1
def test_policy_loss_with_unit_ratio_is_minus_token_mean_advantage(impl):
    lp = rand(2, 3)
    adv = rand(2, 3)
    loss, clip_frac, kl = impl.compute_policy_loss(lp, lp.clone(), adv, MASK, 0.2)
    # ratio 1: every token's loss is -A; with the padded position, -mean over 6 or -sum over 5 / 6
    real = adv[MASK]
    assert loss.item() == near(-real.mean().item(), scale=adv.abs().max().item()), explain(
        "with ratio = 1 the loss is -token-mean(A) over the real tokens", loss.item(), -real.mean().item(),
        [(real.mean().item(), SIGN), (-adv.mean().item(), PADDED), (-real.sum().item() / 6, EVERY_POSITION),
         (-(real[:3].mean() + real[3:].mean()).item() / 2, ROW_MEANS)], scale=adv.abs().max().item())
    # new == old exactly: the log-ratio is 0 in any precision, so both metrics are exactly 0
    assert clip_frac.item() == 0.0, explain("with ratio = 1 nothing is clipped: clip_frac", clip_frac.item(), 0.0,
                                            [(1.0, STRICT)])
    assert kl.item() == 0.0, explain("with ratio = 1, approx_kl", kl.item(), 0.0)


@pytest.mark.ex1
def test_policy_loss_gradient_reaches_logprobs_new_and_metrics_carry_none(impl):
    new = rand(2, 3, scale=0.1).requires_grad_()
    loss, clip_frac, kl = impl.compute_policy_loss(new, rand(2, 3, scale=0.1), rand(2, 3), MASK, 0.2)
    assert loss.requires_grad, "the loss carries no gradient to logprobs_new; it must (do not detach it, nor compute " \
                               "it under torch.no_grad())"
    loss.backward()
    assert new.grad[MASK].abs().sum() > 0, "the loss must carry a gradient to logprobs_new"
    assert (new.grad[~MASK] == 0).all(), "the gradient at padded positions must be exactly 0: padding reaches the loss"
    for name, metric in (("clip_frac", clip_frac), ("approx_kl", kl)):
        assert not metric.requires_grad, f"{name} carries a gradient; the contract says it carries none " \
                                         f"(compute it under torch.no_grad() or .detach() it)"


@pytest.mark.ex1
def test_policy_loss_ignores_junk_in_padding(impl):
    new, old, adv = rand(2, 3, scale=0.3), rand(2, 3, scale=0.3), rand(2, 3)
    clean = impl.compute_policy_loss(new, old, adv, MASK, 0.2)
    # log-probs of pad tokens: as negative as real ones; exp of their difference stays finite in float32
    dirty = impl.compute_policy_loss(with_junk(new, MASK, 5.0), with_junk(old, MASK, -20.0), with_junk(adv, MASK), MASK, 0.2)
    for name, a, b in zip(("loss", "clip_frac", "approx_kl"), clean, dirty):
        assert a.item() == b.item(), f"{name} changed with the junk at padded positions: select padding away"


@pytest.mark.ex1
def test_policy_loss_stays_finite_for_extreme_log_probs(impl):
    """Log-probs of -110 (a rare token of a long response) and padding of -300 (the contract's junk):
    exp of them is 0 in float32, so exp(new) / exp(old) is 0 / 0 = NaN; exp(new - old) is not."""
    new = torch.tensor([[-110.0, -112.5, -300.0]])
    old = torch.tensor([[-110.5, -112.0, -300.0]])
    adv = torch.tensor([[1.0, -1.0, 50.0]])
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    new.requires_grad_()
    loss, clip_frac, kl = impl.compute_policy_loss(new, old, adv, mask, 0.2)
    # ratios e^0.5 (A = 1) and e^-0.5 (A = -1): max(-e^0.5, -1.2) = -1.2 and max(e^-0.5, 0.8) = 0.8; the padded
    # position has ratio 1 and A = 50, so a mean over all three positions adds -50 (a mean over 3 that skips it: 0).
    # The minimum of the terms: -e^0.5 + e^-0.5, -A * r alone too; the log-ratio clamped: -e^0.2 + e^-0.2; A * r
    # clamped to [0.8, 1.2]: -1.2 + e^-0.5
    division = ("exp(logprobs_new) / exp(logprobs_old) is 0 / 0 = NaN at log-probs this low (exp underflows to 0 in "
                "float32 below -103): compute ratio = exp(logprobs_new - logprobs_old)")
    # |log p| ~ 110 in float32: the log-ratio is exact (both are multiples of 0.5), exp adds 2 ulps
    assert loss.item() == near(-0.2, scale=2), explain(
        "loss with log-probs near -110", loss.item(), -0.2,
        [(math.nan, division), ((-0.4 - 50) / 3, PADDED), (-0.4 / 3, EVERY_POSITION), (0.2, SIGN),
         (-(math.exp(0.5) - math.exp(-0.5)) / 2, MINIMUM), (-(math.exp(0.5) - math.exp(-0.5)) / 2, NO_CLIPPED_TERM),
         ((-math.exp(0.2) + math.exp(-0.2)) / 2, CLAMP_LOG_RATIO),
         ((-1.2 + math.exp(-0.5)) / 2, CLAMP_PRODUCT)],
        scale=50)
    loss.backward()
    assert torch.isfinite(new.grad).all(), "NaN or inf in the gradient, at log-probs this low: " + division
    assert new.grad[0, 2] == 0, "the gradient at the padded position must be exactly 0: padding reaches the loss"


# ---- exercise 2 ---------------------------------------------------------------------------

HALF = "the value loss has a factor 0.5 in front of the token-mean"
VALUE_MINIMUM = "you take the minimum of the two squared errors; take the maximum"
NO_CLIP = "your value loss ignores the clipped term"
VALUE_STRICT = "use a strict > in clip_frac: where both squared errors are equal, nothing is clipped"


@pytest.mark.ex2
def test_value_loss_hand_computed(impl):
    v_new = torch.tensor([[1.0, 0.0, 0.5], [2.0, 0.0, 0.0]], dtype=torch.float64)
    v_old = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]], dtype=torch.float64)
    ret = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    loss, clip_frac = impl.compute_value_loss(v_new, v_old, ret, MASK, 0.2)
    # token 1: v_clip = 0.2, max(0, 0.64) = 0.64 (clipped); token 2: max(1, 1) = 1 (tie: not clipped)
    # token 3: v_clip = 0.2, max(0.25, 0.04) = 0.25; token 4: max(4, 4) = 4; token 5: 0
    # The minima 0 + 1 + 0.04 + 4 + 0; the unclipped errors alone 0 + 1 + 0.25 + 4 + 0; the rows' means
    # (1.89 / 3 + 4 / 2) / 2. With >=, the ties (tokens 2, 4, 5) count too: 4 of 5
    expected = 0.5 * (0.64 + 1 + 0.25 + 4 + 0) / 5
    assert loss.item() == near(expected, scale=4), explain(
        "loss: 0.5 * token-mean of the larger squared error (v_clip = values_old + clamp(change))", loss.item(),
        expected, [(2 * expected, HALF), (0.5 * 5.04 / 5, VALUE_MINIMUM), (0.5 * 5.25 / 5, NO_CLIP),
                   (0.5 * (1.89 / 3 + 2) / 2, ROW_MEANS)], scale=4)
    assert clip_frac.item() == near(1 / 5, scale=1), explain(
        "clip_frac: 1 of 5 tokens has the clipped error strictly larger", clip_frac.item(), 1 / 5,
        [(4 / 5, VALUE_STRICT)])


@pytest.mark.ex2
def test_value_loss_clips_the_change_around_values_old(impl):
    v_old = torch.tensor([[1.0, 1.0, -1.0, 0.0]], dtype=torch.float64)
    v_new = torch.tensor([[1.5, 1.5, -1.1, 1.0]], dtype=torch.float64)
    ret = torch.tensor([[2.0, 1.0, 0.5, 1.0]], dtype=torch.float64)
    loss, clip_frac = impl.compute_value_loss(v_new, v_old, ret, torch.ones(1, 4, dtype=torch.bool), 0.2)
    # token 1: v_clip = 1.2, max(0.25, 0.64) = 0.64, the clipped error is the larger: clipped
    # token 2: v_clip = 1.2, max(0.25, 0.04) = 0.25, the unclipped error is the larger: not clipped
    # token 3: the change -0.1 is inside the range: v_clip = v_new, equal errors 2.56: not clipped
    # token 4: v_clip = 0.2, max(0, 0.64) = 0.64: clipped
    # Mistakes: the returns clipped around values_old (1.2, 1, -0.8, 0.2) against values_new: errors
    # 0.09, 0.25, 0.09, 0.64, the larger 0.25 + 0.25 + 2.56 + 0.64, clipped tokens 4 only; values_new clipped
    # to [-0.2, 0.2]: errors 3.24, 0.64, 0.49, 0.64, the larger 3.24 + 0.64 + 2.56 + 0.64, clipped 1, 2 and 4;
    # the minima 0.25 + 0.04 + 2.56 + 0; the unclipped errors alone 0.25 + 0.25 + 2.56 + 0. Counting with >=,
    # or the tokens whose unclipped error is the larger, gives 3 of 4 and 1 of 4
    expected = 0.5 * (0.64 + 0.25 + 2.56 + 0.64) / 4
    returns_clipped = "you clip the returns around values_old; clip the value instead: v_clip = values_old + " \
                      "clamp(values_new - values_old, -c, c), compared with the returns"
    absolute = "you clip values_new itself to [-c, c]; clip its change around values_old: v_clip = values_old + " \
               "clamp(values_new - values_old, -c, c)"
    assert loss.item() == near(expected, scale=4), explain(
        "loss: clip the change values_new - values_old around values_old, then compare with the returns",
        loss.item(), expected,
        [(2 * expected, HALF), (0.5 * 3.7 / 4, returns_clipped), (0.5 * 7.08 / 4, absolute),
         (0.5 * 2.85 / 4, VALUE_MINIMUM), (0.5 * 3.06 / 4, NO_CLIP)], scale=4)
    assert clip_frac.item() == near(2 / 4, scale=1), explain(
        "clip_frac: tokens 1 and 4 have the clipped error strictly larger", clip_frac.item(), 2 / 4,
        [(3 / 4, VALUE_STRICT), (1 / 4, "clip_frac counts tokens where the clipped squared error is the larger one; "
                                        "yours counts those where the unclipped one is")])


@pytest.mark.ex2
def test_value_loss_gradient_reaches_values_new_and_ignores_junk(impl):
    v_new = rand(2, 3).requires_grad_()
    v_old, ret = rand(2, 3), rand(2, 3)
    loss, clip_frac = impl.compute_value_loss(v_new, v_old, ret, MASK, 0.2)
    assert loss.requires_grad, "the loss carries no gradient to values_new; it must"
    loss.backward()
    assert v_new.grad[MASK].abs().sum() > 0, "the loss must carry a gradient to values_new"
    assert (v_new.grad[~MASK] == 0).all(), \
        "the gradient at padded positions must be exactly 0: padding reaches the loss"
    assert not clip_frac.requires_grad, "clip_frac carries a gradient; the contract says it carries none"
    dirty = impl.compute_value_loss(with_junk(v_new.detach(), MASK), with_junk(v_old, MASK, -9.0), with_junk(ret, MASK), MASK, 0.2)
    assert dirty[0].item() == loss.item() and dirty[1].item() == clip_frac.item(), \
        "junk at padded positions changed the result: select padding away"


# ---- exercise 3 ---------------------------------------------------------------------------

ENTROPY_SIGN = "your entropy loss has the opposite sign: it is -token-mean(H), so that minimising it raises the entropy"


@pytest.mark.ex3
@pytest.mark.parametrize("vocab", [2, 7, 50257])
def test_uniform_logits_give_entropy_loss_minus_log_v(impl, vocab):
    logits = torch.full((2, 3, vocab), 3.7)
    # Every token's entropy is log V, the padded one's too. Mistakes: +log V; 5 tokens over 6 positions;
    # the mean of p z over V (z = 3.7) instead of its sum: H = log V + 3.7 - 3.7 / V; a softmax over the 3
    # positions instead of the vocabulary: p = 1/3, sum p z = 3.7 V / 3
    log_v = math.log(vocab)
    got = impl.compute_entropy_loss(logits, MASK).item()
    # a sum of V exponentials: up to V roundings of the partial sums, each at most V
    assert got == near(-log_v, scale=log_v + 4, roundings=vocab + 32), explain(
        f"uniform logits over {vocab} tokens: the entropy is log V, the loss -log V", got, -log_v,
        [(log_v, ENTROPY_SIGN), (-log_v * 5 / 6, EVERY_POSITION),
         (-(log_v + 3.7 - 3.7 / vocab), "sum p * z over the vocabulary, not the mean"),
         (-(log_v + 3.7 - 3.7 * vocab / 3), "take the softmax over the vocabulary (dim=-1), not over the response's "
                                            "positions")],
        scale=log_v + 4, roundings=vocab + 32)


@pytest.mark.ex3
def test_entropy_loss_hand_computed(impl):
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    logits = torch.log(p).expand(2, 3, 3).clone()
    h = -(p * p.log()).sum().item()
    got = impl.compute_entropy_loss(logits, MASK).item()
    assert got == near(-h, scale=2), explain("the loss is -token-mean(H), H = -sum(p log p) over the vocabulary",
                                             got, -h, [(h, ENTROPY_SIGN), (-h * 5 / 6, EVERY_POSITION)], scale=2)


@pytest.mark.ex3
def test_entropy_loss_is_the_token_mean_of_entropies_that_differ(impl):
    """Tokens of different entropies in rows of different lengths: the token-mean, a mean of the
    rows' means and a mean over every position all differ here (with equal entropies they do not)."""
    probs = torch.tensor([[[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3], [0.8, 0.1, 0.1]],
                          [[0.6, 0.3, 0.1], [0.98, 0.01, 0.01], [0.2, 0.2, 0.6]]], dtype=torch.float64)
    h = -(probs * probs.log()).sum(-1)  # (2, 3): each token's entropy, the padded one's included
    real = h[MASK]
    rows = (h[0].sum() / 3 + h[1, :2].sum() / 2) / 2
    got = impl.compute_entropy_loss(probs.log(), MASK).item()
    assert got == near(-real.mean().item(), scale=2), explain(
        "the loss is -token-mean(H) over the 5 real tokens", got, -real.mean().item(),
        [(-rows.item(), ROW_MEANS), (-h.mean().item(), PADDED), (-real.sum().item() / 6, EVERY_POSITION),
         (real.mean().item(), ENTROPY_SIGN)], scale=2)


@pytest.mark.ex3
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entropy_stays_finite_for_logits_of_magnitude_1e3(impl, dtype):
    logits = (rand(2, 3, 11, dtype=torch.float32) * 1e3).to(dtype)
    loss = impl.compute_entropy_loss(logits, MASK)
    assert torch.isfinite(loss), "the loss is not finite for logits of magnitude 1e3: log(softmax(z)) underflows " \
                                 "(softmax is 0 far below the maximum: 0 * log 0 = NaN), or exp(z) overflows. Compute " \
                                 "it stably: logsumexp(z) - sum(softmax(z) * z)"
    assert loss.dtype in (torch.float32, torch.float64), "reduce in float32 or wider"
    # An entropy is >= 0, up to rounding: H = logsumexp(z) - sum(p z) subtracts two values of size
    # up to M = max|z|, each a float32 sum over V terms no larger than M (at most (V + 3) u M off),
    # so H, and the token mean of such H, is at least -(2V + 6) u M (the logits' own rounding to
    # bfloat16 happened before the call: these are the logits the entropy is of).
    M, V = float(logits.float().abs().max()), logits.shape[-1]
    assert -loss.item() >= -(2 * V + 6) * U * M, "an entropy is never negative"


@pytest.mark.ex3
def test_entropy_of_bfloat16_logits_is_computed_in_float32_or_wider(impl):
    logits = (rand(2, 3, 11, dtype=torch.float32) * 3).to(torch.bfloat16)
    z = logits.double()  # the exact values of the bfloat16 logits
    h = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)
    expected = -h[MASK].mean().item()
    # float32 arithmetic errs by u (M (V + 2 log V + 8) + V + 8) per token (M = max |z| <= ~12);
    # bfloat16 arithmetic by 2^-8 relative: a thousand times more
    got = impl.compute_entropy_loss(logits, MASK).item()
    if got != near(expected, scale=12, roundings=64):
        # the same numbers as float32 logits: only the arithmetic's precision differs
        as_float32 = impl.compute_entropy_loss(logits.float(), MASK).item()
        pytest.fail(explain("bfloat16 logits", got, expected) + (
            ". The same logits in float32 give the right loss: upcast the logits to float32 before the softmax and "
            "the sums" if as_float32 == near(expected, scale=12, roundings=64) else
            f". The same logits in float32 give {as_float32:.6g}, wrong too: not a matter of precision, see the "
            f"other tests of exercise 3"))


@pytest.mark.ex3
def test_entropy_ignores_junk_rows_in_padding(impl):
    logits = rand(2, 3, 5)
    dirty = logits.clone()
    dirty[1, 2] = 1e4
    assert impl.compute_entropy_loss(logits, MASK).item() == impl.compute_entropy_loss(dirty, MASK).item(), \
        "junk logits at a padded position changed the loss: select padding away"


# ---- exercise 4 ---------------------------------------------------------------------------

def raw_advantages(impl, final_rewards, kl, values, mask, gamma, lam):
    """Unwhitened advantages, recovered from the contract's returns = A + values. Returns built from
    the whitened advantages are said so here: every test of the raw ones would fail on them."""
    advantages, returns = impl.compute_gae_advantages(final_rewards, kl, values, mask, gamma, lam)
    raw = returns - values
    whitened = advantages[mask].double()  # mean 0 and variance 1 when the whitening is right, up to float32
    is_whitened = whitened.mean().abs() <= 1e-6 and (whitened.var() - 1).abs() <= 1e-6
    assert not (is_whitened and (raw[mask].double() - whitened).abs().max() <= 1e-6), \
        "returns - values are your whitened advantages: compute the returns from the unwhitened advantages, " \
        "returns = A + values, before whitening"
    return raw


FINAL_REWARD = "final_rewards goes at each row's last real token (index L_b - 1), added to its -kl_penalties"


@pytest.mark.ex4
def test_gae_hand_computed(impl):
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    v = torch.tensor([[0.5, 0.25, 9.0]], dtype=torch.float64)
    kl = torch.tensor([[0.1, 0.2, 9.0]], dtype=torch.float64)
    R, gamma, lam = torch.tensor([1.0], dtype=torch.float64), 0.9, 0.5
    # t=1: r = -0.2 + 1 = 0.8, delta = 0.8 - 0.25 = 0.55, A = 0.55
    # t=0: r = -0.1, delta = -0.1 + 0.9*0.25 - 0.5 = -0.375, A = -0.375 + 0.45*0.55 = -0.1275
    A = raw_advantages(impl, R, kl, v, mask, gamma, lam)
    # Mistakes (A_1, A_0): the final reward at T - 1 (padding) or at t = 0: A_1 = -0.2 - 0.25 = -0.45, and A_0 =
    # -0.375 + 0.45 * -0.45 or -0.1 + 1 + 0.225 - 0.5 + 0.45 * -0.45; assigned over the -kl: A_1 = 1 - 0.25 = 0.75,
    # A_0 = -0.375 + 0.45 * 0.75; +kl: A_1 = 0.2 + 1 - 0.25 = 0.95, A_0 = 0.1 + 0.225 - 0.5 + 0.45 * 0.95; V_2 and
    # A_2 from padding without m_2: A_2 = 9 - 9 = 0, A_1 = 0.8 + 0.9 * 9 - 0.25 = 8.65, A_0 = -0.375 + 0.45 * 8.65;
    # a forward loop, carrying t - 1's value and advantage where t + 1's belong: A_0 = -0.1 - 0.5 = -0.6, A_1 =
    # 0.8 + 0.9 * 0.5 - 0.25 + 0.45 * -0.6; gamma and lam swapped: A_0 = -0.1 + 0.5 * 0.25 - 0.5 + 0.45 * 0.55;
    # the trace decayed by lam alone: A_0 = -0.375 + 0.5 * 0.55
    got = (A[0, 1].item(), A[0, 0].item())
    mistakes = [((-0.45, -0.375 - 0.45 * 0.45), FINAL_REWARD + ", not at T - 1"),
                ((-0.45, 0.625 - 0.45 * 0.45), FINAL_REWARD + ", not at its first token"),
                ((0.75, -0.375 + 0.45 * 0.75), "add final_rewards to the last real token's -kl_penalties; yours "
                                               "overwrites it"),
                ((0.95, -0.175 + 0.45 * 0.95), "the token reward is -kl_penalties: the KL penalty lowers the reward"),
                ((8.65, -0.375 + 0.45 * 8.65), "multiply V_{t+1} and A_{t+1} by the next position's mask m_{t+1}: "
                                               "the padding's values leak into the last real token"),
                ((1.0 - 0.45 * 0.6, -0.6), "your loop runs forward, t = 0, 1, ...: A_t is defined through A_{t+1}; "
                                           "run it backwards: for t in reversed(range(T))"),
                ((0.55, -0.475 + 0.45 * 0.55), "gamma and lam are swapped"),
                ((0.55, -0.375 + 0.5 * 0.55), "the advantage trace decays by gamma * lam: A_t = delta_t + gamma * lam "
                                              "* m_{t+1} * A_{t+1}")]
    assert got == (near(0.55, scale=1), near(-0.1275, scale=1)), explain(
        "(A_1, A_0): the final reward at the last real token (index L - 1 = 1), then A_0 = delta_0 + gamma * lam * A_1",
        got, (0.55, -0.1275), mistakes, scale=10)


@pytest.mark.ex4
def test_gae_with_lambda_zero_gives_td_errors(impl):
    values, kl = rand(2, 3), rand(2, 3, scale=0.1)
    R = rand(2)
    A = raw_advantages(impl, R, kl, values, MASK, 0.8, 0.0)
    m = MASK.double()
    r = -kl * m
    r[0, 2] += R[0]
    r[1, 1] += R[1]
    next_v = torch.cat([values[:, 1:] * m[:, 1:], torch.zeros(2, 1, dtype=torch.float64)], dim=1)
    delta = r + 0.8 * next_v - values
    # row 0 is as long as the batch: a loop that never reaches t = T - 1 leaves A there 0, and t = T - 2 then
    # bootstraps from nothing
    skipped = delta.clone()
    skipped[:, -1], skipped[:, -2] = 0.0, (r - values)[:, -2]
    assert_near(A[MASK], delta[MASK], scale=values.abs().max() + R.abs().max() + 1,
                what="with lam = 0, returns - values must be the TD errors delta_t",
                mistakes=[(skipped[MASK], "your loop never computes the last position t = T - 1 (A_{T-1} stays 0): "
                                          "loop over reversed(range(T))")])


@pytest.mark.ex4
def test_gae_with_gamma_lambda_one_and_zero_values_gives_reward_to_go(impl):
    kl = rand(2, 3, scale=0.1)
    R = torch.tensor([1.0, -2.0], dtype=torch.float64)
    _, returns = impl.compute_gae_advantages(R, kl, torch.zeros(2, 3, dtype=torch.float64), MASK, 1.0, 1.0)
    r = -kl * MASK
    r[0, 2] += 1.0
    r[1, 1] -= 2.0
    to_go = r.flip(1).cumsum(1).flip(1)
    assert_near(returns[MASK], to_go[MASK], scale=3, what="with gamma = lam = 1 and V = 0, the returns are the reward-to-go")


def whitening_mistakes(raw, mask):
    """(values, text) of the whitening mistakes, from the raw advantages (B, T) on real tokens: the
    population variance (n), no mean subtracted, no whitening, and the padded positions (0 in a loop
    that masks them) counted in the mean and variance."""
    x = raw[mask]
    padded = torch.where(mask, raw, 0.0)
    everywhere = ((padded - padded.mean()) / torch.sqrt(padded.var() + 1e-8))[mask]
    return [((x - x.mean()) / torch.sqrt(x.var(unbiased=False) + 1e-8),
             "you divide by n (the population variance); whitening uses Bessel's correction, n - 1: masked_whiten"),
            (x / torch.sqrt(x.var() + 1e-8), "subtract the mean before dividing by the std (masked_whiten)"),
            (x, "the advantages must be whitened over the real tokens of the batch (masked_whiten)"),
            (everywhere, "whiten over the real tokens only (masked_whiten(advantages, response_mask)): your mean and "
                         "variance count the padded positions too")]


@pytest.mark.ex4
def test_gae_whitening_over_real_tokens_with_bessel_correction_and_no_gradient(impl):
    values = rand(2, 3).requires_grad_()
    adv, returns = impl.compute_gae_advantages(rand(2), rand(2, 3, scale=0.1), values, MASK, 1.0, 0.95)
    raw = (returns - values).detach()
    x = raw[MASK]
    expected = (x - x.mean()) / torch.sqrt(x.var(unbiased=True) + 1e-8)
    # whitening divides the raw errors by the standard deviation
    assert_near(adv[MASK], expected, scale=(x.abs().max() + 1) / x.std(),
                what="whitened advantages: mean and variance over the real tokens only, variance with n - 1",
                mistakes=whitening_mistakes(raw, MASK))
    assert not adv.requires_grad and not returns.requires_grad, "the advantages and returns must carry no gradient"


@pytest.mark.ex4
def test_gae_empty_rows_and_junk_in_padding(impl):
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    R, kl, v = rand(3), rand(3, 4, scale=0.1), rand(3, 4)
    clean = impl.compute_gae_advantages(R, kl, v, mask, 0.99, 0.95)
    dirty = impl.compute_gae_advantages(R, with_junk(kl, mask), with_junk(v, mask, -77.0), mask, 0.99, 0.95)
    for name, a, b in zip(("advantages", "returns"), clean, dirty):
        assert torch.isfinite(a[mask]).all(), f"{name} are not finite on real tokens (an empty row must give nothing)"
        # the same real values: the same arithmetic, exactly
        assert torch.equal(a[mask], b[mask]), f"junk at padded positions changed the {name}: multiply V_(t+1) and " \
                                              f"A_(t+1) by the next position's mask m_(t+1)"
    # the single-token row: A = R - kl - V (nothing after it)
    raw = clean[1] - v
    assert raw[2, 0].item() == near((R[2] - kl[2, 0] - v[2, 0]).item(), scale=4), \
        "a one-token row: A = final reward - kl - V, nothing after it"


@pytest.mark.ex4
def test_gae_whitening_ignores_padded_positions(impl):
    """The mean and variance of the whitening are taken over the real tokens only: padding (where
    the raw advantages are whatever the loop left, 0 in the reference) must not count."""
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    R, kl, v = torch.tensor([1.0, -1.0], dtype=torch.float64), rand(2, 4, scale=0.1), rand(2, 4)
    adv, returns = impl.compute_gae_advantages(R, kl, v, mask, 1.0, 1.0)
    raw = returns - v
    x = raw[mask]
    expected = (x - x.mean()) / torch.sqrt(x.var(unbiased=True) + 1e-8)
    assert_near(adv[mask], expected, scale=(x.abs().max() + 1) / x.std(),
                what="whitened advantages: mean and variance over the 5 real tokens only",
                mistakes=whitening_mistakes(raw, mask))


# ---- exercise 5 ---------------------------------------------------------------------------
#
# Exercise 5 calls your exercises 1-3 by their module-level names. Its tests put simple stand-ins
# in their place (``stand_ins``): functions of every argument they get, not the contract's, which
# record what exercise 5 passed them and what they answered. So these tests check exercise 5
# alone, whatever your exercises 1-3 compute (their own tests check those), and a failure here is
# exercise 5's.

CFG = SimpleNamespace(temperature=0.7, clip_ratio=0.2, clip_range_value=0.2, vf_coeff=0.5,
                      entropy_coeff=0.01, grad_accum_steps=2, max_grad_norm=1.0)


def make_minibatch(model, B=3, P=4, T=5, seed=0):
    """A minibatch whose old log-probs and values come from ``model`` itself (ratio = 1)."""
    g = torch.Generator().manual_seed(seed)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    response_mask = torch.ones(B, T, dtype=torch.long)
    response_mask[1, 3:] = 0  # right padding
    response_mask[2, 1:] = 0
    ids = torch.randint(0, 64, (B, P + T), generator=g)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    with torch.no_grad():
        logits, values = model(ids, attention_mask)
    logprobs = logprobs_from_logits(logits[:, P - 1 : P + T - 1] / CFG.temperature, ids[:, P:])
    return dict(input_ids=ids, attention_mask=attention_mask, response_ids=ids[:, P:], response_mask=response_mask,
                logprobs_old=logprobs, values_old=values[:, P - 1 : P + T - 1].clone(),
                advantages=torch.randn(B, T, generator=g, dtype=torch.float64),
                returns=torch.randn(B, T, generator=g, dtype=torch.float64), prompt_length=P)


@pytest.fixture
def policy():
    model = PolicyWithValueHead(tiny_llama(seed=0, dtype=torch.float64)).double()
    with torch.no_grad():  # a random value head (the trainer starts at 0), so that values differ by position
        model.value_head.weight.copy_(torch.randn(model.value_head.weight.shape, generator=torch.Generator().manual_seed(1),
                                                  dtype=torch.float64))
    return model


class StandIns:
    """Exercises 1-3 while exercise 5 runs: each answers with simple functions of every argument
    (not the contract's) and records, per call, what it got and what it answered."""

    def __init__(self):
        self.calls: dict[str, list[dict]] = {"compute_policy_loss": [], "compute_value_loss": [],
                                             "compute_entropy_loss": []}

    def compute_policy_loss(self, logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
        moved = logprobs_new - logprobs_old
        out = (masked_mean(-advantages * moved, response_mask) + clip_ratio,
               masked_mean((moved.abs() > 1e-3).double(), response_mask).detach(),
               masked_mean(-moved, response_mask).detach())
        self.calls["compute_policy_loss"].append(dict(locals()))
        return out

    def compute_value_loss(self, values_new, values_old, returns, response_mask, clip_range_value):
        moved = values_new - values_old
        out = (masked_mean(moved * returns, response_mask) + clip_range_value,
               masked_mean((moved.abs() > clip_range_value).double(), response_mask).detach())
        self.calls["compute_value_loss"].append(dict(locals()))
        return out

    def compute_entropy_loss(self, logits, response_mask):
        out = masked_mean(torch.logsumexp(logits, dim=-1), response_mask)
        self.calls["compute_entropy_loss"].append(dict(locals()))
        return out

    def last(self, name: str) -> dict:
        assert self.calls[name], f"exercise 5 did not call {name}: call exercises 1-3 by their module-level names " \
                                 f"(hint 5.3)"
        return self.calls[name][-1]


@pytest.fixture
def stand_ins(impl, monkeypatch):
    """The stand-ins in the place of ``impl``'s exercises 1-3, for one test."""
    standing = StandIns()
    for name in standing.calls:
        monkeypatch.setattr(impl, name, getattr(standing, name))
    return standing


def sliced(model, mb, shift=0, scale=None):
    """The response slice of ``model``'s outputs on ``mb``, ``shift`` positions late, the logits
    multiplied by ``scale`` (default 1 / cfg.temperature): (logits (B, T, V), values (B, T), log-probs (B, T))."""
    P, T = mb["prompt_length"], mb["response_ids"].shape[1]
    with torch.no_grad():
        logits, values = model(mb["input_ids"], mb["attention_mask"])
    z = logits[:, P - 1 + shift : P + T - 1 + shift] * (1 / CFG.temperature if scale is None else scale)
    return z, values[:, P - 1 + shift : P + T - 1 + shift], logprobs_from_logits(z, mb["response_ids"])


def logprob_roundings(model, mb):
    """How many float32 roundings of unit size a log-prob computed in float32 may carry here:
    2 max|z| + V + 2 log V + 8 (the temperature division, the shift by the maximum, a sum of V
    exponentials, the log, the gather), with z the sliced, tempered logits."""
    z = sliced(model, mb)[0]
    V = z.shape[-1]
    return 2 * z.abs().max().item() + V + 2 * math.log(V) + 8


def grads(model):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()])


SLICE = "your slice is off by one: the logits and values of response token t sit at P - 1 + t, [P-1 : P+T-1]"
TEMPERATURE = "divide the sliced logits by cfg.temperature, as the rollout did"


@pytest.mark.ex5
def test_minibatch_update_passes_exercises_1_to_3_the_sliced_tempered_logits_and_values(impl, policy, stand_ins):
    """Exercise 1 gets the log-probs of logits[:, P-1 : P+T-1] / cfg.temperature, which equal
    logprobs_old here (the minibatch was made by this model: ratio 1); exercise 3 the same logits;
    exercise 2 values[:, P-1 : P+T-1]; each its minibatch tensors and cfg's value as they are."""
    mb = make_minibatch(policy)
    k = logprob_roundings(policy, mb)
    impl.ppo_minibatch_update(policy, torch.optim.SGD(policy.parameters(), lr=0.1), mb, CFG, step_optimizer=False)
    late, untempered = sliced(policy, mb, shift=1), sliced(policy, mb, scale=1.0)
    times, twice = sliced(policy, mb, scale=CFG.temperature), sliced(policy, mb, scale=CFG.temperature ** -2)
    mask = mb["response_mask"].bool()
    policy_call, value_call = stand_ins.last("compute_policy_loss"), stand_ins.last("compute_value_loss")
    entropy_call = stand_ins.last("compute_entropy_loss")

    def check(what, got, want, alternatives, scale=1.0):  # on real tokens, within k roundings
        assert_near(got[mask], want[mask], scale, what, [(values[mask], text) for values, text in alternatives], k)

    check("logprobs_new passed to compute_policy_loss: the log-softmax of logits[:, P-1 : P+T-1] / cfg.temperature "
          "gathered at response_ids, here logprobs_old (ratio 1)", policy_call["logprobs_new"], mb["logprobs_old"],
          [(late[2], SLICE), (untempered[2], TEMPERATURE),
           (times[2], "you multiply the logits by cfg.temperature; divide them"),
           (twice[2], "you divide by cfg.temperature twice: once is what the rollout did")])
    z = sliced(policy, mb)[0]
    check("logits passed to compute_entropy_loss: logits[:, P-1 : P+T-1] / cfg.temperature", entropy_call["logits"], z,
          [(late[0], SLICE), (times[0], "you multiply the logits by cfg.temperature; divide them"),
           (untempered[0], "the entropy takes the same tempered logits as the log-probs: logits[:, P-1 : P+T-1] / "
                           "cfg.temperature")], scale=z.abs().max().item())
    check("values_new passed to compute_value_loss: values[:, P-1 : P+T-1]", value_call["values_new"],
          sliced(policy, mb)[1], [(late[1], "your values slice is off by one: the value of response token t sits at "
                                            "P - 1 + t")], scale=mb["values_old"].abs().max().item())
    for call, key in ((policy_call, "logprobs_old"), (policy_call, "advantages"), (value_call, "values_old"),
                      (value_call, "returns")):
        assert torch.equal(call[key], mb[key]), f"{key} passed on is not the minibatch's {key}"
    assert (policy_call["clip_ratio"], value_call["clip_range_value"]) == (CFG.clip_ratio, CFG.clip_range_value), \
        "pass cfg.clip_ratio to exercise 1 and cfg.clip_range_value to exercise 2"


@pytest.mark.ex5
def test_minibatch_update_reports_what_exercises_1_to_3_answered(impl, policy, stand_ins):
    mb = make_minibatch(policy)
    metrics = impl.ppo_minibatch_update(policy, torch.optim.SGD(policy.parameters(), lr=0.1), mb, CFG, False)
    assert set(metrics) == {"loss/policy", "loss/value", "loss/entropy", "loss/total",
                            "stats/policy_clipfrac", "stats/value_clipfrac", "stats/approx_kl"}, \
        "the metric keys of the contract (stats/grad_norm only when it stepped)"
    assert all(type(v) is float for v in metrics.values()), "every metric is a Python float (.item())"
    (policy_loss, policy_clipfrac, approx_kl) = stand_ins.last("compute_policy_loss")["out"]
    value_loss, value_clipfrac = stand_ins.last("compute_value_loss")["out"]
    entropy_loss = stand_ins.last("compute_entropy_loss")["out"]
    answered = {"loss/policy": policy_loss, "loss/value": value_loss, "loss/entropy": entropy_loss,
                "stats/policy_clipfrac": policy_clipfrac, "stats/value_clipfrac": value_clipfrac,
                "stats/approx_kl": approx_kl}
    for key, value in answered.items():
        assert metrics[key] == value.item(), f"{key} is not what exercises 1-3 returned for it"
    p, v, e = policy_loss.item(), value_loss.item(), entropy_loss.item()
    total = p + CFG.vf_coeff * v + CFG.entropy_coeff * e
    # one sum of three terms: a few roundings of the largest
    assert metrics["loss/total"] == near(total, scale=abs(p) + abs(v) + abs(e), roundings=4), explain(
        "loss/total = policy + vf_coeff * value + entropy_coeff * entropy", metrics["loss/total"], total,
        [(p + v + CFG.entropy_coeff * e, "weight the value loss by cfg.vf_coeff"),
         (p + CFG.vf_coeff * v, "add cfg.entropy_coeff * entropy_loss to the total loss"),
         (p + CFG.vf_coeff * v - CFG.entropy_coeff * e, "add cfg.entropy_coeff * entropy_loss (the entropy loss is "
                                                         "already -H); yours subtracts it")],
        scale=abs(p) + abs(v) + abs(e), roundings=4)


@pytest.mark.ex5
def test_minibatch_update_accumulates_then_steps_clips_and_zeroes(impl, policy, stand_ins):
    mb = make_minibatch(policy)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    before = [p.detach().clone() for p in policy.parameters()]
    impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=False)
    assert all(torch.equal(a, p) for a, p in zip(before, policy.parameters())), \
        "the optimizer stepped in a call with step_optimizer=False: step it only when step_optimizer is true"
    first = grads(policy).clone()
    impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=False)
    assert torch.allclose(grads(policy), 2 * first), "the second call's gradients are not added to the first's" + (
        ": you zero the gradients at the start of every call, which throws away the earlier minibatches of an "
        "accumulation cycle; zero them only after optimizer.step()" if torch.allclose(grads(policy), first) else "")
    total = first.norm()
    metrics = impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=True)
    # three times the same float64 computation: equal up to float64 rounding of their sum
    assert metrics["stats/grad_norm"] == pytest.approx(3 * total.item(), rel=1e-9), explain(
        "stats/grad_norm is clip_grad_norm_'s return value, before clipping", metrics["stats/grad_norm"],
        3 * total.item(), [(0.0, "you zero the gradients before clipping and stepping: call optimizer.zero_grad() "
                                 "after optimizer.step()")])
    assert all(p.grad is None or (p.grad == 0).all() for p in policy.parameters()), \
        "gradients are left after the step: call optimizer.zero_grad() after optimizer.step()"
    moved = torch.cat([(p.detach() - a).flatten() for p, a in zip(policy.parameters(), before)]).norm()
    # clip_grad_norm_ scales by max_norm / (norm + 1e-6): off by 1e-6 / norm ~ 1e-7 relative here
    assert moved.item() == pytest.approx(0.1 * CFG.max_grad_norm, rel=1e-6), \
        f"the step moved the parameters by {moved.item():.4g}, not lr * max_grad_norm = {0.1 * CFG.max_grad_norm:g}: " \
        f"clip the gradient norm with clip_grad_norm_(model.parameters(), cfg.max_grad_norm) before optimizer.step()"


@pytest.mark.ex5
def test_minibatch_update_divides_by_grad_accum_steps(impl, policy, stand_ins):
    """The absolute gradient scale: one call with grad_accum_steps = 1 gives exactly twice the
    gradient of the same call with grad_accum_steps = 2 (halving is exact in floating point)."""
    mb = make_minibatch(policy)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    impl.ppo_minibatch_update(policy, opt, mb, SimpleNamespace(**dict(vars(CFG), grad_accum_steps=1)), False)
    whole = grads(policy)
    policy.zero_grad()
    impl.ppo_minibatch_update(policy, opt, mb, SimpleNamespace(**dict(vars(CFG), grad_accum_steps=2)), False)
    assert torch.equal(whole, 2 * grads(policy)), "divide the loss by cfg.grad_accum_steps before backward()"


@pytest.mark.ex5
@pytest.mark.parametrize("coeff, loss", [("vf_coeff", "loss/value"), ("entropy_coeff", "loss/entropy")])
def test_minibatch_update_weights_each_loss_by_its_coefficient(impl, policy, stand_ins, coeff, loss):
    """The gradient is linear in each coefficient, and the weighted loss does reach the model."""
    mb = make_minibatch(policy)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    at, totals = {}, {}
    for value in (0.0, 0.5, 1.0):
        policy.zero_grad()
        metrics = impl.ppo_minibatch_update(policy, opt, mb, SimpleNamespace(**dict(vars(CFG), **{coeff: value})), False)
        at[value], totals[value] = grads(policy), metrics["loss/total"]
        assert at[value].abs().max() > 0, "no gradient is left after a call with step_optimizer=False: step (and " \
                                          "zero the gradients) only when step_optimizer is true"
    step = at[1.0] - at[0.0]
    if not step.abs().max() > 0:
        pytest.fail(f"cfg.{coeff} changes no gradient" + (
            f": loss/total changes with it, so its loss is in the total but not in what you call backward() on; "
            f"backward() the total loss, not the policy loss alone" if totals[1.0] != totals[0.0] else
            f": weight {loss} by cfg.{coeff}, in the total that backward() gets"))
    # every gradient is a sum of float32-or-wider terms: a few roundings of the largest one
    assert (step - 2 * (at[0.5] - at[0.0])).abs().max() <= 2 * U * 64 * max(g.abs().max() for g in at.values()), \
        f"the gradient is not linear in cfg.{coeff}: multiply its loss by it once"


@pytest.mark.ex5
def test_minibatch_update_skips_the_step_on_a_non_finite_gradient(impl, policy, stand_ins):
    mb = make_minibatch(policy)
    mb["advantages"] = torch.full_like(mb["advantages"], float("inf"))  # the stand-in's policy loss: -inf * 0 = NaN
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=True)
    assert not math.isfinite(metrics["stats/grad_norm"]), explain(
        "stats/grad_norm must report the non-finite norm", metrics["stats/grad_norm"], math.inf,
        [(0.0, "you zero the gradients before clipping and stepping: call optimizer.zero_grad() after "
               "optimizer.step()")])
    assert all(torch.equal(a, p) for a, p in zip(before, policy.parameters())), \
        "the optimizer stepped on a non-finite gradient: clip the gradient norm first (grad_norm = " \
        "clip_grad_norm_(...)), then step only if grad_norm is finite"
    assert all(p.grad is None or (p.grad == 0).all() for p in policy.parameters()), "zero_grad after a skipped step too"


@pytest.mark.ex5
def test_minibatch_update_ignores_junk_in_padding(impl, policy, stand_ins):
    mb = make_minibatch(policy)
    mask = mb["response_mask"].bool()
    dirty = dict(mb, **{k: with_junk(mb[k], mask) for k in ("logprobs_old", "values_old", "advantages", "returns")})
    a = impl.ppo_minibatch_update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), mb, CFG, False)
    policy.zero_grad()
    b = impl.ppo_minibatch_update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), dirty, CFG, False)
    assert a == b, "junk at padded positions changed the metrics: select padding away"

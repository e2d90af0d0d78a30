"""The five exercises against the contract itself (handout.md, section 4): hand-computed cases and the properties the
contract implies. Independent of the autograder.

Runs against ``--impl`` (see tests/conftest.py): your own ``assignment/exercises.py`` by
default, or any exercises file given by path. One exercise's tests: ``pytest tests/public -m ex3``.

Tolerances: the contract lets you compute in float32 even for float64 inputs and sum in any
order, so a value may differ from the exact one by a few float32 roundings. ``near`` allows
exactly that (its docstring derives it); exact comparisons remain where the contract makes a
result exact whatever the precision (junk in padding must change nothing, a count is a count).
"""

import math
from types import SimpleNamespace

import pytest
import torch

from assignment.helpers import logprobs_from_logits
from assignment.model import PolicyWithValueHead, tiny_llama

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
gen = torch.Generator().manual_seed(0)
U = 2.0 ** -24  # float32 unit roundoff


def near(expected, scale, roundings=32):
    """pytest.approx allowing what a float32 computation may err: ``roundings`` roundings (the
    casts, the arithmetic, a sum of up to ~20 terms in any order) of magnitudes up to ``scale``,
    u each, doubled because exp and log are accurate to one float32 ulp (2u), not u."""
    return pytest.approx(expected, rel=0, abs=2 * U * roundings * scale)


def rand(*shape, scale=1.0, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=dtype) * scale


def with_junk(x, mask, junk=1234.5):
    """x with every padded position overwritten by junk."""
    return torch.where(mask, x, torch.full_like(x, junk))


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
    assert loss.item() == near((-1.2 + 1.6 - 3.0 + 1.1 + 0.0) / 5, scale=5 * 9), \
        "loss: token-mean over the 5 real tokens of max(-A * ratio, -A * clamp(ratio, 0.8, 1.2))"  # |A| * ratio <= 45
    assert clip_frac.item() == near(2 / 5, scale=1), "clip_frac: 2 of the 5 real tokens have the clipped term active"
    assert kl.item() == near(-(math.log(1.5) + math.log(0.5) + 0 + math.log(1.1) + 0) / 5, scale=3), \
        "approx_kl: token-mean of logprobs_old - logprobs_new"


@pytest.mark.ex1
def test_policy_clip_fraction_counts_only_tokens_where_the_clipped_term_is_active(impl):
    # ratio 1.5 outside [0.8, 1.2], but A < 0: the unclipped term -A * r = 1.5 is the larger, so
    # nothing is clipped; ratio 0.5 with A < 0: the clipped term -A * 0.8 = 0.8 is active
    new = torch.log(torch.tensor([[1.5, 0.5]], dtype=torch.float64))
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, clip_frac, _ = impl.compute_policy_loss(new, torch.zeros(1, 2, dtype=torch.float64),
                                                  torch.tensor([[-1.0, -1.0]], dtype=torch.float64), mask, 0.2)
    assert clip_frac.item() == near(1 / 2, scale=1), \
        "clip_frac counts [-A * clamp(ratio) > -A * ratio], not every ratio outside [1 - eps, 1 + eps]"
    assert loss.item() == near((1.5 + 0.8) / 2, scale=2), "loss: the larger of -A * ratio and -A * clamp(ratio)"


@pytest.mark.ex1
def test_policy_loss_with_unit_ratio_is_minus_token_mean_advantage(impl):
    lp = rand(2, 3)
    adv = rand(2, 3)
    loss, clip_frac, kl = impl.compute_policy_loss(lp, lp.clone(), adv, MASK, 0.2)
    assert loss.item() == near(-adv[MASK].mean().item(), scale=adv.abs().max().item()), \
        "with ratio = 1 the loss is -token-mean(A) over the real tokens"
    # new == old exactly: the log-ratio is 0 in any precision, so both metrics are exactly 0
    assert clip_frac.item() == 0.0 and kl.item() == 0.0, "with ratio = 1, clip_frac and approx_kl are exactly 0"


@pytest.mark.ex1
def test_policy_loss_gradient_reaches_logprobs_new_and_metrics_carry_none(impl):
    new = rand(2, 3, scale=0.1).requires_grad_()
    loss, clip_frac, kl = impl.compute_policy_loss(new, rand(2, 3, scale=0.1), rand(2, 3), MASK, 0.2)
    loss.backward()
    assert new.grad is not None and new.grad[MASK].abs().sum() > 0, "the loss must carry a gradient to logprobs_new"
    assert (new.grad[~MASK] == 0).all(), "the gradient at padded positions must be exactly 0"
    assert not clip_frac.requires_grad and not kl.requires_grad, "clip_frac and approx_kl must carry no gradient"


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
    ratio = torch.exp(torch.tensor([0.5, -0.5], dtype=torch.float64))
    want = (torch.maximum(-ratio * torch.tensor([1.0, -1.0], dtype=torch.float64),
                          -ratio.clamp(0.8, 1.2) * torch.tensor([1.0, -1.0], dtype=torch.float64))).mean().item()
    # |log p| ~ 110 in float32: the log-ratio is exact (both are multiples of 0.5), exp adds 2 ulps
    assert loss.item() == near(want, scale=2), "loss with log-probs near -110: compute exp(new - old), never exp(new) / exp(old)"
    loss.backward()
    assert torch.isfinite(new.grad).all(), "NaN or inf in the gradient: exp(new) / exp(old) is 0 / 0 at log-probs this low"
    assert new.grad[0, 2] == 0, "the gradient at the padded position must be exactly 0"


# ---- exercise 2 ---------------------------------------------------------------------------

@pytest.mark.ex2
def test_value_loss_hand_computed(impl):
    v_new = torch.tensor([[1.0, 0.0, 0.5], [2.0, 0.0, 0.0]], dtype=torch.float64)
    v_old = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]], dtype=torch.float64)
    ret = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    loss, clip_frac = impl.compute_value_loss(v_new, v_old, ret, MASK, 0.2)
    # token 1: v_clip = 0.2, max(0, 0.64) = 0.64 (clipped); token 2: max(1, 1) = 1 (tie: not clipped)
    # token 3: v_clip = 0.2, max(0.25, 0.04) = 0.25; token 4: max(4, 4) = 4; token 5: 0
    assert loss.item() == near(0.5 * (0.64 + 1 + 0.25 + 4 + 0) / 5, scale=4), \
        "loss: 0.5 * token-mean of the larger squared error (v_clip = values_old + clamp(change))"
    assert clip_frac.item() == near(1 / 5, scale=1), "clip_frac: 1 of 5 tokens has the clipped error strictly larger"


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
    assert loss.item() == near(0.5 * (0.64 + 0.25 + 2.56 + 0.64) / 4, scale=4), \
        "loss: clip the change values_new - values_old around values_old, then compare with the returns"
    assert clip_frac.item() == near(2 / 4, scale=1), "clip_frac: tokens 1 and 4 have the clipped error strictly larger"


@pytest.mark.ex2
def test_value_loss_gradient_reaches_values_new_and_ignores_junk(impl):
    v_new = rand(2, 3).requires_grad_()
    v_old, ret = rand(2, 3), rand(2, 3)
    loss, clip_frac = impl.compute_value_loss(v_new, v_old, ret, MASK, 0.2)
    loss.backward()
    assert v_new.grad[MASK].abs().sum() > 0, "the loss must carry a gradient to values_new"
    assert (v_new.grad[~MASK] == 0).all(), "the gradient at padded positions must be exactly 0"
    assert not clip_frac.requires_grad, "clip_frac must carry no gradient"
    dirty = impl.compute_value_loss(with_junk(v_new.detach(), MASK), with_junk(v_old, MASK, -9.0), with_junk(ret, MASK), MASK, 0.2)
    assert dirty[0].item() == loss.item() and dirty[1].item() == clip_frac.item(), \
        "junk at padded positions changed the result: select padding away"


# ---- exercise 3 ---------------------------------------------------------------------------

@pytest.mark.ex3
@pytest.mark.parametrize("vocab", [2, 7, 50257])
def test_uniform_logits_give_entropy_loss_minus_log_v(impl, vocab):
    logits = torch.full((2, 3, vocab), 3.7)
    # a sum of V exponentials: up to V roundings of the partial sums, each at most V
    assert impl.compute_entropy_loss(logits, MASK).item() == near(-math.log(vocab), scale=math.log(vocab) + 4,
                                                                   roundings=vocab + 32), \
        f"uniform logits over {vocab} tokens: the entropy is log V, the loss -log V"


@pytest.mark.ex3
def test_entropy_loss_hand_computed(impl):
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    logits = torch.log(p).expand(2, 3, 3).clone()
    h = -(p * p.log()).sum().item()
    assert impl.compute_entropy_loss(logits, MASK).item() == near(-h, scale=2), \
        "the loss is -token-mean(H), H = -sum(p log p) over the vocabulary"


@pytest.mark.ex3
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entropy_stays_finite_for_logits_of_magnitude_1e3(impl, dtype):
    logits = (rand(2, 3, 11, dtype=torch.float32) * 1e3).to(dtype)
    loss = impl.compute_entropy_loss(logits, MASK)
    assert torch.isfinite(loss), "the entropy must stay finite for logits of 1e3: compute it stably (logsumexp)"
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
    # float32 arithmetic errs by u (M (V + 2 log V + 8) + V + 8) per token (M = max |z| <= ~12);
    # bfloat16 arithmetic by 2^-8 relative: a thousand times more
    assert impl.compute_entropy_loss(logits, MASK).item() == near(-h[MASK].mean().item(), scale=12, roundings=64), \
        "off by bfloat16 rounding: upcast the logits to float32 before the softmax and the sums"


@pytest.mark.ex3
def test_entropy_ignores_junk_rows_in_padding(impl):
    logits = rand(2, 3, 5)
    dirty = logits.clone()
    dirty[1, 2] = 1e4
    assert impl.compute_entropy_loss(logits, MASK).item() == impl.compute_entropy_loss(dirty, MASK).item(), \
        "junk logits at a padded position changed the loss: select padding away"


# ---- exercise 4 ---------------------------------------------------------------------------

def assert_near(got, want, scale, what="the values"):
    """Elementwise ``near``: any dtype of float32 or wider."""
    assert got.dtype in (torch.float32, torch.float64), f"dtype {got.dtype}: reduce in float32 or wider"
    err = (got.double() - want.double()).abs().max().item()
    assert err <= 2 * U * 32 * float(scale), f"{what}: largest error {err:.3g}"


def raw_advantages(impl, final_rewards, kl, values, mask, gamma, lam):
    """Unwhitened advantages, recovered from the contract's returns = A + values."""
    _, returns = impl.compute_gae_advantages(final_rewards, kl, values, mask, gamma, lam)
    return returns - values


@pytest.mark.ex4
def test_gae_hand_computed(impl):
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    v = torch.tensor([[0.5, 0.25, 9.0]], dtype=torch.float64)
    kl = torch.tensor([[0.1, 0.2, 9.0]], dtype=torch.float64)
    R, gamma, lam = torch.tensor([1.0], dtype=torch.float64), 0.9, 0.5
    # t=1: r = -0.2 + 1 = 0.8, delta = 0.8 - 0.25 = 0.55, A = 0.55
    # t=0: r = -0.1, delta = -0.1 + 0.9*0.25 - 0.5 = -0.375, A = -0.375 + 0.45*0.55 = -0.1275
    A = raw_advantages(impl, R, kl, v, mask, gamma, lam)
    assert A[0, 1].item() == near(0.55, scale=1), "A at the last real token (index L - 1 = 1): the final reward goes there"
    assert A[0, 0].item() == near(-0.1275, scale=1), "A_0 = delta_0 + gamma * lam * A_1 (the loop runs backwards)"


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
    assert_near(A[MASK], delta[MASK], scale=values.abs().max() + R.abs().max() + 1,
                what="with lam = 0, returns - values must be the TD errors delta_t")


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


@pytest.mark.ex4
def test_gae_whitening_over_real_tokens_with_bessel_correction_and_no_gradient(impl):
    values = rand(2, 3).requires_grad_()
    adv, returns = impl.compute_gae_advantages(rand(2), rand(2, 3, scale=0.1), values, MASK, 1.0, 0.95)
    raw = (returns - values)[MASK].detach()
    expected = (raw - raw.mean()) / torch.sqrt(raw.var(unbiased=True) + 1e-8)
    # whitening divides the raw errors by the standard deviation
    assert_near(adv[MASK], expected, scale=(raw.abs().max() + 1) / raw.std(),
                what="whitened advantages: mean and variance over the real tokens only, variance with n - 1")
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
        assert torch.equal(a[mask], b[mask]), f"junk at padded positions changed the {name}: multiply by m_(t+1)"
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
    raw = (returns - v)[mask]
    expected = (raw - raw.mean()) / torch.sqrt(raw.var(unbiased=True) + 1e-8)
    assert_near(adv[mask], expected, scale=(raw.abs().max() + 1) / raw.std(),
                what="whitening over padded positions too: use masked_whiten(advantages, response_mask)")


# ---- exercise 5 ---------------------------------------------------------------------------

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


def logprob_roundings(model, mb):
    """How many float32 roundings of unit size a log-prob computed in float32 may carry here:
    2 max|z| + V + 2 log V + 8 (the temperature division, the shift by the maximum, a sum of V
    exponentials, the log, the gather), with z the sliced, tempered logits."""
    P, T = mb["prompt_length"], mb["response_ids"].shape[1]
    with torch.no_grad():
        z = model(mb["input_ids"], mb["attention_mask"])[0][:, P - 1 : P + T - 1] / CFG.temperature
    V = z.shape[-1]
    return 2 * z.abs().max().item() + V + 2 * math.log(V) + 8


def grads(model):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()])


@pytest.mark.ex5
def test_minibatch_update_at_unchanged_policy_has_unit_ratio(impl, policy):
    mb = make_minibatch(policy)
    k = logprob_roundings(policy, mb)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    metrics = impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=False)
    assert set(metrics) == {"loss/policy", "loss/value", "loss/entropy", "loss/total",
                            "stats/policy_clipfrac", "stats/value_clipfrac", "stats/approx_kl"}, \
        "the metric keys of the contract (stats/grad_norm only when it stepped)"
    assert all(type(v) is float for v in metrics.values()), "every metric is a Python float (.item())"
    adv = mb["advantages"][mb["response_mask"].bool()]
    assert metrics["stats/approx_kl"] == near(0.0, scale=1, roundings=k), \
        "approx_kl is not 0 at the policy that made logprobs_old: check the slice and the temperature"
    assert metrics["stats/policy_clipfrac"] == 0.0, "ratio 1 clips nothing: check the slice and the temperature"
    assert metrics["loss/policy"] == near(-adv.mean().item(), scale=adv.abs().max().item(), roundings=k + 32), \
        "at ratio 1 the policy loss is -token-mean(A): check the slice and the temperature"
    parts = (metrics["loss/policy"], 0.5 * metrics["loss/value"], 0.01 * metrics["loss/entropy"])
    assert metrics["loss/total"] == near(sum(parts), scale=sum(abs(x) for x in parts), roundings=4), \
        "loss/total = policy + vf_coeff * value + entropy_coeff * entropy"


@pytest.mark.ex5
def test_minibatch_update_feeds_exercises_1_to_3_the_sliced_tempered_logits_and_values(impl, policy):
    """loss/entropy and loss/value are your own exercises 3 and 2 on the response slice
    [P-1 : P+T-1] of the model's outputs, the logits divided by the temperature."""
    mb = make_minibatch(policy)
    P, T, mask = mb["prompt_length"], mb["response_ids"].shape[1], mb["response_mask"]
    metrics = impl.ppo_minibatch_update(policy, torch.optim.SGD(policy.parameters(), lr=0.1), mb, CFG, False)
    with torch.no_grad():
        logits, values = policy(mb["input_ids"], mb["attention_mask"])
        entropy = impl.compute_entropy_loss(logits[:, P - 1 : P + T - 1] / CFG.temperature, mask).item()
        value = impl.compute_value_loss(values[:, P - 1 : P + T - 1], mb["values_old"], mb["returns"], mask,
                                        CFG.clip_range_value)[0].item()
    assert metrics["loss/entropy"] == near(entropy, scale=abs(entropy) + 1), \
        "loss/entropy is exercise 3 on logits[:, P-1 : P+T-1] / cfg.temperature"
    assert metrics["loss/value"] == near(value, scale=abs(value) + 1), "loss/value is exercise 2 on values[:, P-1 : P+T-1]"


@pytest.mark.ex5
def test_minibatch_update_accumulates_then_steps_clips_and_zeroes(impl, policy):
    mb = make_minibatch(policy)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    before = [p.detach().clone() for p in policy.parameters()]
    impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=False)
    first = [p.grad.clone() for p in policy.parameters()]
    assert all(torch.equal(a, p) for a, p in zip(before, policy.parameters())), "stepped too early"
    impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=False)
    assert all(torch.allclose(p.grad, 2 * g) for p, g in zip(policy.parameters(), first)), "gradients not accumulated"
    total = torch.cat([g.flatten() for g in first]).norm()
    metrics = impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=True)
    # three times the same float64 computation: equal up to float64 rounding of their sum
    assert metrics["stats/grad_norm"] == pytest.approx(3 * total.item(), rel=1e-9), \
        "stats/grad_norm is clip_grad_norm_'s return value, before clipping"
    assert all(p.grad is None or (p.grad == 0).all() for p in policy.parameters()), "no zero_grad"
    moved = torch.cat([(p.detach() - a).flatten() for p, a in zip(policy.parameters(), before)]).norm()
    # clip_grad_norm_ scales by max_norm / (norm + 1e-6): off by 1e-6 / norm ~ 1e-7 relative here
    assert moved.item() == pytest.approx(0.1 * CFG.max_grad_norm, rel=1e-6), "step not clipped to max_grad_norm"


@pytest.mark.ex5
def test_minibatch_update_divides_by_grad_accum_steps(impl, policy):
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
@pytest.mark.parametrize("coeff", ["vf_coeff", "entropy_coeff"])
def test_minibatch_update_weights_each_loss_by_its_coefficient(impl, policy, coeff):
    """The gradient is linear in each coefficient, and the weighted loss does reach the model."""
    mb = make_minibatch(policy)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    at = {}
    for value in (0.0, 0.5, 1.0):
        policy.zero_grad()
        impl.ppo_minibatch_update(policy, opt, mb, SimpleNamespace(**dict(vars(CFG), **{coeff: value})), False)
        at[value] = grads(policy)
    step = at[1.0] - at[0.0]
    assert step.abs().max() > 0, f"cfg.{coeff} changes nothing: weight its loss by it"
    # every gradient is a sum of float32-or-wider terms: a few roundings of the largest one
    assert (step - 2 * (at[0.5] - at[0.0])).abs().max() <= 2 * U * 64 * max(g.abs().max() for g in at.values()), \
        f"the gradient is not linear in cfg.{coeff}: multiply its loss by it once"


@pytest.mark.ex5
def test_minibatch_update_skips_the_step_on_a_non_finite_gradient(impl, policy):
    mb = make_minibatch(policy)
    mb["advantages"] = torch.full_like(mb["advantages"], float("inf"))
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=True)
    assert not math.isfinite(metrics["stats/grad_norm"]), "stats/grad_norm must report the non-finite norm"
    assert all(torch.equal(a, p) for a, p in zip(before, policy.parameters())), \
        "the optimizer stepped on a non-finite gradient: step only if grad_norm is finite"
    assert all(p.grad is None or (p.grad == 0).all() for p in policy.parameters()), "zero_grad after a skipped step too"


@pytest.mark.ex5
def test_minibatch_update_ignores_junk_in_padding(impl, policy):
    mb = make_minibatch(policy)
    mask = mb["response_mask"].bool()
    dirty = dict(mb, **{k: with_junk(mb[k], mask) for k in ("logprobs_old", "values_old", "advantages", "returns")})
    a = impl.ppo_minibatch_update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), mb, CFG, False)
    policy.zero_grad()
    b = impl.ppo_minibatch_update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), dirty, CFG, False)
    assert a == b, "junk at padded positions changed the metrics: select padding away"

"""The five exercises against the contract itself (handout.md, section 4): hand-computed cases and the properties the
contract implies. Independent of the autograder.

Runs against ``--impl`` (see tests/conftest.py): the reference solution in the staff repo,
your own ``assignment/exercises.py`` with ``--impl assignment``.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from assignment.helpers import logprobs_from_logits
from assignment.model import PolicyWithValueHead, tiny_llama

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
gen = torch.Generator().manual_seed(0)


def rand(*shape, scale=1.0, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=dtype) * scale


def with_junk(x, mask, junk=1234.5):
    """x with every padded position overwritten by junk."""
    return torch.where(mask, x, torch.full_like(x, junk))


# ---- exercise 1 ---------------------------------------------------------------------------

def test_policy_loss_hand_computed(impl):
    eps = 0.2
    new = torch.log(torch.tensor([[1.5, 0.5, 1.0], [1.1, 1.0, 9.0]], dtype=torch.float64))
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, -2.0, 3.0], [-1.0, 0.0, 5.0]], dtype=torch.float64)
    loss, clip_frac, kl = impl.compute_policy_loss(new, old, adv, MASK, eps)
    # per token: max(-A r, -A clamp(r)): (1.5, A=1) -> max(-1.5, -1.2) = -1.2 (clipped)
    # (0.5, A=-2) -> max(1.0, 1.6) = 1.6 (clipped); (1.0, A=3) -> -3; (1.1, A=-1) -> 1.1; (1.0, A=0) -> 0
    assert loss.item() == pytest.approx((-1.2 + 1.6 - 3.0 + 1.1 + 0.0) / 5)
    assert clip_frac.item() == pytest.approx(2 / 5)
    assert kl.item() == pytest.approx(-(math.log(1.5) + math.log(0.5) + 0 + math.log(1.1) + 0) / 5)


def test_policy_loss_with_unit_ratio_is_minus_token_mean_advantage(impl):
    lp = rand(2, 3)
    adv = rand(2, 3)
    loss, clip_frac, kl = impl.compute_policy_loss(lp, lp.clone(), adv, MASK, 0.2)
    assert loss.item() == pytest.approx(-adv[MASK].mean().item())
    assert clip_frac.item() == 0.0 and kl.item() == 0.0


def test_policy_loss_gradient_reaches_logprobs_new_and_metrics_carry_none(impl):
    new = rand(2, 3, scale=0.1).requires_grad_()
    loss, clip_frac, kl = impl.compute_policy_loss(new, rand(2, 3, scale=0.1), rand(2, 3), MASK, 0.2)
    loss.backward()
    assert new.grad is not None and new.grad[MASK].abs().sum() > 0
    assert (new.grad[~MASK] == 0).all()
    assert not clip_frac.requires_grad and not kl.requires_grad


def test_policy_loss_ignores_junk_in_padding(impl):
    new, old, adv = rand(2, 3, scale=0.3), rand(2, 3, scale=0.3), rand(2, 3)
    clean = impl.compute_policy_loss(new, old, adv, MASK, 0.2)
    dirty = impl.compute_policy_loss(with_junk(new, MASK, 50.0), with_junk(old, MASK, -50.0), with_junk(adv, MASK), MASK, 0.2)
    for a, b in zip(clean, dirty):
        assert a.item() == b.item()


# ---- exercise 2 ---------------------------------------------------------------------------

def test_value_loss_hand_computed(impl):
    v_new = torch.tensor([[1.0, 0.0, 0.5], [2.0, 0.0, 0.0]], dtype=torch.float64)
    v_old = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]], dtype=torch.float64)
    ret = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    loss, clip_frac = impl.compute_value_loss(v_new, v_old, ret, MASK, 0.2)
    # token 1: v_clip = 0.2, max(0, 0.64) = 0.64 (clipped); token 2: max(1, 1) = 1 (tie: not clipped)
    # token 3: v_clip = 0.2, max(0.25, 0.04) = 0.25; token 4: max(4, 4) = 4; token 5: 0
    assert loss.item() == pytest.approx(0.5 * (0.64 + 1 + 0.25 + 4 + 0) / 5)
    assert clip_frac.item() == pytest.approx(1 / 5)


def test_value_loss_gradient_reaches_values_new_and_ignores_junk(impl):
    v_new = rand(2, 3).requires_grad_()
    v_old, ret = rand(2, 3), rand(2, 3)
    loss, clip_frac = impl.compute_value_loss(v_new, v_old, ret, MASK, 0.2)
    loss.backward()
    assert v_new.grad[MASK].abs().sum() > 0 and not clip_frac.requires_grad
    dirty = impl.compute_value_loss(with_junk(v_new.detach(), MASK), with_junk(v_old, MASK, -9.0), with_junk(ret, MASK), MASK, 0.2)
    assert dirty[0].item() == loss.item() and dirty[1].item() == clip_frac.item()


# ---- exercise 3 ---------------------------------------------------------------------------

@pytest.mark.parametrize("vocab", [2, 7, 50257])
def test_uniform_logits_give_entropy_loss_minus_log_v(impl, vocab):
    logits = torch.full((2, 3, vocab), 3.7)
    assert impl.compute_entropy_loss(logits, MASK).item() == pytest.approx(-math.log(vocab), rel=1e-6)


def test_entropy_loss_hand_computed(impl):
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    logits = torch.log(p).expand(2, 3, 3).clone()
    h = -(p * p.log()).sum().item()
    assert impl.compute_entropy_loss(logits, MASK).item() == pytest.approx(-h)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entropy_stays_finite_for_logits_of_magnitude_1e3(impl, dtype):
    logits = (rand(2, 3, 11, dtype=torch.float32) * 1e3).to(dtype)
    loss = impl.compute_entropy_loss(logits, MASK)
    assert torch.isfinite(loss) and loss.dtype == torch.float32 and -loss.item() >= -1e-3


def test_entropy_ignores_junk_rows_in_padding(impl):
    logits = rand(2, 3, 5)
    dirty = logits.clone()
    dirty[1, 2] = 1e4
    assert impl.compute_entropy_loss(logits, MASK).item() == impl.compute_entropy_loss(dirty, MASK).item()


# ---- exercise 4 ---------------------------------------------------------------------------

def raw_advantages(impl, final_rewards, kl, values, mask, gamma, lam):
    """Unwhitened advantages, recovered from the contract's returns = A + values."""
    _, returns = impl.compute_gae_advantages(final_rewards, kl, values, mask, gamma, lam)
    return returns - values


def test_gae_hand_computed(impl):
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    v = torch.tensor([[0.5, 0.25, 9.0]], dtype=torch.float64)
    kl = torch.tensor([[0.1, 0.2, 9.0]], dtype=torch.float64)
    R, gamma, lam = torch.tensor([1.0], dtype=torch.float64), 0.9, 0.5
    # t=1: r = -0.2 + 1 = 0.8, delta = 0.8 - 0.25 = 0.55, A = 0.55
    # t=0: r = -0.1, delta = -0.1 + 0.9*0.25 - 0.5 = -0.375, A = -0.375 + 0.45*0.55 = -0.1275
    A = raw_advantages(impl, R, kl, v, mask, gamma, lam)
    assert A[0, :2].tolist() == pytest.approx([-0.1275, 0.55])


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
    torch.testing.assert_close(A[MASK], delta[MASK])


def test_gae_with_gamma_lambda_one_and_zero_values_gives_reward_to_go(impl):
    kl = rand(2, 3, scale=0.1)
    R = torch.tensor([1.0, -2.0], dtype=torch.float64)
    _, returns = impl.compute_gae_advantages(R, kl, torch.zeros(2, 3, dtype=torch.float64), MASK, 1.0, 1.0)
    r = -kl * MASK
    r[0, 2] += 1.0
    r[1, 1] -= 2.0
    to_go = r.flip(1).cumsum(1).flip(1)
    torch.testing.assert_close(returns[MASK], to_go[MASK])


def test_gae_whitening_uses_bessel_correction_and_no_gradient(impl):
    values = rand(2, 3).requires_grad_()
    adv, returns = impl.compute_gae_advantages(rand(2), rand(2, 3, scale=0.1), values, MASK, 1.0, 0.95)
    raw = (returns - values)[MASK].detach()
    expected = (raw - raw.mean()) / torch.sqrt(raw.var(unbiased=True) + 1e-8)
    torch.testing.assert_close(adv[MASK], expected)
    assert not adv.requires_grad and not returns.requires_grad


def test_gae_empty_rows_and_junk_in_padding(impl):
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    R, kl, v = rand(3), rand(3, 4, scale=0.1), rand(3, 4)
    clean = impl.compute_gae_advantages(R, kl, v, mask, 0.99, 0.95)
    dirty = impl.compute_gae_advantages(R, with_junk(kl, mask), with_junk(v, mask, -77.0), mask, 0.99, 0.95)
    for a, b in zip(clean, dirty):
        assert torch.isfinite(a[mask]).all()
        torch.testing.assert_close(a[mask], b[mask])
    # the single-token row: A = R - kl - V (nothing after it)
    raw = clean[1] - v
    assert raw[2, 0].item() == pytest.approx((R[2] - kl[2, 0] - v[2, 0]).item())


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
    return PolicyWithValueHead(tiny_llama(seed=0, dtype=torch.float64)).double()


def test_minibatch_update_at_unchanged_policy_has_unit_ratio(impl, policy):
    mb = make_minibatch(policy)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    metrics = impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=False)
    assert set(metrics) == {"loss/policy", "loss/value", "loss/entropy", "loss/total",
                            "stats/policy_clipfrac", "stats/value_clipfrac", "stats/approx_kl"}
    assert all(type(v) is float for v in metrics.values())
    assert metrics["stats/approx_kl"] == pytest.approx(0.0, abs=1e-12)
    assert metrics["stats/policy_clipfrac"] == 0.0
    assert metrics["loss/policy"] == pytest.approx(-mb["advantages"][mb["response_mask"].bool()].mean().item())
    assert metrics["loss/total"] == pytest.approx(metrics["loss/policy"] + 0.5 * metrics["loss/value"]
                                                  + 0.01 * metrics["loss/entropy"])


def test_minibatch_update_accumulates_then_steps_clips_and_zeroes(impl, policy):
    mb = make_minibatch(policy)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    before = [p.detach().clone() for p in policy.parameters()]
    impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=False)
    first = [p.grad.clone() for p in policy.parameters()]
    assert all(torch.equal(a, p) for a, p in zip(before, policy.parameters())), "stepped too early"
    impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=False)
    assert all(torch.allclose(p.grad, 2 * g) for p, g in zip(policy.parameters(), first)), "gradients not accumulated"
    # the gradient of one call is (loss / grad_accum_steps)'s
    total = torch.cat([g.flatten() for g in first]).norm()
    metrics = impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=True)
    assert metrics["stats/grad_norm"] == pytest.approx(3 * total.item(), rel=1e-9)
    assert all(p.grad is None or (p.grad == 0).all() for p in policy.parameters()), "no zero_grad"
    moved = torch.cat([(p.detach() - a).flatten() for p, a in zip(policy.parameters(), before)]).norm()
    assert moved.item() == pytest.approx(0.1 * CFG.max_grad_norm, rel=1e-6), "step not clipped to max_grad_norm"


def test_minibatch_update_skips_the_step_on_a_non_finite_gradient(impl, policy):
    mb = make_minibatch(policy)
    mb["advantages"] = torch.full_like(mb["advantages"], float("inf"))
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = impl.ppo_minibatch_update(policy, opt, mb, CFG, step_optimizer=True)
    assert not math.isfinite(metrics["stats/grad_norm"])
    assert all(torch.equal(a, p) for a, p in zip(before, policy.parameters()))
    assert all(p.grad is None or (p.grad == 0).all() for p in policy.parameters())


def test_minibatch_update_ignores_junk_in_padding(impl, policy):
    mb = make_minibatch(policy)
    mask = mb["response_mask"].bool()
    dirty = dict(mb, **{k: with_junk(mb[k], mask) for k in ("logprobs_old", "values_old", "advantages", "returns")})
    a = impl.ppo_minibatch_update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), mb, CFG, False)
    policy.zero_grad()
    b = impl.ppo_minibatch_update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), dirty, CFG, False)
    assert a == b

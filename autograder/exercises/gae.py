"""Exercise 4, compute_gae_advantages: inputs, error scales, checks and hints.

Error scales (see compare.py). Per row, over real tokens t with raw advantages A_t (the
reference's returns - values), token rewards r_t and TD errors delta_t, one step of the
recursion rounds at most
    w_t = 2 (|kl_t| + |R| [t = L - 1] + |V_{t+1}| m_{t+1} + |V_t|) + |delta_t| + 3 |A_{t+1}| m_{t+1} + |A_t|
(the casts of kl, R and V; gamma * V; the two sums of delta; gamma * lam * m * A; the sum), and
A_t carries every later step's error, damped by gamma * lam:
    E_t = w_t + gamma lam m_{t+1} E_{t+1}
    returns     E_t + |A_t| + 2 |V_t|                      (also the TD-error and reward-to-go checks)
    advantages  (E_t + E_mu) / s + |Adv_t| (E_var / (2 s^2) + 3)
                    with s = sqrt(var + 1e-8), E_mu = mean(E) + (n + 1) mean|A| the error of the
                    mean, E_var = (2 sum |A - mu| (E + E_mu) + (n + 3) sum (A - mu)^2) / (n - 1) that
                    of the variance: whitening divides the raw errors by s, which is why a batch
                    of nearly equal advantages gets a wide bound
"""

from __future__ import annotations

import torch
from hypothesis import assume
from hypothesis import strategies as st

from assignment.contract import exercise
from assignment.helpers import masked_mean, masked_whiten

from ..cases import DTYPES, Case, array, junk, mask_as, padding, with_empty_row
from . import Check, all_of, common, fixed

EXERCISE = exercise(4)


@st.composite
def gae_case(draw, lam_zero: bool = False, reward_to_go: bool = False, empty_rows: bool = False) -> Case:
    """Every row holds a real token, as the trainer's responses do (their EOS); ``empty_rows``: at
    least one row holds none, the contract's rule for which is that it gets nothing."""
    mask = draw(padding(max_t=16, empty_rows=empty_rows))
    assume(not empty_rows or not bool(mask.any(1).all()))
    B, T = mask.shape
    dtype = draw(st.sampled_from(DTYPES))
    gamma = 1.0 if reward_to_go else draw(st.floats(0.0, 1.0))
    lam = 0.0 if lam_zero else 1.0 if reward_to_go else draw(st.floats(0.0, 1.0))
    rewards = array(draw, (B,), -2.0, 2.0).to(dtype)
    kl = array(draw, (B, T), -0.5, 0.5).to(dtype)
    values = torch.zeros(B, T, dtype=dtype) if reward_to_go else array(draw, (B, T), -3.0, 3.0).to(dtype)
    return Case(
        tensors={
            "final_rewards": rewards,
            "kl_penalties": junk(draw, kl, mask, -100.0, 100.0),
            "values": values if reward_to_go else junk(draw, values, mask, -100.0, 100.0),
            "response_mask": mask_as(draw, mask, dtype),
        },
        scalars={"gamma": gamma, "lam": lam},
    )


def token_rewards(case: Case, reward_index: str = "last_real", kl_sign: float = -1.0,
                  overwrite: bool = False) -> torch.Tensor:
    """(B, T) float64 token rewards in closed form: kl_sign * kl_penalties on real tokens, plus
    final_rewards[b] at row b's last real token. Known bugs: ``reward_index`` "end" (at T - 1) or
    "first" (at index 0), ``overwrite`` (the reward replaces that token's -kl instead of adding)."""
    mask = case.mask
    rewards = torch.where(mask, kl_sign * case.tensors["kl_penalties"].double(), 0.0)
    lengths = mask.sum(1)
    for b in range(rewards.shape[0]):
        if lengths[b] > 0:
            t = {"last_real": int(lengths[b]) - 1, "end": rewards.shape[1] - 1, "first": 0}[reward_index]
            rewards[b, t] = (0.0 if overwrite else rewards[b, t]) + float(case.tensors["final_rewards"][b])
    return rewards


def raw_advantages(case: Case, reward_index="last_real", use_next_mask=True, gamma=None, lam=None,
                   kl_sign=-1.0, skip_last=False, forward=False, trace_gamma=True, overwrite=False) -> torch.Tensor:
    """(B, T) float64 unwhitened GAE; the keyword arguments reproduce known mistakes (``forward``:
    the same loop run t = 0, 1, ..., what it carries from step to step coming from t - 1)."""
    mask = case.mask
    gamma = case.scalars["gamma"] if gamma is None else gamma
    lam = case.scalars["lam"] if lam is None else lam
    values = case.tensors["values"].double()
    values = torch.where(mask, values, 0.0) if use_next_mask else values
    rewards = token_rewards(case, reward_index, kl_sign, overwrite)
    B, T = mask.shape
    advantages = torch.zeros(B, T, dtype=torch.float64)
    next_value, next_mask, next_advantage = (torch.zeros(B, dtype=torch.float64) for _ in range(3))
    steps = range(T) if forward else reversed(range(T - 1 if skip_last else T))  # skip_last: A_{T-1} stays 0
    for t in steps:
        keep = next_mask if use_next_mask else torch.ones_like(next_mask)
        decay = gamma * lam if trace_gamma else lam
        next_advantage = rewards[:, t] + gamma * next_value * keep - values[:, t] + decay * keep * next_advantage
        advantages[:, t] = next_advantage
        next_value, next_mask = values[:, t], mask[:, t].double()
    return advantages


def _shift(x: torch.Tensor) -> torch.Tensor:
    """x_{t+1}, with 0 after the last column."""
    return torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)


def scales(case: Case, ref) -> dict[str, torch.Tensor]:
    mask, n = case.mask, case.n_real
    m = mask.double()
    gamma, lam = case.scalars["gamma"], case.scalars["lam"]
    values = torch.where(mask, case.tensors["values"].double(), 0.0)
    kl = torch.where(mask, case.tensors["kl_penalties"].double(), 0.0)
    adv = torch.where(mask, ref.outputs["returns"].double() - values, 0.0)
    last = mask & ~_shift(m).bool()  # each row's last real token
    reward = case.tensors["final_rewards"].double().abs()[:, None] * last
    delta = token_rewards(case) + gamma * _shift(values) * _shift(m) - values
    w = 2 * (kl.abs() + reward + _shift(values).abs() * _shift(m) + values.abs()) + delta.abs() \
        + 3 * _shift(adv).abs() * _shift(m) + adv.abs()
    w = torch.where(mask, w, 0.0)
    carried = torch.zeros_like(w)  # E_t, built backwards like the advantages themselves
    running = torch.zeros(w.shape[0], dtype=torch.float64)
    for t in reversed(range(w.shape[1])):
        running = w[:, t] + gamma * lam * (m[:, t + 1] if t + 1 < w.shape[1] else 0.0) * running
        carried[:, t] = running
    returns = carried + adv.abs() + 2 * values.abs()
    mu = adv[mask].mean()
    var = adv[mask].var(unbiased=True)
    s = torch.sqrt(var + 1e-8)
    e_mu = carried[mask].mean() + (n + 1) * adv[mask].abs().mean()
    e_var = (2 * ((adv - mu).abs() * (carried + e_mu))[mask].sum() + (n + 3) * ((adv - mu) ** 2)[mask].sum()) / (n - 1)
    whitened = ((adv - mu) / s).abs()
    advantages = (carried + e_mu) / s + whitened * (e_var / (2 * (var + 1e-8)) + 3)
    return {"returns": returns, "advantages": advantages}


def _td_errors(case, ref, sub, ulps) -> list[str]:
    """lam = 0: raw advantages (returns - values) are the TD errors, computed here in closed form."""
    mask = case.mask
    m = mask.double()
    values = torch.where(mask, case.tensors["values"].double(), 0.0)
    delta = token_rewards(case) + case.scalars["gamma"] * _shift(values) * _shift(m) - values
    closed = type(ref)({"returns": delta + values, "advantages": ref.outputs["advantages"]}, {}, None)
    return common.outputs(scales, "returns")(case, closed, sub, ulps)


def _reward_to_go(case, ref, sub, ulps) -> list[str]:
    """gamma = lam = 1 and V = 0: the returns are the reward-to-go, computed here in closed form."""
    to_go = token_rewards(case).flip(1).cumsum(1).flip(1)
    closed = type(ref)({"returns": to_go, "advantages": ref.outputs["advantages"]}, {}, None)
    return common.outputs(scales, "returns")(case, closed, sub, ulps)


FORWARD = ("your loop runs forward, t = 0, 1, ...: A_t is defined through A_{t+1}, which a forward loop has not "
           "computed yet (it reads 0, or what it carried from t - 1). Run it backwards: for t in reversed(range(T))")


def patterns(case: Case) -> list[tuple[str, torch.Tensor, str]]:
    mask = case.mask
    n = case.n_real
    raw = raw_advantages(case)
    values = case.tensors["values"].double()
    centred = raw - masked_mean(raw, mask)
    biased = centred / torch.sqrt(masked_mean(centred ** 2, mask) + 1e-8)
    everywhere = torch.ones_like(mask)
    # what the submission holds at padding is its own; the reference's raw advantages are 0 there
    padded_too = torch.where(mask, raw, 0.0)
    over_padding = "whiten over the real tokens only (masked_whiten(advantages, response_mask)): your mean and " \
                   "variance count the padded positions too"
    out = [
        ("advantages", raw, "the advantages must be whitened over the real tokens of the batch (masked_whiten)"),
        ("advantages", masked_whiten(padded_too, everywhere), over_padding),
        ("advantages", (padded_too - padded_too.mean()) / (padded_too.std() + 1e-8), over_padding),
        ("advantages", biased, "you divide by n (the population variance); whitening uses Bessel's correction, "
                               "n - 1: use masked_whiten"),
        ("advantages", raw / torch.sqrt(masked_mean(centred ** 2, mask) * n / (n - 1) + 1e-8),
         "subtract the mean before dividing by the std (masked_whiten)"),
        ("returns", masked_whiten(raw, mask) + values, "compute the returns from the unwhitened advantages: returns = A + values"),
    ]
    for variant, message in (
        (dict(skip_last=True), "your loop never computes the last position t = T - 1 (A_{T-1} stays 0, and every "
                               "error starts at that index): loop over reversed(range(T))"),
        (dict(forward=True), FORWARD),
        (dict(lam=0.0), FORWARD),  # a forward loop that reads A[:, t + 1] before writing it: 0, as if lam = 0
        (dict(reward_index="end"), "final_rewards goes at each row's last real token (index L_b - 1), not at T - 1"),
        (dict(reward_index="first"), "final_rewards goes at each row's last real token (index L_b - 1), not at its "
                                     "first"),
        (dict(overwrite=True), "add final_rewards to the last real token's -kl_penalties; yours overwrites it"),
        (dict(use_next_mask=False), "multiply V_{t+1} and A_{t+1} by the next position's mask m_{t+1}: values from padding leak into real tokens"),
        (dict(gamma=case.scalars["lam"], lam=case.scalars["gamma"]), "gamma and lam are swapped"),
        (dict(trace_gamma=False), "the advantage trace decays by gamma * lam: A_t = delta_t + gamma * lam * m_{t+1} "
                                  "* A_{t+1}"),
        (dict(kl_sign=1.0), "the token reward is -kl_penalties: the KL penalty lowers the reward"),
    ):
        wrong = raw_advantages(case, **variant)
        out += [("returns", wrong + values, message), ("advantages", masked_whiten(wrong, mask), message)]
    return out


def hint(evidence, ulps) -> str | None:
    """The hint for a failed check; ``evidence`` is [(case, submitted, reference)], the case shown
    last (common.suggest)."""
    return common.suggest(patterns, scales, evidence, ulps)


_no_grad = common.no_gradient("advantages", "returns")
_advantages = all_of(common.outputs(scales, "advantages"), _no_grad)
_returns = all_of(common.outputs(scales, "returns"), _no_grad)

CHECKS = (
    Check("advantages", "the whitened advantages equal the reference on real tokens and carry no gradient",
          fixed(gae_case()), _advantages),
    Check("returns", "the returns (unwhitened A + values) equal the reference on real tokens and carry no gradient",
          fixed(gae_case()), _returns),
    Check("td_errors", "with lam = 0, returns - values are the one-step TD errors", fixed(gae_case(lam_zero=True)), _td_errors),
    Check("reward_to_go", "with gamma = lam = 1 and V = 0, the returns are the reward-to-go",
          fixed(gae_case(reward_to_go=True)), _reward_to_go),
    Check("edge_cases", "the contract's rule for what the trainer never sends (its responses hold at least one "
          "token): a row with no real token gets no reward and changes no other row's advantages or returns",
          fixed(gae_case(empty_rows=True)), all_of(_advantages, _returns), fewer_rows=with_empty_row),
    Check("hidden_advantages", "the advantages on the hidden inputs", fixed(gae_case()), _advantages),
    Check("hidden_returns", "the returns on the hidden inputs", fixed(gae_case()), _returns),
)

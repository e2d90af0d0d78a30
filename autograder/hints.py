"""Known bug patterns: when a submission's output on the shrunk counterexample equals what a
typical mistake would produce, the feedback says which mistake.

Each pattern recomputes the exercise the wrong way on the same inputs. Patterns only ever add
a hint to a check that already failed; they never change a score.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from assignment.helpers import masked_mean, masked_whiten

from .compare import Tolerance, close


def _t(case, *names, dtype=torch.float64):
    return [case.tensors[n].to(dtype) for n in names]


def _row_means(x, mask):
    m = mask.double()
    rows = m.sum(1) > 0
    return ((torch.where(mask, x, 0.0).sum(1)[rows] / m.sum(1)[rows]).mean())


def _policy_terms(case):
    new, old, adv = _t(case, "logprobs_new", "logprobs_old", "advantages")
    eps = case.scalars["clip_ratio"]
    r = torch.exp(new - old)
    return new, old, adv, r, -adv * r, -adv * r.clamp(1 - eps, 1 + eps), eps


def _policy(case):
    mask = case.mask
    new, old, adv, r, un, cl, eps = _policy_terms(case)
    return [
        ("loss", masked_mean(torch.maximum(-un, -cl), mask),
         "your loss has the opposite sign: the per-token loss is max(-A * ratio, -A * clamp(ratio)), and we minimise it"),
        ("loss", masked_mean(torch.minimum(un, cl), mask),
         "you take the minimum of the two terms; PPO's loss takes the maximum (the pessimistic bound)"),
        ("loss", torch.maximum(un, cl).mean(),
         "the mean includes padded positions: use masked_mean(x, response_mask)"),
        ("loss", _row_means(torch.maximum(un, cl), mask),
         "you average per-row means; the token-mean divides the sum over all real tokens by their number"),
        ("loss", masked_mean(un, mask), "your loss ignores the clipped term"),
        ("clip_frac", masked_mean(((r - 1).abs() > eps).double(), mask),
         "clip_frac counts tokens where the clipped term is active ([-A*clamp(ratio) > -A*ratio]), "
         "not every ratio outside [1 - eps, 1 + eps]"),
        ("clip_frac", masked_mean((cl >= un).double(), mask),
         "use a strict > in clip_frac: where both terms are equal, nothing is clipped"),
        ("approx_kl", masked_mean(new - old, mask), "approx_kl is token-mean(logprobs_old - logprobs_new); yours has the opposite sign"),
        ("approx_kl", masked_mean((r - 1) - torch.log(r), mask), "approx_kl is the k1 estimator, not k3"),
        ("approx_kl", (old - new).mean(), "approx_kl includes padded positions: use masked_mean"),
    ]


def _value(case):
    mask = case.mask
    new, old, ret = _t(case, "values_new", "values_old", "returns")
    c = case.scalars["clip_range_value"]
    v_clip = old + (new - old).clamp(-c, c)
    e_un, e_cl = (new - ret) ** 2, (v_clip - ret) ** 2
    return [
        ("loss", masked_mean(torch.maximum(e_un, e_cl), mask), "the value loss has a factor 0.5 in front of the token-mean"),
        ("loss", 0.5 * masked_mean(torch.minimum(e_un, e_cl), mask), "take the maximum of the two squared errors, not the minimum"),
        ("loss", 0.5 * masked_mean(e_un, mask), "your value loss ignores the clipped term"),
        ("loss", 0.5 * torch.maximum(e_un, e_cl).mean(), "the mean includes padded positions: use masked_mean"),
        ("loss", 0.5 * _row_means(torch.maximum(e_un, e_cl), mask),
         "you average per-row means; the token-mean divides the sum over all real tokens by their number"),
        ("loss", 0.5 * masked_mean(torch.maximum(e_un, (ret + (new - ret).clamp(-c, c) - ret) ** 2), mask),
         "clip the change of the value (values_new - values_old) around values_old, not around the returns"),
        ("clip_frac", masked_mean((e_cl >= e_un).double(), mask), "use a strict > in clip_frac"),
        ("clip_frac", masked_mean(((new - old).abs() > c).double(), mask),
         "clip_frac counts tokens where the clipped squared error is the larger one, not every clipped change"),
    ]


def _entropy(case):
    mask = case.mask
    (z,) = _t(case, "logits")
    h = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)
    return [
        ("loss", masked_mean(h, mask), "the entropy loss is -token-mean(H): minimising it must raise the entropy"),
        ("loss", -h.mean(), "the mean includes padded positions: use masked_mean"),
        ("loss", -_row_means(h, mask), "you average per-row means; use the token-mean over all real tokens"),
    ]


def token_rewards(case, reward_index: str = "last_real", kl_sign: float = -1.0) -> torch.Tensor:
    """(B, T) float64 token rewards in closed form: kl_sign * kl_penalties on real tokens, plus
    final_rewards[b] at row b's last real token (``reward_index="end"``: at T - 1, a known bug)."""
    mask = case.mask
    R, kl = _t(case, "final_rewards", "kl_penalties")
    r = torch.where(mask, kl_sign * kl, 0.0)
    lengths = mask.sum(1)
    for b in range(r.shape[0]):
        if lengths[b] > 0:
            r[b, (lengths[b] - 1) if reward_index == "last_real" else r.shape[1] - 1] += R[b]
    return r


def _gae_raw(case, reward_index="last_real", next_mask=True, gamma=None, lam=None, kl_sign=-1.0):
    mask = case.mask
    (v,) = _t(case, "values")
    m = mask.double()
    gamma = case.scalars["gamma"] if gamma is None else gamma
    lam = case.scalars["lam"] if lam is None else lam
    v = torch.where(mask, v, 0.0) if next_mask else v
    r = token_rewards(case, reward_index, kl_sign)
    B, T = m.shape
    A = torch.zeros(B, T, dtype=torch.float64)
    nv, nm, na = torch.zeros(B, dtype=torch.float64), torch.zeros(B, dtype=torch.float64), torch.zeros(B, dtype=torch.float64)
    for t in reversed(range(T)):
        factor = nm if next_mask else torch.ones_like(nm)
        na = r[:, t] + gamma * nv * factor - v[:, t] + gamma * lam * factor * na
        A[:, t] = na
        nv, nm = v[:, t], m[:, t]
    return A, case.tensors["values"].double()


def _gae(case):
    mask = case.mask
    A, v = _gae_raw(case)
    white = masked_whiten(A, mask)
    biased = (A - masked_mean(A, mask)) / torch.sqrt(masked_mean((A - masked_mean(A, mask)) ** 2, mask) + 1e-8)
    out = [
        ("advantages", A, "the advantages must be whitened over the real tokens of the batch (masked_whiten)"),
        ("advantages", biased, "whitening uses the variance with Bessel's correction (n - 1): use masked_whiten"),
        ("returns", white + v, "compute the returns from the unwhitened advantages: returns = A + values"),
    ]
    for variant, message in (
        (dict(reward_index="end"), "final_rewards goes at each row's last real token (index L_b - 1), not at T - 1"),
        (dict(next_mask=False), "multiply V_{t+1} and A_{t+1} by m_{t+1}: values from padding leak into real tokens"),
        (dict(gamma=case.scalars["lam"], lam=case.scalars["gamma"]), "gamma and lam are swapped"),
        (dict(kl_sign=1.0), "the token reward is -kl_penalties: the KL penalty lowers the reward"),
    ):
        Av, _ = _gae_raw(case, **variant)
        out += [("returns", Av + v, message), ("advantages", masked_whiten(Av, mask), message)]
    return out


PATTERNS = {1: _policy, 2: _value, 3: _entropy, 4: _gae}


def suggest(exercise: int, case, submitted, reference, tol: Tolerance) -> str | None:
    """A hint for exercises 1-4 when the submission's outputs match a known mistake that, on
    this case, gives something other than the reference."""
    if exercise not in PATTERNS or submitted is None or reference is None:
        return None
    mask = case.mask
    for name, wrong, message in PATTERNS[exercise](case):
        got, right = submitted.outputs.get(name), reference.outputs.get(name)
        if got is None:
            continue
        if got.dim() == 2:
            got, wrong, right = got[mask], wrong[mask], right[mask]
        if close(got, wrong, tol)[0] and not close(right, wrong, tol)[0]:
            return message
    return None


def suggest_update(case, submitted, reference_fn, compare_fn, tol: Tolerance) -> str | None:
    """A hint for exercise 5: rerun the reference with one known mistake and see if it matches."""
    if submitted is None:
        return None

    def variant(**changes):
        v = copy.deepcopy(case)
        if "prompt_shift" in changes:
            v = dataclasses.replace(v, prompt_lengths=[p + changes.pop("prompt_shift") for p in v.prompt_lengths])
        v.cfg.update(changes)
        return v

    candidates = [
        (dict(prompt_shift=1), "your slice is off by one: the logits and values of response token t sit at P - 1 + t"),
        (dict(temperature=1.0), "divide the sliced logits by cfg.temperature, as the rollout did"),
        (dict(grad_accum_steps=1), "divide the loss by cfg.grad_accum_steps before backward()"),
        (dict(max_grad_norm=1e30), "clip the gradient norm with clip_grad_norm_(model.parameters(), cfg.max_grad_norm)"),
        (dict(vf_coeff=1.0), "weight the value loss by cfg.vf_coeff"),
        (dict(entropy_coeff=0.0), "add cfg.entropy_coeff * entropy_loss to the total loss"),
    ]
    for changes, message in candidates:
        if any(k in case.cfg and case.cfg[k] == v for k, v in changes.items()):
            continue  # the variant equals the case itself
        try:
            wrong = reference_fn(variant(**changes))
        except Exception:  # e.g. the shifted slice runs past the sequence
            continue
        if not compare_fn(case, wrong, submitted, tol):
            return message
    return None

"""Correct alternative 4: masking by multiplication, ``(x * m).sum() / m.sum()``.

No helpers are used. Numerical paths:
  * masking: the float mask ``m`` multiplies. Every padded INPUT is first zeroed by
    multiplication (``x * m``), so that no intermediate at a padded position can overflow from
    finite junk (e.g. exp(junk) = inf, then inf * 0 = nan); reductions are
    ``(x * m).sum() / m.sum()``. This is correct for any FINITE junk in padding. It is NOT
    robust to inf/nan junk (inf * 0 = nan); the contract's "junk" wording is what decides
    whether that matters.
  * dtype: reductions in ``torch.promote_types(dtype, float32)`` (float64 stays float64).
  * ex 1: per token ``torch.max(-A * r, -A * clamp(r))``; clip fraction as the contract writes it.
  * ex 2: contract formula.
  * ex 3: max-shifted ``H = logsumexp(z - max) - sum(softmax(z) * (z - max))`` in float32 or
    wider; logits of padded rows are zeroed by multiplication before use.
  * ex 4: backward Python loop, the m_{t+1} factors applied by multiplication; whitening by
    hand with multiplications by the mask; returns from the unwhitened advantages.
  * ex 5: log-probs as ``logits - torch.logsumexp(logits, -1, keepdim=True)`` then gather;
    metrics read AFTER backward with ``float(t)`` on tensors that still require grad (torch emits
    a UserWarning "Converting a tensor with requires_grad=True to a scalar"; harmless unless a
    grader turns warnings into errors); ``optimizer.zero_grad(set_to_none=False)``; step guarded
    by ``math.isfinite(float(grad_norm))``.

Junk in padding (measured with check_alternatives.py): any finite junk leaves every output and
gradient unchanged (gradients at padded slots are exactly 0); inf/nan junk gives nan outputs.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _dt(x):
    return torch.promote_types(x.dtype, torch.float32)


def _mean(x, m):
    return (x * m).sum() / m.sum()


def compute_policy_loss(logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
    dtype = _dt(logprobs_new)
    m = response_mask.to(dtype)
    new = logprobs_new.to(dtype) * m
    old = logprobs_old.to(dtype) * m
    adv = advantages.to(dtype) * m
    ratio = torch.exp(new - old)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio)
    loss = _mean(torch.max(pg1, pg2), m)
    with torch.no_grad():
        clip_frac = _mean((pg2 > pg1).to(dtype), m)
        approx_kl = _mean(old - new, m)
    return loss, clip_frac, approx_kl


def compute_value_loss(values_new, values_old, returns, response_mask, clip_range_value):
    dtype = _dt(values_new)
    m = response_mask.to(dtype)
    vn = values_new.to(dtype) * m
    vo = values_old.to(dtype) * m
    ret = returns.to(dtype) * m
    v_clip = vo + torch.clamp(vn - vo, -clip_range_value, clip_range_value)
    l1 = (vn - ret) ** 2
    l2 = (v_clip - ret) ** 2
    loss = 0.5 * _mean(torch.max(l1, l2), m)
    with torch.no_grad():
        clip_frac = _mean((l2 > l1).to(dtype), m)
    return loss, clip_frac


def compute_entropy_loss(logits, response_mask):
    dtype = _dt(logits)
    m = response_mask.to(dtype)
    z = logits.to(dtype) * m.unsqueeze(-1)
    z = z - z.max(dim=-1, keepdim=True).values.detach()
    p = torch.softmax(z, dim=-1)
    entropy = torch.logsumexp(z, dim=-1) - (p * z).sum(dim=-1)
    return -_mean(entropy, m)


def compute_gae_advantages(final_rewards, kl_penalties, values, response_mask, gamma, lam):
    with torch.no_grad():
        dtype = _dt(values)
        m = response_mask.to(dtype)
        v = values.detach().to(dtype) * m
        r = -kl_penalties.detach().to(dtype) * m
        B, T = v.shape
        lengths = response_mask.bool().sum(dim=1)
        last = (lengths - 1).clamp(min=0)
        nonempty = (lengths > 0).to(dtype)
        r[torch.arange(B, device=v.device), last] += final_rewards.detach().to(dtype) * nonempty

        adv = torch.zeros_like(v)
        a_next = torch.zeros(B, dtype=dtype, device=v.device)
        v_next = torch.zeros(B, dtype=dtype, device=v.device)
        m_next = torch.zeros(B, dtype=dtype, device=v.device)
        for t in range(T - 1, -1, -1):
            delta = r[:, t] + gamma * v_next * m_next - v[:, t]
            a_next = delta + gamma * lam * m_next * a_next
            adv[:, t] = a_next
            v_next, m_next = v[:, t], m[:, t]
        returns = adv + values.detach().to(dtype)

        n = m.sum()
        mean = (adv * m).sum() / n
        var = (((adv - mean) * m) ** 2).sum() / (n - 1)
        whitened = (adv - mean) / torch.sqrt(var + 1e-8)
    return whitened, returns


def ppo_minibatch_update(model, optimizer, minibatch: dict[str, Any], cfg, step_optimizer):
    P = int(minibatch["prompt_length"])
    response_ids = minibatch["response_ids"]
    T = response_ids.shape[-1]
    mask = minibatch["response_mask"]

    logits, values = model(minibatch["input_ids"], minibatch["attention_mask"])
    logits = logits[:, P - 1 : P + T - 1] / cfg.temperature
    values_new = values[:, P - 1 : P + T - 1]
    z = logits.to(_dt(logits))
    log_probs = z - torch.logsumexp(z, -1, keepdim=True)
    logprobs_new = log_probs.gather(-1, response_ids.long().unsqueeze(-1)).squeeze(-1)

    policy_loss, policy_cf, approx_kl = compute_policy_loss(
        logprobs_new, minibatch["logprobs_old"], minibatch["advantages"], mask, cfg.clip_ratio)
    value_loss, value_cf = compute_value_loss(
        values_new, minibatch["values_old"], minibatch["returns"], mask, cfg.clip_range_value)
    entropy_loss = compute_entropy_loss(logits, mask)
    loss = policy_loss + cfg.vf_coeff * value_loss + cfg.entropy_coeff * entropy_loss
    (loss / cfg.grad_accum_steps).backward()

    result = {
        "loss/policy": float(policy_loss),
        "loss/value": float(value_loss),
        "loss/entropy": float(entropy_loss),
        "loss/total": float(loss),
        "stats/policy_clipfrac": float(policy_cf),
        "stats/value_clipfrac": float(value_cf),
        "stats/approx_kl": float(approx_kl),
    }
    if step_optimizer:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        if math.isfinite(float(grad_norm)):
            optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        result["stats/grad_norm"] = float(grad_norm)
    return result

"""Correct alternative 7: float32 internals, results cast back to the input's (wider) dtype.

No helpers are used. Numerical paths:
  * every computation runs in float32 (``.float()`` downcasts float64 inputs), and each result
    is cast back to ``promote_types(input dtype, float32)`` at the end: float64 inputs get
    float64 results carrying float32 precision.
  * masking: boolean indexing ``x[mask]`` then ``.sum() / n``.
  * ex 1: per token ``torch.maximum(-A * r, -A * clamp(r))``; clip fraction as the logical
    expression ``((A > 0) & (r > 1 + eps)) | ((A < 0) & (r < 1 - eps))``.
  * ex 2: contract formula, in float32.
  * ex 3: ``-(exp(log_softmax(z)) * log_softmax(z)).sum(-1)`` in float32 on the selected rows.
  * ex 4: backward Python loop in float32 (internals), the real-token slots selected with
    ``torch.where``; whitening with ``torch.var(A[mask], unbiased=True)``; results cast back.
  * ex 5: ``torch.log_softmax(logits.float(), dim=-1).gather(...)``; metrics read BEFORE
    backward; ``clip_grad_norm_(..., error_if_nonfinite=False)``;
    ``optimizer.zero_grad(set_to_none=False)``; step guarded by ``math.isfinite(float(norm))``.

Junk in padding (measured with check_alternatives.py): the real tokens are selected BEFORE any
arithmetic, so no junk (finite, inf or nan) changes any output or any gradient; gradients at
padded slots are exactly 0.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _out(dtype):
    return torch.promote_types(dtype, torch.float32)


def compute_policy_loss(logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
    out = _out(logprobs_new.dtype)
    sel = response_mask.bool()
    new = logprobs_new[sel].float()
    old = logprobs_old[sel].float()
    adv = advantages[sel].float()
    n = new.numel()
    ratio = (new - old).exp()
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_ratio, 1 + clip_ratio))
    loss = (per_token.sum() / n).to(out)
    with torch.no_grad():
        hit = ((adv > 0) & (ratio > 1 + clip_ratio)) | ((adv < 0) & (ratio < 1 - clip_ratio))
        clip_frac = (hit.float().sum() / n).to(out)
        approx_kl = ((old - new).sum() / n).to(out)
    return loss, clip_frac, approx_kl


def compute_value_loss(values_new, values_old, returns, response_mask, clip_range_value):
    out = _out(values_new.dtype)
    sel = response_mask.bool()
    vn, vo, ret = values_new[sel].float(), values_old[sel].float(), returns[sel].float()
    n = vn.numel()
    v_clip = vo + (vn - vo).clamp(-clip_range_value, clip_range_value)
    sq = (vn - ret) ** 2
    sq_clip = (v_clip - ret) ** 2
    loss = (0.5 * torch.maximum(sq, sq_clip).sum() / n).to(out)
    clip_frac = ((sq_clip > sq).detach().float().sum() / n).to(out)
    return loss, clip_frac


def compute_entropy_loss(logits, response_mask):
    out = _out(logits.dtype)
    z = logits[response_mask.bool()].float()  # (N, V)
    logp = z.log_softmax(dim=-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return (-entropy.sum() / entropy.numel()).to(out)


def compute_gae_advantages(final_rewards, kl_penalties, values, response_mask, gamma, lam):
    with torch.no_grad():
        out = _out(values.dtype)
        sel = response_mask.bool()
        v = values.detach().float()
        B, T = v.shape
        z = torch.zeros_like(v)
        rew = torch.where(sel, -kl_penalties.detach().float(), z)
        lens = sel.sum(1).tolist()
        fr = final_rewards.detach().float()
        for b, L in enumerate(lens):
            if L:
                rew[b, L - 1] = rew[b, L - 1] + fr[b]
        v_real = torch.where(sel, v, z)
        adv = torch.zeros_like(v)
        gl = float(gamma) * float(lam)
        for t in range(T - 1, -1, -1):
            if t == T - 1:
                delta = rew[:, t] - v_real[:, t]
                adv[:, t] = delta
            else:
                nxt = sel[:, t + 1]
                delta = rew[:, t] + gamma * torch.where(nxt, v_real[:, t + 1], 0.0) - v_real[:, t]
                adv[:, t] = delta + gl * torch.where(nxt, adv[:, t + 1], 0.0)
        returns = (adv + v).to(out)
        real = adv[sel]
        whitened = ((adv - real.mean()) / torch.sqrt(torch.var(real, unbiased=True) + 1e-8)).to(out)
    return whitened, returns


def ppo_minibatch_update(model, optimizer, minibatch: dict[str, Any], cfg, step_optimizer):
    P = int(minibatch["prompt_length"])
    rid = minibatch["response_ids"].long()
    T = rid.shape[1]
    mask = minibatch["response_mask"]

    logits, values = model(minibatch["input_ids"], minibatch["attention_mask"])
    logits = logits[:, P - 1 : P + T - 1] / cfg.temperature
    values_new = values[:, P - 1 : P + T - 1]
    logprobs_new = torch.log_softmax(logits.float(), dim=-1).gather(dim=-1, index=rid.unsqueeze(-1)).squeeze(-1)

    pl, pcf, kl = compute_policy_loss(logprobs_new, minibatch["logprobs_old"], minibatch["advantages"], mask,
                                      cfg.clip_ratio)
    vl, vcf = compute_value_loss(values_new, minibatch["values_old"], minibatch["returns"], mask, cfg.clip_range_value)
    el = compute_entropy_loss(logits, mask)
    total = pl + cfg.vf_coeff * vl + cfg.entropy_coeff * el
    metrics = {
        "loss/policy": pl.item(), "loss/value": vl.item(), "loss/entropy": el.item(), "loss/total": total.item(),
        "stats/policy_clipfrac": pcf.item(), "stats/value_clipfrac": vcf.item(), "stats/approx_kl": kl.item(),
    }
    (total / cfg.grad_accum_steps).backward()
    if step_optimizer:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm, error_if_nonfinite=False)
        if math.isfinite(float(norm)):
            optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        metrics["stats/grad_norm"] = float(norm)
    return metrics

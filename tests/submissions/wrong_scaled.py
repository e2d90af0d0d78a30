"""WRONG on purpose: every output is the correct value times a constant factor (2.0).

For a grader self-test only. Shapes, dtypes (float32-or-wider, dtype-preserving) and gradient
status are right; the numbers are off by the factor ``SCALE``:
  * ex 1: loss, clip_frac and approx_kl all multiplied by 2 (the loss gradient too);
  * ex 2: loss and clip_frac multiplied by 2;
  * ex 3: the entropy loss multiplied by 2;
  * ex 4: advantages and returns multiplied by 2;
  * ex 5: backward on ``2 * loss / grad_accum_steps`` (so the gradients, the grad norm and the
    clipped step are computed from doubled gradients), every metric multiplied by 2.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SCALE = 2.0


def _dt(x):
    return torch.promote_types(x.dtype, torch.float32)


def _mean(x, mask):
    x = x.to(_dt(x))
    return torch.where(mask, x, torch.zeros_like(x)).sum() / mask.sum()


def compute_policy_loss(logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
    m = response_mask.bool()
    ratio = torch.exp(logprobs_new - logprobs_old)
    u = -advantages * ratio
    c = -advantages * ratio.clamp(1 - clip_ratio, 1 + clip_ratio)
    loss = _mean(torch.maximum(u, c), m)
    with torch.no_grad():
        cf = _mean((c > u).to(loss.dtype), m)
        kl = _mean(logprobs_old - logprobs_new, m)
    return SCALE * loss, SCALE * cf, SCALE * kl


def compute_value_loss(values_new, values_old, returns, response_mask, clip_range_value):
    m = response_mask.bool()
    v_clip = values_old + (values_new - values_old).clamp(-clip_range_value, clip_range_value)
    a = (values_new - returns) ** 2
    b = (v_clip - returns) ** 2
    loss = 0.5 * _mean(torch.maximum(a, b), m)
    with torch.no_grad():
        cf = _mean((b > a).to(loss.dtype), m)
    return SCALE * loss, SCALE * cf


def compute_entropy_loss(logits, response_mask):
    z = logits.to(_dt(logits))
    logp = torch.log_softmax(z, -1)
    h = -(logp.exp() * logp).sum(-1)
    return -SCALE * _mean(h, response_mask.bool())


def compute_gae_advantages(final_rewards, kl_penalties, values, response_mask, gamma, lam):
    with torch.no_grad():
        m = response_mask.bool()
        dt = _dt(values)
        v = torch.where(m, values.to(dt), 0.0)
        r = torch.where(m, -kl_penalties.to(dt), 0.0)
        L = m.sum(1)
        for b in range(v.shape[0]):
            if L[b] > 0:
                r[b, L[b] - 1] += final_rewards[b].to(dt)
        A = torch.zeros_like(v)
        nxt_a = torch.zeros_like(v[:, 0])
        nxt_v = torch.zeros_like(v[:, 0])
        nxt_m = torch.zeros_like(v[:, 0])
        for t in range(v.shape[1] - 1, -1, -1):
            delta = r[:, t] + gamma * nxt_v * nxt_m - v[:, t]
            nxt_a = delta + gamma * lam * nxt_m * nxt_a
            A[:, t] = nxt_a
            nxt_v, nxt_m = v[:, t], m[:, t].to(dt)
        returns = A + values.to(dt)
        real = A[m]
        white = (A - real.mean()) / torch.sqrt(real.var(unbiased=True) + 1e-8)
    return SCALE * white, SCALE * returns


def ppo_minibatch_update(model, optimizer, minibatch: dict[str, Any], cfg, step_optimizer):
    P = int(minibatch["prompt_length"])
    ids = minibatch["response_ids"].long()
    T = ids.shape[1]
    mask = minibatch["response_mask"]
    logits, values = model(minibatch["input_ids"], minibatch["attention_mask"])
    logits = logits[:, P - 1 : P + T - 1] / cfg.temperature
    values_new = values[:, P - 1 : P + T - 1]
    z = logits.to(_dt(logits))
    logprobs_new = (z - torch.logsumexp(z, -1, keepdim=True)).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    pl, pcf, kl = compute_policy_loss(logprobs_new, minibatch["logprobs_old"], minibatch["advantages"], mask,
                                      cfg.clip_ratio)
    vl, vcf = compute_value_loss(values_new, minibatch["values_old"], minibatch["returns"], mask, cfg.clip_range_value)
    el = compute_entropy_loss(logits, mask)
    loss = pl + cfg.vf_coeff * vl + cfg.entropy_coeff * el  # already SCALE times the correct loss
    (loss / cfg.grad_accum_steps).backward()
    metrics = {"loss/policy": pl.item(), "loss/value": vl.item(), "loss/entropy": el.item(), "loss/total": loss.item(),
               "stats/policy_clipfrac": pcf.item(), "stats/value_clipfrac": vcf.item(), "stats/approx_kl": kl.item()}
    if step_optimizer:
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        if math.isfinite(float(gn)):
            optimizer.step()
        optimizer.zero_grad()
        metrics["stats/grad_norm"] = float(gn)
    return metrics

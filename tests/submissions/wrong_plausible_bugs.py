"""WRONG on purpose: the plausible student mistakes, one or more in every function.

For a grader self-test only. Shapes, dtypes and gradient status are right; it runs without
raising, also on empty rows. The bugs:
  * ex 1: the optimistic ``torch.min`` instead of the pessimistic max; a mean of per-row means
    instead of the token-mean; clip fraction with ``>=`` (counts ties, e.g. A == 0); approx_kl
    with the sign flipped (``new - old``).
  * ex 2: no factor 0.5; the clipped error uses ``clamp(values_new, -c, c)`` (clips the value,
    not its change); mean of per-row means.
  * ex 3: a mean of per-row means of the entropy.
  * ex 4: the final reward added at index T-1 of every row (not L_b - 1); no m_{t+1} factors
    (values and advantages leak in from padding); whitening with the biased variance (n);
    returns from the whitened advantages.
  * ex 5: slice ``[P : P+T]`` (off by one); no division by the temperature; no division by
    grad_accum_steps; steps even on a non-finite grad norm; loss/entropy reported as +H.
"""

from __future__ import annotations

from typing import Any

import torch


def _dt(x):
    return torch.promote_types(x.dtype, torch.float32)


def _mean_of_row_means(x, mask):
    m = mask.bool()
    x = torch.where(m, x.to(_dt(x)), torch.zeros((), dtype=_dt(x), device=x.device))
    n = m.sum(1)
    row = x.sum(1) / n.clamp(min=1)
    nonempty = n > 0
    return row[nonempty].mean()


def compute_policy_loss(logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
    ratio = torch.exp(logprobs_new - logprobs_old)
    u = -advantages * ratio
    c = -advantages * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio)
    loss = _mean_of_row_means(torch.min(u, c), response_mask)
    with torch.no_grad():
        cf = _mean_of_row_means((c >= u).to(loss.dtype), response_mask)
        kl = _mean_of_row_means(logprobs_new - logprobs_old, response_mask)
    return loss, cf, kl


def compute_value_loss(values_new, values_old, returns, response_mask, clip_range_value):
    v_clip = torch.clamp(values_new, -clip_range_value, clip_range_value)
    a = (values_new - returns) ** 2
    b = (v_clip - returns) ** 2
    loss = _mean_of_row_means(torch.max(a, b), response_mask)
    with torch.no_grad():
        cf = _mean_of_row_means((b > a).to(loss.dtype), response_mask)
    return loss, cf


def compute_entropy_loss(logits, response_mask):
    z = logits.to(_dt(logits))
    h = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)
    return -_mean_of_row_means(h, response_mask)


def compute_gae_advantages(final_rewards, kl_penalties, values, response_mask, gamma, lam):
    with torch.no_grad():
        m = response_mask.bool()
        dt = _dt(values)
        v = values.to(dt)
        r = -kl_penalties.to(dt)
        r[:, -1] += final_rewards.to(dt)
        B, T = v.shape
        A = torch.zeros_like(v)
        last = torch.zeros(B, dtype=dt, device=v.device)
        for t in reversed(range(T)):
            nv = v[:, t + 1] if t + 1 < T else torch.zeros(B, dtype=dt, device=v.device)
            delta = r[:, t] + gamma * nv - v[:, t]
            last = delta + gamma * lam * last
            A[:, t] = last
        real = A[m]
        white = (A - real.mean()) / torch.sqrt(real.var(unbiased=False) + 1e-8)
        returns = white + v
    return white, returns


def ppo_minibatch_update(model, optimizer, minibatch: dict[str, Any], cfg, step_optimizer):
    P = int(minibatch["prompt_length"])
    ids = minibatch["response_ids"].long()
    T = ids.shape[1]
    mask = minibatch["response_mask"]
    logits, values = model(minibatch["input_ids"], minibatch["attention_mask"])
    logits = logits[:, P : P + T]
    values_new = values[:, P : P + T]
    logprobs_new = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    pl, pcf, kl = compute_policy_loss(logprobs_new, minibatch["logprobs_old"], minibatch["advantages"], mask,
                                      cfg.clip_ratio)
    vl, vcf = compute_value_loss(values_new, minibatch["values_old"], minibatch["returns"], mask, cfg.clip_range_value)
    el = compute_entropy_loss(logits, mask)
    loss = pl + cfg.vf_coeff * vl + cfg.entropy_coeff * el
    loss.backward()
    metrics = {"loss/policy": pl.item(), "loss/value": vl.item(), "loss/entropy": -el.item(), "loss/total": loss.item(),
               "stats/policy_clipfrac": pcf.item(), "stats/value_clipfrac": vcf.item(), "stats/approx_kl": kl.item()}
    if step_optimizer:
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        metrics["stats/grad_norm"] = float(gn)
    return metrics

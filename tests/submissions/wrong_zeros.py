"""WRONG on purpose: every function returns zeros of the right shape, dtype and gradient status.

For a grader self-test only. It imports and runs without raising:
  * ex 1 / ex 2 / ex 3: the loss is ``0 * sum(input)`` (a scalar in float32-or-wider whose
    gradient reaches the input, all zeros); the metrics are zero scalars without gradient.
  * ex 4: zeros (B, T) in float32-or-wider, without gradient.
  * ex 5: runs the forward pass and a backward of a zero loss (so every gradient is 0), clips
    and steps the optimizer when asked, zeroes the gradients, and reports 0.0 for every metric.
"""

from __future__ import annotations

from typing import Any

import torch


def _dt(x):
    return torch.promote_types(x.dtype, torch.float32)


def compute_policy_loss(logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
    dt = _dt(logprobs_new)
    loss = (logprobs_new.to(dt) * 0).sum()
    zero = torch.zeros((), dtype=dt, device=logprobs_new.device)
    return loss, zero.clone(), zero.clone()


def compute_value_loss(values_new, values_old, returns, response_mask, clip_range_value):
    dt = _dt(values_new)
    loss = (values_new.to(dt) * 0).sum()
    return loss, torch.zeros((), dtype=dt, device=values_new.device)


def compute_entropy_loss(logits, response_mask):
    return (logits.to(_dt(logits)) * 0).sum()


def compute_gae_advantages(final_rewards, kl_penalties, values, response_mask, gamma, lam):
    z = torch.zeros(values.shape, dtype=_dt(values), device=values.device)
    return z, z.clone()


def ppo_minibatch_update(model, optimizer, minibatch: dict[str, Any], cfg, step_optimizer):
    P = int(minibatch["prompt_length"])
    ids = minibatch["response_ids"]
    T = ids.shape[1]
    mask = minibatch["response_mask"]
    logits, values = model(minibatch["input_ids"], minibatch["attention_mask"])
    logits = logits[:, P - 1 : P + T - 1] / cfg.temperature
    values_new = values[:, P - 1 : P + T - 1]
    logprobs_new = torch.log_softmax(logits.float(), -1).gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)
    pl, pcf, kl = compute_policy_loss(logprobs_new, minibatch["logprobs_old"], minibatch["advantages"], mask,
                                      cfg.clip_ratio)
    vl, vcf = compute_value_loss(values_new, minibatch["values_old"], minibatch["returns"], mask, cfg.clip_range_value)
    el = compute_entropy_loss(logits, mask)
    loss = pl + cfg.vf_coeff * vl + cfg.entropy_coeff * el
    (loss / cfg.grad_accum_steps).backward()
    metrics = {k: 0.0 for k in ("loss/policy", "loss/value", "loss/entropy", "loss/total",
                                "stats/policy_clipfrac", "stats/value_clipfrac", "stats/approx_kl")}
    if step_optimizer:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        metrics["stats/grad_norm"] = 0.0
    return metrics

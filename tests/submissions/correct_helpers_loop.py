"""Correct alternative 1: the given helpers, a backward Python loop, dtype-preserving.

Numerical paths:
  * masking: ``assignment.helpers.masked_mean`` / ``masked_whiten`` (torch.where inside);
    every reduction in ``reduction_dtype`` (float64 stays float64, bf16/float32 -> float32).
  * ex 1: per token ``torch.maximum(-A * r, -A * clamp(r))``; clip fraction written as the
    contract writes it (``clipped_term > unclipped_term``); metrics under ``torch.no_grad()``.
  * ex 2: ``v_clip = v_old + clamp(v_new - v_old, -c, c)`` literally, ``torch.maximum``.
  * ex 3: ``H = logsumexp(z) - sum(softmax(z) * z)`` literally (no max shift), z upcast with
    ``reduction_dtype``.
  * ex 4: backward Python loop over t with ``torch.where`` on m_{t+1}; returns before
    whitening; whitening with ``masked_whiten``.
  * ex 5: ``logprobs_from_logits`` helper; metrics read AFTER backward;
    ``optimizer.zero_grad()`` (default set_to_none=True); step guarded by
    ``math.isfinite(float(grad_norm))``.

Junk in padding (measured with check_alternatives.py): no output on real tokens changes for any
junk. Padding is masked AFTER the per-token arithmetic, so junk that overflows ``exp`` (e.g.
logprobs_old = -1234.5 and logprobs_new = +1234.5 at a padded slot) gives a NaN gradient at that
padded slot of ``logprobs_new`` (0 * inf); in exercise 5 a logprobs_old junk below about -709
makes every model gradient NaN (grad norm NaN, step skipped). inf/nan junk likewise gives NaN
gradients at padded slots in exercises 1-3.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from assignment.helpers import logprobs_from_logits, masked_mean, masked_whiten, reduction_dtype


def compute_policy_loss(logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
    mask = response_mask.bool()
    ratio = torch.exp(logprobs_new - logprobs_old)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    per_token = torch.maximum(unclipped, clipped)
    loss = masked_mean(per_token, mask)
    with torch.no_grad():
        clip_frac = masked_mean((clipped > unclipped).to(loss.dtype), mask)
        approx_kl = masked_mean(logprobs_old - logprobs_new, mask)
    return loss, clip_frac, approx_kl


def compute_value_loss(values_new, values_old, returns, response_mask, clip_range_value):
    mask = response_mask.bool()
    v_clip = values_old + torch.clamp(values_new - values_old, -clip_range_value, clip_range_value)
    err_unclipped = (values_new - returns) ** 2
    err_clipped = (v_clip - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(err_unclipped, err_clipped), mask)
    with torch.no_grad():
        clip_frac = masked_mean((err_clipped > err_unclipped).to(loss.dtype), mask)
    return loss, clip_frac


def compute_entropy_loss(logits, response_mask):
    z = logits.to(reduction_dtype(logits.dtype))
    entropy = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
    return -masked_mean(entropy, response_mask.bool())


def compute_gae_advantages(final_rewards, kl_penalties, values, response_mask, gamma, lam):
    with torch.no_grad():
        mask = response_mask.bool()
        dtype = reduction_dtype(values.dtype)
        values = values.detach().to(dtype)
        B, T = values.shape
        zero = torch.zeros((), dtype=dtype, device=values.device)
        rewards = torch.where(mask, -kl_penalties.detach().to(dtype), zero)
        lengths = mask.sum(dim=1)
        for b in range(B):
            L = int(lengths[b])
            if L > 0:
                rewards[b, L - 1] += final_rewards[b].detach().to(dtype)
        advantages = torch.zeros_like(values)
        next_adv = torch.zeros(B, dtype=dtype, device=values.device)
        next_val = torch.zeros(B, dtype=dtype, device=values.device)
        next_mask = torch.zeros(B, dtype=torch.bool, device=values.device)
        for t in range(T - 1, -1, -1):
            nv = torch.where(next_mask, next_val, zero)
            na = torch.where(next_mask, next_adv, zero)
            delta = rewards[:, t] + gamma * nv - values[:, t]
            advantages[:, t] = delta + gamma * lam * na
            next_adv = advantages[:, t]
            next_val = values[:, t]
            next_mask = mask[:, t]
        returns = advantages + values
        whitened = masked_whiten(advantages, mask)
    return whitened, returns


def ppo_minibatch_update(model, optimizer, minibatch: dict[str, Any], cfg, step_optimizer):
    P = int(minibatch["prompt_length"])
    response_ids = minibatch["response_ids"]
    T = response_ids.shape[1]
    mask = minibatch["response_mask"]

    logits, values = model(minibatch["input_ids"], minibatch["attention_mask"])
    logits = logits[:, P - 1 : P + T - 1] / cfg.temperature
    values_new = values[:, P - 1 : P + T - 1]
    logprobs_new = logprobs_from_logits(logits, response_ids)

    policy_loss, policy_clipfrac, approx_kl = compute_policy_loss(
        logprobs_new, minibatch["logprobs_old"], minibatch["advantages"], mask, cfg.clip_ratio)
    value_loss, value_clipfrac = compute_value_loss(
        values_new, minibatch["values_old"], minibatch["returns"], mask, cfg.clip_range_value)
    entropy_loss = compute_entropy_loss(logits, mask)
    loss = policy_loss + cfg.vf_coeff * value_loss + cfg.entropy_coeff * entropy_loss
    (loss / cfg.grad_accum_steps).backward()

    metrics = {
        "loss/policy": policy_loss.item(),
        "loss/value": value_loss.item(),
        "loss/entropy": entropy_loss.item(),
        "loss/total": loss.item(),
        "stats/policy_clipfrac": policy_clipfrac.item(),
        "stats/value_clipfrac": value_clipfrac.item(),
        "stats/approx_kl": approx_kl.item(),
    }
    if step_optimizer:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        if math.isfinite(float(grad_norm)):
            optimizer.step()
        optimizer.zero_grad()
        metrics["stats/grad_norm"] = float(grad_norm)
    return metrics

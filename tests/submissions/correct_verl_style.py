"""Correct alternative 6: written the way verl's ``core_algos.py`` writes things, with helpers.

Numerical paths:
  * masking: ``assignment.helpers.masked_mean`` / ``masked_whiten`` (torch.where inside).
  * ex 1: verl's ``negative_approx_kl = new - old``, ``ratio = exp(negative_approx_kl)``,
    ``ppo_kl = masked_mean(-negative_approx_kl)``, ``pg_losses1 = -A * ratio``,
    ``pg_losses2 = -A * clamp(ratio)``, ``torch.maximum``, ``pg_clipfrac`` via
    ``torch.gt(pg_losses2, pg_losses1)`` (the contract's strict >). verl's [-20, 20] clamp of the
    log-ratio is NOT used: the contract has none.
  * ex 2: verl's ``clip_by_value(vpreds, values - c, values + c)``, i.e.
    ``v_clip = clamp(values_new, values_old - c, values_old + c)``. This equals the contract's
    ``values_old + clamp(values_new - values_old, -c, c)`` in exact arithmetic; in floating point
    it returns ``values_new`` itself when unclipped, where the contract's literal expression may
    return ``values_new`` +- 1 ulp (so the strict ``>`` of the clip fraction may differ on ties).
  * ex 3: verl's ``entropy_from_logits``: ``logsumexp(z) - sum(softmax(z) * z)`` on z upcast
    with ``reduction_dtype`` (float64 stays float64).
  * ex 4: backward Python loop like verl's ``compute_gae_advantage_return`` (``nextvalues``,
    ``lastgaelam``), with the contract's m_{t+1} factors; ``returns = advantages + values``
    before ``masked_whiten``.
  * ex 5: ``logprobs_from_logits`` helper; metrics read BEFORE backward;
    ``clip_grad_norm_(..., error_if_nonfinite=False)``; ``optimizer.zero_grad()`` (default);
    step guarded by ``math.isfinite(float(grad_norm))``.

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
    negative_approx_kl = logprobs_new - logprobs_old
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl.detach(), response_mask)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_loss = masked_mean(clip_pg_losses1, response_mask)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).to(pg_loss.dtype), response_mask).detach()
    return pg_loss, pg_clipfrac, ppo_kl


def _clip_by_value(x, tensor_min, tensor_max):
    return torch.max(torch.min(x, tensor_max), tensor_min)


def compute_value_loss(values_new, values_old, returns, response_mask, clip_range_value):
    vpredclipped = _clip_by_value(values_new, values_old - clip_range_value, values_old + clip_range_value)
    vf_losses1 = (values_new - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    clipped_vf_losses = torch.max(vf_losses1, vf_losses2)
    vf_loss = 0.5 * masked_mean(clipped_vf_losses, response_mask)
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).to(vf_loss.dtype), response_mask).detach()
    return vf_loss, vf_clipfrac


def _entropy_from_logits(logits):
    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def compute_entropy_loss(logits, response_mask):
    z = logits.to(reduction_dtype(logits.dtype))
    return -masked_mean(_entropy_from_logits(z), response_mask)


def compute_gae_advantages(final_rewards, kl_penalties, values, response_mask, gamma, lam):
    with torch.no_grad():
        eos_mask = response_mask.bool()
        dtype = reduction_dtype(values.dtype)
        values = values.detach().to(dtype)
        token_level_rewards = torch.where(eos_mask, -kl_penalties.detach().to(dtype), 0.0)
        lengths = eos_mask.sum(-1)
        rows = torch.nonzero(lengths > 0).flatten()
        token_level_rewards[rows, lengths[rows] - 1] += final_rewards.detach().to(dtype)[rows]

        lastgaelam = 0
        advantages_reversed = []
        gen_len = token_level_rewards.shape[-1]
        for t in reversed(range(gen_len)):
            if t < gen_len - 1:
                m_next = eos_mask[:, t + 1]
                nextvalues = torch.where(m_next, values[:, t + 1], 0.0)
                carry = torch.where(m_next, lastgaelam, 0.0)
            else:
                nextvalues = 0.0
                carry = 0.0
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam = delta + gamma * lam * carry
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
        advantages = masked_whiten(advantages, eos_mask)
    return advantages, returns


def ppo_minibatch_update(model, optimizer, minibatch: dict[str, Any], cfg, step_optimizer):
    prompt_length = int(minibatch["prompt_length"])
    response_length = minibatch["response_ids"].size(-1)
    response_mask = minibatch["response_mask"]

    output_logits, output_values = model(minibatch["input_ids"], minibatch["attention_mask"])
    sl = slice(prompt_length - 1, prompt_length + response_length - 1)
    logits = output_logits[:, sl, :]
    logits = logits.div(cfg.temperature)
    vpreds = output_values[:, sl]
    log_prob = logprobs_from_logits(logits, minibatch["response_ids"])

    pg_loss, pg_clipfrac, ppo_kl = compute_policy_loss(
        log_prob, minibatch["logprobs_old"], minibatch["advantages"], response_mask, cfg.clip_ratio)
    vf_loss, vf_clipfrac = compute_value_loss(
        vpreds, minibatch["values_old"], minibatch["returns"], response_mask, cfg.clip_range_value)
    entropy_loss = compute_entropy_loss(logits, response_mask)
    policy_loss = pg_loss + cfg.vf_coeff * vf_loss + cfg.entropy_coeff * entropy_loss

    metrics = {
        "loss/policy": pg_loss.detach().item(),
        "loss/value": vf_loss.detach().item(),
        "loss/entropy": entropy_loss.detach().item(),
        "loss/total": policy_loss.detach().item(),
        "stats/policy_clipfrac": pg_clipfrac.item(),
        "stats/value_clipfrac": vf_clipfrac.item(),
        "stats/approx_kl": ppo_kl.item(),
    }
    loss = policy_loss / cfg.grad_accum_steps
    loss.backward()
    if step_optimizer:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=cfg.max_grad_norm,
                                                   error_if_nonfinite=False)
        if math.isfinite(float(grad_norm)):
            optimizer.step()
        optimizer.zero_grad()
        metrics["stats/grad_norm"] = float(grad_norm)
    return metrics

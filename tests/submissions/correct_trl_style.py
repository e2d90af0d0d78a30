"""Correct alternative 5: written the way TRL's PPO trainer writes things, with the helpers.

Numerical paths:
  * masking: ``assignment.helpers.masked_mean`` and ``masked_whiten`` (torch.where inside).
  * ex 1: TRL's names: ``pg_losses = -A * ratio``, ``pg_losses2 = -A * clamp(ratio)``,
    ``pg_loss_max = torch.max(pg_losses, pg_losses2)``; ``pg_clipfrac`` as the contract writes
    it, ``masked_mean((pg_losses2 > pg_losses).float())`` (a float32 metric, also for float64
    inputs); approx_kl from the detached log-ratio.
  * ex 2: TRL's ``vpredclipped = values_old + clamp(vpred - values_old, -c, c)``.
  * ex 3: TRL's ``entropy_from_logits``: ``logsumexp(z) - sum(softmax(z) * z)`` on
    ``logits.float()`` (float32 even for float64 logits).
  * ex 4: TRL's backward loop with ``lastgaelam``, collecting per-step tensors in a list,
    reversed and stacked; the m_{t+1} factors applied by multiplication after ``torch.where``
    sanitising of values; whitening with ``masked_whiten``.
  * ex 5: ``torch.log_softmax(logits.float(), dim=-1).gather(...)``, i.e. float32 log-probs
    even for a float64 model; metrics read AFTER backward;
    ``optimizer.zero_grad(set_to_none=True)``; step guarded by ``torch.isfinite(grad_norm)``.

Junk in padding (measured with check_alternatives.py): no output on real tokens changes for any
junk. Padding is masked AFTER the per-token arithmetic, so junk that overflows ``exp`` (e.g.
logprobs_old = -1234.5 and logprobs_new = +1234.5 at a padded slot) gives a NaN gradient at that
padded slot of ``logprobs_new`` (0 * inf); in exercise 5 (float32 log-probs, float64 old ones) a
logprobs_old junk below about -709 makes every model gradient NaN (grad norm NaN, step skipped).
inf/nan junk likewise gives NaN gradients at padded slots in exercises 1-3.
"""

from __future__ import annotations

from typing import Any

import torch

from assignment.helpers import masked_mean, masked_whiten


def compute_policy_loss(logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
    logprobs_diff = logprobs_new - logprobs_old
    ratio = torch.exp(logprobs_diff)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    pg_loss_max = torch.max(pg_losses, pg_losses2)
    pg_loss = masked_mean(pg_loss_max, response_mask)
    pg_clipfrac = masked_mean((pg_losses2 > pg_losses).float(), response_mask).detach()
    approx_kl = masked_mean(-logprobs_diff.detach(), response_mask)
    return pg_loss, pg_clipfrac, approx_kl


def compute_value_loss(values_new, values_old, returns, response_mask, clip_range_value):
    vpredclipped = values_old + torch.clamp(values_new - values_old, -clip_range_value, clip_range_value)
    vf_losses1 = torch.square(values_new - returns)
    vf_losses2 = torch.square(vpredclipped - returns)
    vf_loss_max = torch.max(vf_losses1, vf_losses2)
    vf_loss = 0.5 * masked_mean(vf_loss_max, response_mask)
    vf_clipfrac = masked_mean((vf_losses2 > vf_losses1).float(), response_mask).detach()
    return vf_loss, vf_clipfrac


def _entropy_from_logits(logits):
    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def compute_entropy_loss(logits, response_mask):
    return -masked_mean(_entropy_from_logits(logits.float()), response_mask)


def compute_gae_advantages(final_rewards, kl_penalties, values, response_mask, gamma, lam):
    with torch.no_grad():
        mask = response_mask.bool()
        values = values.detach().to(torch.promote_types(values.dtype, torch.float32))
        gen_length = values.shape[1]
        scores = torch.where(mask, -kl_penalties.detach().to(values.dtype), torch.zeros_like(values))
        seq_len = mask.sum(dim=1)
        for i in range(values.shape[0]):
            if seq_len[i] > 0:
                scores[i, seq_len[i] - 1] += final_rewards[i]
        clean_values = torch.where(mask, values, torch.zeros_like(values))
        fmask = mask.to(values.dtype)

        lastgaelam = torch.zeros_like(values[:, 0])
        advantages_reversed = []
        for t in reversed(range(gen_length)):
            if t < gen_length - 1:
                nextvalues = clean_values[:, t + 1] * fmask[:, t + 1]
                nextmask = fmask[:, t + 1]
            else:
                nextvalues = torch.zeros_like(values[:, 0])
                nextmask = torch.zeros_like(values[:, 0])
            delta = scores[:, t] + gamma * nextvalues - clean_values[:, t]
            lastgaelam = delta + gamma * lam * nextmask * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


def ppo_minibatch_update(model, optimizer, minibatch: dict[str, Any], cfg, step_optimizer):
    context_length = int(minibatch["prompt_length"])
    responses = minibatch["response_ids"]
    response_length = responses.shape[1]
    padding_mask = minibatch["response_mask"]

    logits, vpred = model(minibatch["input_ids"], minibatch["attention_mask"])
    logits = logits[:, context_length - 1 : context_length + response_length - 1]
    logits = logits / cfg.temperature  # out of place: the model's output may be saved for backward
    vpred = vpred[:, context_length - 1 : context_length + response_length - 1]
    all_logprob = torch.log_softmax(logits.float(), dim=-1)
    new_logprobs = torch.gather(all_logprob, 2, responses.long().unsqueeze(-1)).squeeze(-1)

    pg_loss, pg_clipfrac, approxkl = compute_policy_loss(
        new_logprobs, minibatch["logprobs_old"], minibatch["advantages"], padding_mask, cfg.clip_ratio)
    vf_loss, vf_clipfrac = compute_value_loss(
        vpred, minibatch["values_old"], minibatch["returns"], padding_mask, cfg.clip_range_value)
    entropy_loss = compute_entropy_loss(logits, padding_mask)
    loss = pg_loss + cfg.vf_coeff * vf_loss + cfg.entropy_coeff * entropy_loss
    (loss / cfg.grad_accum_steps).backward()

    stats = {
        "loss/policy": pg_loss.item(),
        "loss/value": vf_loss.item(),
        "loss/entropy": entropy_loss.item(),
        "loss/total": loss.item(),
        "stats/policy_clipfrac": pg_clipfrac.item(),
        "stats/value_clipfrac": vf_clipfrac.item(),
        "stats/approx_kl": approxkl.item(),
    }
    if step_optimizer:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        if torch.isfinite(grad_norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stats["stats/grad_norm"] = grad_norm.item()
    return stats

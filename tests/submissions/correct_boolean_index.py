"""Correct alternative 3: boolean indexing, a logical clip fraction, a vectorized GAE.

No helpers are used. Numerical paths:
  * masking: boolean indexing ``x[mask].mean()`` (selects the real tokens, then averages);
    reductions in ``torch.promote_types(dtype, float32)`` (float64 stays float64).
  * ex 1: per token ``-torch.minimum(A * r, A * clamp(r))``; clip fraction as the logical
    expression ``((A > 0) & (r > 1 + eps)) | ((A < 0) & (r < 1 - eps))`` (A == 0 never counts).
  * ex 2: contract formula on the selected real tokens only.
  * ex 3: ``torch.distributions.Categorical(logits=logits.float()).entropy()``, i.e. in float32
    even for float64 logits (result float32).
  * ex 4: vectorized GAE with a (B, T, T) discount matrix ``(gamma*lam)**(k-t)``, cut where a
    padded step lies in (t, k]; whitening with ``torch.var(unbiased=True)`` on ``A[mask]``.
  * ex 5: log-probs as ``logits - torch.logsumexp(logits, -1, keepdim=True)`` then gather;
    metrics read BEFORE backward; ``clip_grad_norm_(..., error_if_nonfinite=False)``;
    ``optimizer.zero_grad(set_to_none=True)``; step guarded by ``torch.isfinite(grad_norm)``.

Junk in padding (measured with check_alternatives.py): the real tokens are selected BEFORE any
arithmetic, so no junk (finite, inf or nan) changes any output or any gradient; gradients at
padded slots are exactly 0.
"""

from __future__ import annotations

from typing import Any

import torch


def _wide(x):
    return x.to(torch.promote_types(x.dtype, torch.float32))


def compute_policy_loss(logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
    m = response_mask.bool()
    new = _wide(logprobs_new[m])
    old = _wide(logprobs_old[m])
    adv = _wide(advantages[m])
    ratio = torch.exp(new - old)
    surrogate = adv * ratio
    surrogate_clipped = adv * ratio.clamp(min=1 - clip_ratio, max=1 + clip_ratio)
    loss = (-torch.minimum(surrogate, surrogate_clipped)).mean()
    with torch.no_grad():
        clipped = ((adv > 0) & (ratio > 1 + clip_ratio)) | ((adv < 0) & (ratio < 1 - clip_ratio))
        clip_frac = clipped.to(loss.dtype).mean()
        approx_kl = (old - new).mean()
    return loss, clip_frac, approx_kl


def compute_value_loss(values_new, values_old, returns, response_mask, clip_range_value):
    m = response_mask.bool()
    vn, vo, ret = _wide(values_new[m]), _wide(values_old[m]), _wide(returns[m])
    v_clip = vo + (vn - vo).clamp(-clip_range_value, clip_range_value)
    e1 = (vn - ret).square()
    e2 = (v_clip - ret).square()
    loss = 0.5 * torch.maximum(e1, e2).mean()
    clip_frac = (e2 > e1).detach().to(loss.dtype).mean()
    return loss, clip_frac


def compute_entropy_loss(logits, response_mask):
    m = response_mask.bool()
    dist = torch.distributions.Categorical(logits=logits[m].float())  # (N, V)
    return -dist.entropy().mean()


def compute_gae_advantages(final_rewards, kl_penalties, values, response_mask, gamma, lam):
    with torch.no_grad():
        m = response_mask.bool()
        values = _wide(values.detach())
        dtype, device = values.dtype, values.device
        B, T = values.shape
        zero = torch.zeros((), dtype=dtype, device=device)

        rewards = torch.where(m, -kl_penalties.detach().to(dtype), zero)
        lengths = m.sum(dim=1)
        pos = torch.arange(T, device=device)
        is_last = (pos.unsqueeze(0) == (lengths - 1).unsqueeze(1)) & (lengths > 0).unsqueeze(1)
        rewards = rewards + torch.where(is_last, final_rewards.detach().to(dtype).unsqueeze(1), zero)

        v = torch.where(m, values, zero)
        next_m = torch.cat([m[:, 1:], torch.zeros(B, 1, dtype=torch.bool, device=device)], dim=1)
        next_v = torch.cat([v[:, 1:], torch.zeros(B, 1, dtype=dtype, device=device)], dim=1)
        delta = rewards + gamma * torch.where(next_m, next_v, zero) - v  # 0 on padding

        # D[b, t, k] = (gamma*lam)^(k-t) if k >= t and every step in (t, k] is real, else 0
        gaps = torch.cumsum((~m).long(), dim=1)  # number of padded steps in [0, k]
        no_pad_between = (gaps.unsqueeze(1) - gaps.unsqueeze(2)) == 0  # [b, t, k]
        expo = pos.unsqueeze(0) - pos.unsqueeze(1)  # k - t
        upper = expo >= 0
        base = torch.tensor(gamma * lam, dtype=dtype, device=device)
        powers = torch.where(upper, torch.pow(base, expo.clamp(min=0).to(dtype)), zero)
        D = torch.where(no_pad_between & upper.unsqueeze(0), powers.unsqueeze(0), zero)
        advantages = torch.einsum("btk,bk->bt", D, delta)

        returns = advantages + values
        real = advantages[m]
        mean = real.mean()
        var = torch.var(real, unbiased=True)
        whitened = (advantages - mean) / torch.sqrt(var + 1e-8)
    return whitened, returns


def ppo_minibatch_update(model, optimizer, minibatch: dict[str, Any], cfg, step_optimizer):
    P = minibatch["prompt_length"]
    response_ids = minibatch["response_ids"].long()
    T = response_ids.size(1)
    mask = minibatch["response_mask"]

    all_logits, all_values = model(minibatch["input_ids"], minibatch["attention_mask"])
    logits = all_logits[:, P - 1 : P + T - 1] / cfg.temperature
    values_new = all_values[:, P - 1 : P + T - 1]
    z = _wide(logits)
    logp_all = z - torch.logsumexp(z, dim=-1, keepdim=True)
    logprobs_new = torch.gather(logp_all, 2, response_ids[..., None])[..., 0]

    pl, pcf, kl = compute_policy_loss(logprobs_new, minibatch["logprobs_old"], minibatch["advantages"], mask,
                                      cfg.clip_ratio)
    vl, vcf = compute_value_loss(values_new, minibatch["values_old"], minibatch["returns"], mask,
                                 cfg.clip_range_value)
    el = compute_entropy_loss(logits, mask)
    total = pl + cfg.vf_coeff * vl + cfg.entropy_coeff * el
    metrics = {
        "loss/policy": pl.item(), "loss/value": vl.item(), "loss/entropy": el.item(), "loss/total": total.item(),
        "stats/policy_clipfrac": pcf.item(), "stats/value_clipfrac": vcf.item(), "stats/approx_kl": kl.item(),
    }
    (total / cfg.grad_accum_steps).backward()
    if step_optimizer:
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm, error_if_nonfinite=False)
        if torch.isfinite(gn).item():
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        metrics["stats/grad_norm"] = gn.item()
    return metrics

"""Correct alternative 2: everything in float32, float32 results even for float64 inputs.

No helpers are used. Numerical paths:
  * every floating input goes through ``.float()`` first (float64 is DOWNcast, bfloat16 is
    upcast); every returned tensor is float32, whatever the input dtype. The contract only asks
    for reductions in float32 or wider.
  * masking: ``torch.where(mask, x, 0).sum() / mask.sum()`` written by hand.
  * ex 1: per token ``-torch.min(A * r, A * clamp(r))``; clip fraction as the contract writes it
    (``-A * clamp(r) > -A * r``); metrics from detached tensors.
  * ex 2: contract formula, ``torch.max`` of the two squared errors.
  * ex 3: ``H = -(exp(log_softmax(z)) * log_softmax(z)).sum(-1)`` on ``logits.float()``.
  * ex 4: backward Python loop in float32; whitening by hand (two-pass mean / Bessel variance,
    divide by ``sqrt(var + 1e-8)``); returns from the unwhitened advantages.
  * ex 5: ``torch.log_softmax(logits.float(), dim=-1).gather(...)`` (the TRL / verl line);
    metrics read BEFORE backward; ``optimizer.zero_grad(set_to_none=False)``; step guarded by
    ``torch.isfinite(grad_norm)``.

Junk in padding (measured with check_alternatives.py): no output on real tokens changes for any
junk. Padding is masked AFTER the per-token arithmetic (in float32), so junk that overflows
``exp`` (a junk log-ratio above about 88) gives a NaN gradient at that padded slot of
``logprobs_new`` (0 * inf); in exercise 5 a logprobs_old junk below about -88 makes every model
gradient NaN (grad norm NaN, step skipped). inf/nan junk likewise gives NaN gradients at padded
slots in exercises 1-3.
"""

from __future__ import annotations

from typing import Any

import torch


def _token_mean(x, mask):
    x = x.float()
    return torch.where(mask, x, torch.zeros_like(x)).sum() / mask.sum().float()


def compute_policy_loss(logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
    mask = response_mask.bool()
    new, old, adv = logprobs_new.float(), logprobs_old.float(), advantages.float()
    ratio = torch.exp(new - old)
    clamped = torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio)
    per_token = -torch.min(adv * ratio, adv * clamped)
    loss = _token_mean(per_token, mask)
    r = ratio.detach()
    c = clamped.detach()
    clip_frac = _token_mean((-adv * c > -adv * r).float(), mask)
    approx_kl = _token_mean((old - new).detach(), mask)
    return loss, clip_frac, approx_kl


def compute_value_loss(values_new, values_old, returns, response_mask, clip_range_value):
    mask = response_mask.bool()
    vn, vo, ret = values_new.float(), values_old.float(), returns.float()
    v_clip = vo + torch.clamp(vn - vo, -clip_range_value, clip_range_value)
    a = (vn - ret) ** 2
    b = (v_clip - ret) ** 2
    loss = 0.5 * _token_mean(torch.max(a, b), mask)
    clip_frac = _token_mean((b > a).detach().float(), mask)
    return loss, clip_frac


def compute_entropy_loss(logits, response_mask):
    logp = torch.log_softmax(logits.float(), dim=-1)
    entropy = -(torch.exp(logp) * logp).sum(dim=-1)
    return -_token_mean(entropy, response_mask.bool())


def compute_gae_advantages(final_rewards, kl_penalties, values, response_mask, gamma, lam):
    with torch.no_grad():
        mask = response_mask.bool()
        vals = values.detach().float()
        kl = kl_penalties.detach().float()
        fr = final_rewards.detach().float()
        B, T = vals.shape
        zeros = torch.zeros_like(vals)
        rewards = torch.where(mask, -kl, zeros)
        lengths = mask.long().sum(dim=1)
        has_tokens = lengths > 0
        last = (lengths - 1).clamp(min=0)
        bonus = torch.where(has_tokens, fr, torch.zeros_like(fr))
        rewards = rewards.scatter_add(1, last.unsqueeze(1), bonus.unsqueeze(1))

        vals_clean = torch.where(mask, vals, zeros)
        adv = torch.zeros_like(vals)
        running = torch.zeros(B, device=vals.device)
        for t in reversed(range(T)):
            if t + 1 < T:
                m_next = mask[:, t + 1].float()
                v_next = vals_clean[:, t + 1]
            else:
                m_next = torch.zeros(B, device=vals.device)
                v_next = torch.zeros(B, device=vals.device)
            delta = rewards[:, t] + gamma * v_next * m_next - vals_clean[:, t]
            running = delta + gamma * lam * m_next * running
            adv[:, t] = running
        returns = adv + vals

        n = mask.sum().float()
        mean = torch.where(mask, adv, zeros).sum() / n
        centred = torch.where(mask, adv - mean, zeros)
        var = (centred ** 2).sum() / (n - 1)
        whitened = (adv - mean) / torch.sqrt(var + 1e-8)
    return whitened, returns


def ppo_minibatch_update(model, optimizer, minibatch: dict[str, Any], cfg, step_optimizer):
    P = int(minibatch["prompt_length"])
    ids = minibatch["response_ids"]
    T = ids.shape[1]
    mask = minibatch["response_mask"]

    logits, values = model(minibatch["input_ids"], minibatch["attention_mask"])
    logits = logits[:, P - 1 : P + T - 1]
    logits = logits / cfg.temperature
    values_new = values[:, P - 1 : P + T - 1]
    logprobs_new = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)

    pol, pol_cf, kl = compute_policy_loss(logprobs_new, minibatch["logprobs_old"], minibatch["advantages"], mask,
                                          cfg.clip_ratio)
    val, val_cf = compute_value_loss(values_new, minibatch["values_old"], minibatch["returns"], mask,
                                     cfg.clip_range_value)
    ent = compute_entropy_loss(logits, mask)
    loss = pol + cfg.vf_coeff * val + cfg.entropy_coeff * ent

    out = {
        "loss/policy": float(pol.detach()),
        "loss/value": float(val.detach()),
        "loss/entropy": float(ent.detach()),
        "loss/total": float(loss.detach()),
        "stats/policy_clipfrac": float(pol_cf),
        "stats/value_clipfrac": float(val_cf),
        "stats/approx_kl": float(kl),
    }
    (loss / cfg.grad_accum_steps).backward()
    if step_optimizer:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        if bool(torch.isfinite(grad_norm)):
            optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        out["stats/grad_norm"] = float(grad_norm)
    return out

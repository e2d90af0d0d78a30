"""Correct alternative 9: Categorical entropy, GAE as a triangular linear solve, cross-entropy log-probs.

No helpers are used. Numerical paths:
  * masking: ``torch.where`` then ``.sum() / n``, reductions in
    ``torch.promote_types(dtype, float32)`` (float64 stays float64; bf16 -> float32).
  * ex 1: per token ``torch.max(-A * r, -A * clamp(r))``; clip fraction as the contract writes it, computed from detached
    copies; approx_kl is the mean of the detached ``old - new``.
  * ex 2: contract formula with ``torch.clamp``; clip fraction as the contract writes it.
  * ex 3: ``torch.distributions.Categorical(logits=z).entropy()`` with z in the reduction dtype
    (float64 stays float64, bf16 upcast to float32), evaluated on all (B, T) rows after the
    padded rows are replaced by zeros with ``torch.where``, then masked with ``torch.where``.
  * ex 4: vectorized GAE as the bidiagonal system (I - gamma*lam*S_m) A = delta, solved with
    ``torch.linalg.solve_triangular`` (S_m has m_{t+1} on its superdiagonal); whitening by hand;
    returns from the unwhitened advantages.
  * ex 5: log-probs as ``-F.cross_entropy(logits, ids, reduction="none")`` in the reduction
    dtype; metrics read BEFORE backward; ``clip_grad_norm_(..., error_if_nonfinite=False)``;
    ``optimizer.zero_grad(set_to_none=True)``; step guarded by ``torch.isfinite(grad_norm)``.

Junk in padding (measured with check_alternatives.py): no output on real tokens changes for any
junk. Padding is masked AFTER the per-token arithmetic, so junk that overflows ``exp`` (e.g.
logprobs_old = -1234.5 and logprobs_new = +1234.5 at a padded slot) gives a NaN gradient at that
padded slot of ``logprobs_new`` (0 * inf); in exercise 5 a logprobs_old junk below about -709
makes every model gradient NaN (grad norm NaN, step skipped). inf/nan junk likewise gives NaN
gradients at padded slots in exercises 1-2 (exercise 3 replaces padded logits before use).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def _rd(t):
    return torch.promote_types(t.dtype, torch.float32)


def _token_mean(x, mask):
    x = x.to(_rd(x))
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.where(mask, x, zero).sum() / mask.sum().to(x.dtype)


def compute_policy_loss(logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
    mask = response_mask.bool()
    log_ratio = logprobs_new - logprobs_old
    ratio = log_ratio.exp()
    term = -advantages * ratio
    term_clipped = -advantages * ratio.clamp(1 - clip_ratio, 1 + clip_ratio)
    loss = _token_mean(torch.max(term, term_clipped), mask)
    clip_frac = _token_mean((term_clipped.detach() > term.detach()).to(loss.dtype), mask)
    approx_kl = _token_mean(-log_ratio.detach(), mask)
    return loss, clip_frac, approx_kl


def compute_value_loss(values_new, values_old, returns, response_mask, clip_range_value):
    mask = response_mask.bool()
    v_clip = values_old + (values_new - values_old).clamp(-clip_range_value, clip_range_value)
    err = (values_new - returns).pow(2)
    err_clip = (v_clip - returns).pow(2)
    loss = 0.5 * _token_mean(torch.max(err, err_clip), mask)
    clip_frac = _token_mean((err_clip > err).detach().to(loss.dtype), mask)
    return loss, clip_frac


def compute_entropy_loss(logits, response_mask):
    mask = response_mask.bool()
    z = logits.to(_rd(logits))
    # padded rows replaced by zeros first: Categorical validates its logits and rejects nan junk
    z = torch.where(mask.unsqueeze(-1), z, torch.zeros((), dtype=z.dtype, device=z.device))
    entropy = torch.distributions.Categorical(logits=z).entropy()  # (B, T)
    return -_token_mean(entropy, mask)


def compute_gae_advantages(final_rewards, kl_penalties, values, response_mask, gamma, lam):
    with torch.no_grad():
        mask = response_mask.bool()
        dtype = _rd(values)
        dev = values.device
        B, T = values.shape
        zero = torch.zeros((), dtype=dtype, device=dev)
        v = torch.where(mask, values.detach().to(dtype), zero)
        r = torch.where(mask, -kl_penalties.detach().to(dtype), zero)
        n_real = mask.sum(dim=1)
        last_idx = (n_real - 1).clamp(min=0)
        add = torch.where(n_real > 0, final_rewards.detach().to(dtype), zero)
        r = r.scatter_add(1, last_idx[:, None], add[:, None])

        m_next = torch.zeros(B, T, dtype=dtype, device=dev)
        m_next[:, :-1] = mask[:, 1:].to(dtype)
        v_next = torch.zeros(B, T, dtype=dtype, device=dev)
        v_next[:, :-1] = v[:, 1:]
        delta = r + gamma * v_next * m_next - v

        # U A = delta with U = I - gamma*lam*diag_{+1}(m_{t+1}): A_t - gamma*lam*m_{t+1}*A_{t+1} = delta_t
        U = torch.diag_embed(torch.ones(B, T, dtype=dtype, device=dev))
        U = U - torch.diag_embed(gamma * lam * m_next[:, :-1], offset=1)
        A = torch.linalg.solve_triangular(U, delta.unsqueeze(-1), upper=True, unitriangular=True).squeeze(-1)

        returns = A + values.detach().to(dtype)
        n = mask.sum().to(dtype)
        mu = torch.where(mask, A, zero).sum() / n
        var = torch.where(mask, (A - mu).square(), zero).sum() / (n - 1)
        whitened = (A - mu) / (var + 1e-8).sqrt()
    return whitened, returns


def ppo_minibatch_update(model, optimizer, minibatch: dict[str, Any], cfg, step_optimizer):
    P = int(minibatch["prompt_length"])
    ids = minibatch["response_ids"].long()
    B, T = ids.shape
    mask = minibatch["response_mask"]

    logits_all, values_all = model(minibatch["input_ids"], minibatch["attention_mask"])
    logits = logits_all[:, P - 1 : P + T - 1] / cfg.temperature
    values_new = values_all[:, P - 1 : P + T - 1]
    z = logits.to(_rd(logits))
    logprobs_new = -F.cross_entropy(z.reshape(B * T, -1), ids.reshape(B * T), reduction="none").view(B, T)

    pol, pol_cf, kl = compute_policy_loss(logprobs_new, minibatch["logprobs_old"], minibatch["advantages"], mask,
                                          cfg.clip_ratio)
    val, val_cf = compute_value_loss(values_new, minibatch["values_old"], minibatch["returns"], mask,
                                     cfg.clip_range_value)
    ent = compute_entropy_loss(logits, mask)
    loss = pol + cfg.vf_coeff * val + cfg.entropy_coeff * ent
    metrics = {
        "loss/policy": float(pol.item()),
        "loss/value": float(val.item()),
        "loss/entropy": float(ent.item()),
        "loss/total": float(loss.item()),
        "stats/policy_clipfrac": float(pol_cf.item()),
        "stats/value_clipfrac": float(val_cf.item()),
        "stats/approx_kl": float(kl.item()),
    }
    (loss / cfg.grad_accum_steps).backward()
    if step_optimizer:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm, error_if_nonfinite=False)
        if torch.isfinite(grad_norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        metrics["stats/grad_norm"] = float(grad_norm.item())
    return metrics

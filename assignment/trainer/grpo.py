"""GRPO and Dr. GRPO around the student's exercises (Part II, handout.md section 8).

Shapes: ``B`` responses (``B / G`` prompts, each ``G = rollout.group_size`` times, adjacent),
``T`` padded response length.

What changes from PPO, and where:
  - advantages: exercise 6 (``impl.compute_grpo_advantages``) on the groups, std-normalised for
    ``grpo`` and not for ``dr_grpo``; no critic (``values_old`` and ``returns`` are zeros and the
    value loss's coefficient is 0, ``ppo.UpdateConfig.from_config``), no KL in the reward;
  - loss: the student's own ``ppo_minibatch_update`` (exercise 5) runs unchanged; for each of its
    calls ``policy_loss_swap`` rebinds its module-level ``compute_policy_loss`` to a wrapper that
    calls the student's exercise 1 with rescaled advantages (so that its token-mean becomes
    exercise 7's mode) and adds ``kl_coeff * aggregate_loss(compute_kl(..., "k3"))``.

Why rescaled advantages give exercise 7's mode exactly: the clipped surrogate
``max(-A r, -A clip(r))`` is positively homogeneous in A (``c > 0`` factors out of the max), and
every mode of ``aggregate_loss`` is linear in the per-token loss, ``sum_t w_t loss_t`` with
``w_t`` its gradient with respect to token t. Exercise 1 returns ``(1/n) sum_t loss_t(A_t)`` over
the n real tokens, so with ``A'_t = n w_t A_t`` it returns ``sum_t w_t loss_t(A_t)``, the mode's
value, and its gradient. The clip fraction and approx_kl are unchanged by a positive scale. The
given code thus computes no part of exercises 1 or 5 (no Part I answer leaks), and Part I's
signatures stay as they are. (verl instead passes ``loss_agg_mode`` to its policy loss.)

References: Shao et al. (2024), DeepSeekMath (GRPO); Liu et al. (2025), "Understanding
R1-Zero-Like Training" (Dr. GRPO); verl's ``compute_grpo_outcome_advantage`` and ``agg_loss``.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Any, Callable, Iterator

import torch

from assignment.trainer.config import Config
from assignment.trainer.impl import ImplError

# Added to the group std before dividing (exercise 6's eps): verl's default epsilon.
GRPO_EPS = 1e-6

# Exercise 7's mode for each algorithm (verl's names; TRL's loss_type "grpo" and "dr_grpo").
LOSS_AGG_MODE = {"grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}

# What a GRPO run calls on the exercise module besides Part I's REQUIRED (impl.py).
REQUIRED = ("compute_policy_loss", "compute_grpo_advantages", "aggregate_loss", "compute_kl")


class PolicyLossNotCalled(ImplError):
    """The student's update never called ``compute_policy_loss`` by its module-level name."""


def missing(impl: ModuleType) -> list[str]:
    """The Part II names ``impl`` lacks (empty: it can run GRPO)."""
    return [name for name in REQUIRED if not callable(getattr(impl, name, None))]


def group_ids(batch_size: int, group_size: int, device: torch.device) -> torch.Tensor:
    """(B,) int64: responses 0..G-1 answer prompt 0, G..2G-1 prompt 1, ... (the rollout's order)."""
    return torch.arange(batch_size, device=device) // group_size


def advantages(impl: ModuleType, final_rewards: torch.Tensor, response_mask: torch.Tensor, cfg: Config) -> torch.Tensor:
    """Exercise 6 on the rollout's groups: (B, T), std-normalised for grpo, not for dr_grpo."""
    ids = group_ids(final_rewards.shape[0], cfg.rollout.group_size, final_rewards.device)
    return impl.compute_grpo_advantages(final_rewards, ids, response_mask, cfg.algorithm == "grpo", GRPO_EPS)


def zero_spread_groups(final_rewards: torch.Tensor, group_size: int) -> float:
    """Fraction of groups whose rewards are all equal: they get advantage 0 and teach nothing."""
    groups = final_rewards.view(-1, group_size)
    return float((groups == groups[:, :1]).all(dim=-1).float().mean())


def update_batch(batch: dict[str, Any], ref_logprobs: torch.Tensor) -> dict[str, Any]:
    """PPO's update batch for GRPO: no critic (values and returns zeros; the value loss's
    coefficient is 0 too) and the reference's log-probs (B, T) for the k3 term, cut into
    minibatches with the rest (exercise 5 ignores the extra key)."""
    zeros = torch.zeros_like(batch["advantages"])
    return {**batch, "values_old": zeros, "returns": zeros, "ref_logprobs": ref_logprobs}


def token_weights(aggregate: Callable[..., torch.Tensor], response_mask: torch.Tensor, mode: str,
                  max_response_length: int) -> torch.Tensor:
    """(B, T) float32: each token's weight in ``aggregate(loss_mat, mask, mode, max_len)``, the
    gradient of the student's exercise 7 with respect to its per-token input (exact: linear)."""
    probe = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device, requires_grad=True)
    (weights,) = torch.autograd.grad(aggregate(probe, response_mask, mode, max_response_length), probe)
    return weights


@contextmanager
def policy_loss_swap(impl: ModuleType, minibatch: dict[str, Any], cfg: Config,
                     kl_coeff: float) -> Iterator[dict[str, float]]:
    """Inside the block, ``impl.compute_policy_loss`` is exercise 1 in exercise 7's mode plus
    ``kl_coeff`` times the aggregated k3 KL (exercise 8) of ``minibatch``'s rows to the
    reference; the original is put back on exit. Yields a dict that receives ``loss/kl`` (the
    aggregated k3, before the coefficient). Raises PolicyLossNotCalled if the update never
    called the name (then the GRPO loss would silently be PPO's)."""
    exercise_1 = impl.compute_policy_loss
    mode, budget = LOSS_AGG_MODE[cfg.algorithm], cfg.rollout.max_new_tokens
    ref_logprobs = minibatch["ref_logprobs"]  # (b, T) the rows of this minibatch, in its order
    extra: dict[str, float] = {}

    def compute_policy_loss(logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
        if ref_logprobs.shape != logprobs_new.shape:
            raise ImplError(f"compute_policy_loss got log-probs of shape {tuple(logprobs_new.shape)}, but the "
                             f"minibatch's are {tuple(ref_logprobs.shape)}: GRPO needs the whole minibatch's rows")
        weights = token_weights(impl.aggregate_loss, response_mask, mode, budget)  # (b, T)
        n = response_mask.bool().sum()
        scaled = advantages * (n * weights).to(advantages.dtype)  # positive scale: same clipping
        loss, clip_frac, approx_kl = exercise_1(logprobs_new, logprobs_old, scaled, response_mask, clip_ratio)
        kl = impl.aggregate_loss(impl.compute_kl(logprobs_new, ref_logprobs, response_mask, "k3"),
                                 response_mask, mode, budget)
        extra["loss/kl"] = float(kl.detach())
        return loss + kl_coeff * kl, clip_frac, approx_kl

    impl.compute_policy_loss = compute_policy_loss
    try:
        yield extra
    finally:
        impl.compute_policy_loss = exercise_1
    if "loss/kl" not in extra:
        raise PolicyLossNotCalled(
            "ppo_minibatch_update never called compute_policy_loss by its module-level name (hint 5.3): "
            "GRPO and Dr. GRPO run exercise 5 with that name bound to their own loss")

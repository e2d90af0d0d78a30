"""The PPO step around the exercises: the KL penalty and its controller, the update loop.

Shapes: ``B`` responses, ``P`` padded prompt length, ``T`` padded response length.

The trainer reaches student code only through the ``impl`` module passed in: it calls
``impl.compute_gae_advantages`` and ``impl.ppo_minibatch_update``; the latter calls exercises
1-3 by their module-level names inside its own module. Everything else here is given code.

References: Ziegler et al. (2019), "Fine-Tuning Language Models from Human Preferences", for the
adaptive KL controller; CleanRL's ``ppo.py`` for the epochs x shuffled-minibatches loop.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from assignment.trainer.batch import minibatches
from assignment.trainer.config import Config, KLConfig


@dataclass(frozen=True)
class UpdateConfig:
    """What ``ppo_minibatch_update`` reads from its ``cfg`` argument (the contract, handout.md section 4, exercise 5)."""

    temperature: float
    clip_ratio: float
    clip_range_value: float
    vf_coeff: float
    entropy_coeff: float
    grad_accum_steps: int
    max_grad_norm: float

    @classmethod
    def from_config(cls, cfg: Config) -> "UpdateConfig":
        ppo = cfg.ppo
        return cls(cfg.rollout.temperature, ppo.clip_ratio, ppo.clip_range_value, ppo.vf_coeff, ppo.entropy_coeff,
                   ppo.grad_accum_steps, ppo.max_grad_norm)


class KLController:
    """The KL coefficient: fixed, or adapted towards a target KL (Ziegler et al. 2019, eq. 2)."""

    def __init__(self, cfg: KLConfig):
        self.cfg = cfg
        self.value = cfg.coeff

    def update(self, sequence_kl: float, n_sequences: int) -> None:
        """Adapt after a batch whose mean per-sequence KL was ``sequence_kl``."""
        if not self.cfg.adaptive:
            return
        # The proportional error is clipped to +-0.2 so one noisy batch cannot swing the coefficient.
        error = min(max(sequence_kl / self.cfg.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_sequences / self.cfg.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = state["value"]


def kl_penalties(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor,
                 kl_coeff: float) -> torch.Tensor:
    """Per-token k1 penalty ``kl_coeff * (logprobs - ref_logprobs)`` (B, T), zero on padding."""
    return torch.where(response_mask.bool(), kl_coeff * (logprobs - ref_logprobs), 0.0)


def sequence_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) k1 estimate of KL(policy || reference) summed over each response's real tokens."""
    return torch.where(response_mask.bool(), logprobs - ref_logprobs, 0.0).sum(dim=-1)


def ppo_update(impl: ModuleType, policy: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scheduler: Any, batch: dict[str, Any], cfg: Config, generator: torch.Generator,
               progress: Any = None) -> dict[str, float]:
    """``cfg.ppo.epochs`` passes of shuffled minibatches through ``impl.ppo_minibatch_update``.

    ``batch`` is the minibatch dict of the contract (handout.md section 4, exercise 5), for the whole rollout (B rows). The
    optimizer steps at the end of every ``grad_accum_steps`` minibatches, and the scheduler
    after every optimizer step. Returns the mean of each metric over the minibatches (over the
    optimizer steps for ``stats/grad_norm``), plus ``stats/lr``.
    """
    update_cfg = UpdateConfig.from_config(cfg)
    accum = cfg.ppo.grad_accum_steps
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    policy.train()
    optimizer.zero_grad()
    for _ in range(cfg.ppo.epochs):
        for i, minibatch in enumerate(minibatches(batch, cfg.ppo.minibatch_size, generator)):
            step_optimizer = (i + 1) % accum == 0
            metrics = impl.ppo_minibatch_update(policy, optimizer, minibatch, update_cfg, step_optimizer)
            if step_optimizer:
                scheduler.step()
            for key, value in metrics.items():
                sums[key] += float(value)
                counts[key] += 1
            if progress is not None:
                progress.update(1)
    means = {key: sums[key] / counts[key] for key in sums}
    means["stats/lr"] = scheduler.get_last_lr()[0]
    return means

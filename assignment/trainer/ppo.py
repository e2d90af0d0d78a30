"""The PPO step around the exercises: the KL penalty and its controller, the advantage guard,
the update loop with its early stop.

Shapes: ``B`` responses, ``P`` padded prompt length, ``T`` padded response length.

The trainer reaches student code only through the ``impl`` module passed in: it calls
``impl.compute_gae_advantages`` and ``impl.ppo_minibatch_update``; the latter calls exercises
1-3 by their module-level names inside its own module. Everything else here is given code.

References: Ziegler et al. (2019), "Fine-Tuning Language Models from Human Preferences", for the
adaptive KL controller (as in TRL and OpenRLHF); CleanRL's ``ppo.py`` for the epochs x
shuffled-minibatches loop; Stable-Baselines3's PPO for ``target_kl`` (stop a step's update once
approx_kl > 1.5 * target_kl).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, ContextManager, Iterator

import torch
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from assignment.helpers import masked_mean
from assignment.trainer.batch import minibatches
from assignment.trainer.config import Config, ConfigError, KLConfig, PPOConfig
from assignment.trainer.precision import MixedPrecision

# SB3's factor: a step's update stops once a minibatch's approx_kl passes 1.5 * ppo.target_kl.
TARGET_KL_FACTOR = 1.5

# Logged from the first minibatch of each PPO step alone, under the names on the right: before
# its optimizer step the policy is the one that collected the rollout, so ratio = 1 exactly and
# these must read 0 (up to float rounding); anything else means logprobs_new was not computed
# like logprobs_old (wrong slice, temperature, dropout). The step means cannot show this.
FIRST_MINIBATCH_KEYS = {"stats/approx_kl": "stats/approx_kl_first",
                        "stats/policy_clipfrac": "stats/policy_clipfrac_first"}


def weight_matrices(policy: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The policy's 2-D parameters, the matmuls' weights: their dtype is the precision its forwards
    round in (the 16-bit working copy's under model.train_dtype)."""
    return [p for p in policy.parameters() if p.dim() == 2]


def first_kl_tolerance(policy: torch.nn.Module, max_abs_logprob: float, sampler_gap: torch.Tensor | None = None) -> float:
    """How far from 0 the first minibatch's approx_kl may be from floating-point rounding alone.

    The rollout and the update compute log p = logit / temperature - logsumexp(...) with the same
    weights on the same tokens, but in batches of other shapes, so sums may run in another order.
    A sum of n terms in a dtype of unit roundoff u is off by at most n * u of the sum of their
    magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, sec. 3.1). A log-prob
    passes through one such sum per weight matrix (each matmul), two more per layer (attention's
    scores and its weighted sum) and the log-sum-exp: ``chain`` sums, each of at most ``n`` terms
    (the largest dimension of any weight), each adding at most n * u relative error, on values of
    magnitude at most ``max_abs_logprob`` (the rollout's largest |log p|, at least 1). approx_kl
    is a token mean of such per-token differences, so it has the same bound:
        tolerance = chain * n * u * max(|log p|, 1)
    The CPU demo's model (hidden 128, MLP 256, 2 layers, 17 weight matrices, |log p| <= 4.2):
    (17 + 2 * 2 + 1) * 256 * 2^-24 * 4.2 = 1.4e-3, where correct code measures exactly 0; in the
    demo (temperature 0.8) a forgotten temperature gave 3.0e-3 at step 1 and up to 6.6e-2 by
    step 5, a slice one position late 3.6e-2 at step 1. A worst-case bound: on large models it
    exceeds any real difference, so the check is silent there rather than wrong.

    A policy in 16 bits (model.train_dtype, or model.dtype) has u = 2^-8 (bfloat16): the worst case
    above is then silent even on the CPU demo's model (92 there), where correct code measures 0. So
    the bound is taken from the rounding this precision actually makes, measured on the same step:
    ``sampler_gap`` (N,), the differences, token by token over the batch, between the sampler's own
    log-probs of its tokens and logprobs_old (``rollout.SampledLogprobs``): two 16-bit computations
    of the same log-probs with the same weights by other kernels on other shapes (the decoding step
    with its KV cache, and the scoring forward). approx_kl_first is a token mean of differences e_t
    of the same kind (the update's forward against the scoring forward), and |mean e_t| <=
    sqrt(mean e_t^2) (Cauchy-Schwarz). The bound is the root mean square of ``sampler_gap``; that it
    also bounds the update's e_t is an assumption, not a derivation: that the update's kernels round
    no worse than the decoder's. The inequality leaves room for it: for zero-mean rounding the mean
    is ~sqrt(N) times smaller than the root mean square (~60x at 4,000 tokens). Measured on the CPU
    demo's model in bfloat16: 1.5e-3 to 3e-3, where correct code gives 0 and a slice one position
    late 3.6e-2; a forgotten temperature at the demo's 0.8 (3.0e-3 at step 1 in float32) can stay
    under it, at 0.5 it does not (measured on the same model). On Qwen (H200) correct code reached
    approx_kl_first 9.9e-4 with no warning. The bound is logged as stats/first_kl_tolerance.
    """
    matrices = weight_matrices(policy)
    if not matrices:
        return math.inf
    if torch.finfo(matrices[0].dtype).bits == 16 and sampler_gap is not None and sampler_gap.numel():
        return float(sampler_gap.float().pow(2).mean().sqrt())
    config = getattr(getattr(policy, "lm", None), "config", None)
    layers = getattr(config.get_text_config(), "num_hidden_layers", 0) if config is not None else 0
    chain = len(matrices) + 2 * layers + 1
    n = max(max(p.shape) for p in matrices)
    u = torch.finfo(matrices[0].dtype).eps / 2
    return chain * n * u * max(max_abs_logprob, 1.0)


def first_clipfrac_tolerance(policy: torch.nn.Module, kl_tolerance: float, clip_ratio: float) -> float:
    """The share of the first minibatch's tokens that rounding alone may clip: 0 in float32, where
    the two forwards differ by ~1e-6 in log p and no ratio reaches the clip range (``clip_ratio``,
    epsilon), so any clipped token is exercise 1's clip test counting ties (which counts every token
    inside the range: a share near 1).

    In 16 bits (bfloat16, float16) the update's log-probs differ from logprobs_old by rounding e_t of
    root mean square ``kl_tolerance`` (first_kl_tolerance's sampler_gap branch, with the same
    assumption). A token is clipped only if its ratio leaves [1 - eps, 1 + eps], so only if
    |e_t| >= log(1 + eps) (the nearer edge: -log(1 - eps) is farther), and by Chebyshev's inequality
    (Markov's on e_t^2, for any distribution) at most a share
        kl_tolerance^2 / log(1 + eps)^2
    of the tokens does. Two assumptions, not derivations: that the update's rounding is no worse
    than the sampler's (as first_kl_tolerance assumes), and that the first minibatch's tokens are
    no worse than the batch's whole (a minibatch's mean square can exceed the batch's by up to the
    number of minibatches). Where rounding is so large that the bound reaches 1 (rms >= 0.18 at
    eps 0.2), the check is silent. Measured on Qwen (H200, bfloat16): rms 0.020-0.023, eps 0.2:
    bounds 1.2e-2 to 1.6e-2, seen at most 2.6e-3; a clip test counting ties gives ~1."""
    matrices = weight_matrices(policy)
    if not matrices or torch.finfo(matrices[0].dtype).bits != 16:
        return 0.0
    return kl_tolerance ** 2 / math.log1p(clip_ratio) ** 2


FIRST_KL_CAUSES = ("exercise 5 does not compute logprobs_new the way the rollout computed logprobs_old (at the "
                   "first minibatch they must be equal: ratio 1). Likely causes: the response slice (positions "
                   "P-1 ... P+T-2 of the logits and values), the temperature (divide the logits by "
                   "cfg.temperature, as the rollout did), or dropout (the policy in train mode with dropout > 0)")
# With approx_kl_first at 0 the ratio is 1, where -A * ratio and -A * clamp(ratio) are equal: a clip
# fraction above 0 there (above first_clipfrac_tolerance in 16 bits) is exercise 1's clip test, not
# the slice (which moves approx_kl_first too).
FIRST_CLIPFRAC_CAUSES = ("the ratio is 1 at the first minibatch (stats/approx_kl_first is 0 within float rounding, so "
                         "the slice and the temperature are right), where the two terms of exercise 1 are equal and "
                         "no token is clipped: its clip test counts ties. clip_frac counts "
                         "[-A * clamp(ratio) > -A * ratio], with a strict >")


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
        # GRPO and Dr. GRPO train no critic: exercise 5's value loss is multiplied by 0.
        vf_coeff = ppo.vf_coeff if cfg.algorithm == "ppo" else 0.0
        return cls(cfg.rollout.temperature, ppo.clip_ratio, ppo.clip_range_value, vf_coeff, ppo.entropy_coeff,
                   ppo.grad_accum_steps, ppo.max_grad_norm)


class KLController:
    """The KL coefficient: fixed, or adapted towards a target KL (Ziegler et al. 2019, eq. 2):
    ``beta <- beta * (1 + K * clip(KL / target - 1, -0.2, 0.2))`` with ``K = n / horizon`` for a
    batch of ``n`` sequences (TRL's and OpenRLHF's form). ``KL`` is the batch's mean
    per-sequence k1 estimate of KL(policy || reference), measured on the rollout that the
    coefficient then penalises at the next step."""

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


# A token is "far" when the policy and the sampler disagree on its probability by more than this factor.
FAR_RATIO = 2.0


def sampler_mismatch(sampler_logprobs: torch.Tensor, logprobs: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """How far the distribution that sampled the responses is from the policy that PPO treats as
    having sampled them (``rollout.generation_dtype``'s copy decodes; ``logprobs_old`` come from the
    policy's forward). Over the real tokens of the batch, with ``log r = log pi_policy - log pi_sampler``:

    - ``rollout/sampler_kl``: the token mean of ``-log r``, the k1 estimate of KL(sampler || policy)
      per token (the tokens were drawn from the sampler);
    - ``rollout/sampler_ratio_max``: the largest ``r``, the importance weight a correction would give;
    - ``rollout/sampler_far_share``: the share of tokens whose ``r`` is outside [1/2, 2].

    Args: sampler_logprobs, logprobs, response_mask: (B, T); padding may hold anything.
    """
    log_ratio = (logprobs.float() - sampler_logprobs.float())[response_mask.bool()]  # (N,)
    if log_ratio.numel() == 0:
        return {}
    return {"rollout/sampler_kl": float(-log_ratio.mean()),
            "rollout/sampler_ratio_max": float(log_ratio.max().exp()),
            "rollout/sampler_far_share": float((log_ratio.abs() > math.log(FAR_RATIO)).float().mean())}


def guard_advantages(final_rewards: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
                     cfg: PPOConfig) -> tuple[torch.Tensor, dict[str, float], str | None]:
    """Protect the update from advantages whitened out of (almost) nothing.

    ``compute_gae_advantages`` whitens over the batch (the contract), so the advantages always
    have unit scale, whatever the signal. With a binary reward, one rewarded response in 64 gets
    a whitened advantage of about (1 - 1/64) / 0.125 = 7.9 on every token and the other 63 about
    -0.13: the update then pushes one sequence up with full force. Measured on
    Qwen2.5-Coder-0.5B (strict '####' reward): the first such batch pushed approx_kl to 0.20 and
    the clip fraction to 0.10 in one update, and the policy collapsed within 20 steps. With no
    reward spread at all, whitening scales value noise and KL terms up to unit size.

    Args:
        final_rewards: (B,) the task reward of each response.
        advantages: (B, T) whitened advantages from ``compute_gae_advantages``.
        response_mask: (B, T) real tokens.
        cfg: ``ppo.min_reward_std`` (skip the step's update when std(final_rewards) is below it)
            and ``ppo.advantage_clip`` (clip the advantages to +-advantage_clip).
    Returns:
        The (clipped) advantages (B, T), ``stats/*`` metrics, and the reason to skip the
        update, or None to go on.
    """
    real = response_mask.bool()
    spread = float(final_rewards.float().std()) if final_rewards.numel() > 1 else 0.0
    metrics = {"stats/advantage_max": float(advantages[real].abs().max()) if real.any() else 0.0}
    if cfg.advantage_clip is not None:
        outside = (advantages.abs() > cfg.advantage_clip).float()
        metrics["stats/advantage_clipfrac"] = float(masked_mean(outside, real))
        advantages = advantages.clamp(-cfg.advantage_clip, cfg.advantage_clip)
    skip = None
    if spread < cfg.min_reward_std:
        skip = f"final rewards have std {spread:.3f} < ppo.min_reward_std {cfg.min_reward_std}"
    metrics["stats/update_skipped"] = float(skip is not None)
    return advantages, metrics, skip


def early_stop_bound(cfg: PPOConfig) -> float | None:
    """The approx_kl above which a step's update stops (None: never)."""
    return None if cfg.target_kl is None else TARGET_KL_FACTOR * cfg.target_kl


def token_share_weights(epoch: list[dict[str, Any]], accum: int) -> list[float]:
    """For ``ppo.length_grouping``: each minibatch's weight ``accum * n_k / N``, where ``n_k`` is
    its real response tokens and ``N`` those of its accumulation cycle (``accum`` consecutive
    minibatches). Exercise 5 divides each minibatch's token-mean loss by ``accum``; times these
    weights, the cycle's gradient is that of the token mean over all its rows, as if they were one
    minibatch, however they were grouped."""
    tokens = [float(minibatch["response_mask"].sum()) for minibatch in epoch]
    weights = []
    for start in range(0, len(tokens), accum):
        cycle = tokens[start:start + accum]
        total = sum(cycle)
        weights += [accum * n / total if total else 1.0 for n in cycle]
    return weights


@contextmanager
def scaled_gradients(model: torch.nn.Module, scale: float | None) -> Iterator[None]:
    """Inside the block, every gradient that reaches a parameter of ``model`` is multiplied by
    ``scale`` before it is accumulated into ``.grad`` (nothing happens for None). The loss that
    student code computes is left as it is; only the sum the optimizer steps on is reweighted."""
    if scale is None:
        yield
        return
    handles = [param.register_hook(lambda grad: grad * scale) for param in model.parameters() if param.requires_grad]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def process_minibatches(ppo: PPOConfig, world_size: int) -> tuple[int, int]:
    """How each of ``world_size`` processes cuts its share of an optimizer step into exercise-5
    calls: (rows per call, calls per optimizer step). An optimizer step takes
    ``ppo.minibatch_size x ppo.grad_accum_steps`` responses of the global batch, ``1 / world_size``
    of them from each process. ``ppo.process_minibatch_size`` rows per call when set; by default
    calls of ``minibatch_size`` rows, ``grad_accum_steps / world_size`` of them, so that every call
    takes its token mean over as many rows, and needs as much memory, as on one GPU; when
    ``world_size`` does not divide ``grad_accum_steps``, ``grad_accum_steps`` calls of
    ``minibatch_size / world_size`` rows. Raises ConfigError for a split that does not divide."""
    step_rows = ppo.minibatch_size * ppo.grad_accum_steps
    if ppo.minibatch_size % world_size:
        raise ConfigError(f"ppo.minibatch_size ({ppo.minibatch_size}) is global and must be divisible by the number "
                          f"of processes ({world_size})")
    if ppo.process_minibatch_size is None:
        if ppo.grad_accum_steps % world_size == 0:
            return ppo.minibatch_size, ppo.grad_accum_steps // world_size
        return ppo.minibatch_size // world_size, ppo.grad_accum_steps
    share = step_rows // world_size
    if share % ppo.process_minibatch_size:
        raise ConfigError(f"ppo.process_minibatch_size ({ppo.process_minibatch_size}) must divide each process's share "
                          f"of an optimizer step: ppo.minibatch_size x ppo.grad_accum_steps / processes = "
                          f"{ppo.minibatch_size} x {ppo.grad_accum_steps} / {world_size} = {share} rows")
    return ppo.process_minibatch_size, share // ppo.process_minibatch_size


@contextmanager
def gradient_sync(model: torch.nn.Module, sync: bool) -> Iterator[None]:
    """Inside the block, a backward through ``model`` reduces its gradients over the processes
    (``sync``), or leaves them local, to be summed into the next backward that reduces. A
    data-parallel update thus reduces once per optimizer step, on the minibatch that steps,
    instead of after every minibatch: DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``.
    Around a whole exercise-5 call: DDP decides in the forward whether its backward reduces.
    A model of one process: nothing to do.

    FSDP2 keeps the local gradients unsharded until they are reduced: one full float32 copy of
    the gradients per process during accumulation, where reducing each minibatch keeps 1/N of it
    (``ppo.grad_accum_steps: 1`` avoids it)."""
    if sync:
        yield
    elif isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def fsdp_param_groups(state: Any) -> list[Any]:
    """An FSDP2 module state's parameter groups: torch 2.13's list ``_fsdp_param_groups``, or torch
    2.11's one optional ``_fsdp_param_group``. Raises RuntimeError for a torch with neither, rather
    than leave gradients behind unnoticed."""
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    if hasattr(state, "_fsdp_param_group"):
        return [] if state._fsdp_param_group is None else [state._fsdp_param_group]
    raise RuntimeError(f"this torch ({torch.__version__}) keeps FSDP2's parameter groups where the trainer does not "
                       "look (ppo.fsdp_param_groups); the trainer's FSDP runs with torch 2.11 to 2.13")


def drop_local_gradients(model: torch.nn.Module) -> None:
    """Discard the gradients a backward under ``gradient_sync(model, False)`` left unreduced: an
    update stopped early inside an accumulation cycle. DDP keeps them in ``.grad``, which
    ``optimizer.zero_grad`` clears; FSDP2 keeps them on its unsharded parameters, out of the
    optimizer's reach, and would add them into the next reduction (the next step's). FSDP2 has no
    public call for it (torch 2.13): this clears the fields its ``post_backward`` reduces from."""
    if not isinstance(model, FSDPModule):
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            for group in fsdp_param_groups(module._get_fsdp_state()):
                for param in group.fsdp_params:
                    if hasattr(param, "_unsharded_param"):
                        param._unsharded_param.grad = None
                    param.unsharded_accumulated_grad = None


def ppo_update(impl: ModuleType, policy: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scheduler: Any, batch: dict[str, Any], cfg: Config, generator: torch.Generator,
               progress: Any = None,
               around: Callable[[dict[str, Any]], ContextManager[dict[str, float]]] | None = None,
               minibatch_size: int | None = None, agree: Callable[[float], float] | None = None,
               grad_accum_steps: int | None = None) -> dict[str, float]:
    """``cfg.ppo.epochs`` passes of shuffled minibatches through ``impl.ppo_minibatch_update``.

    ``batch`` is the minibatch dict of the contract (handout.md section 4, exercise 5), for the whole rollout (B rows). The
    optimizer steps at the end of every ``grad_accum_steps`` minibatches, and the scheduler
    after every optimizer step. With ``ppo.target_kl`` set, the update stops after the first
    minibatch whose approx_kl exceeds ``early_stop_bound``: the remaining minibatches and epochs
    are skipped and the gradients of an unfinished accumulation cycle are discarded, never
    applied (they come from a policy already past the bound), so nothing is left over for the
    next step. Returns the mean of each metric over the minibatches that ran (over the optimizer
    steps for ``stats/grad_norm``), plus ``stats/lr``, ``stats/minibatches`` (how many ran),
    ``stats/early_stop`` (1 if the update stopped early) and, then, ``stats/early_stop_minibatch``
    (the stopping minibatch's 0-based index in the step) and ``stats/early_stop_approx_kl`` (its
    approx_kl). ``stats/approx_kl_first`` and ``stats/policy_clipfrac_first`` are the first
    minibatch's own values (``FIRST_MINIBATCH_KEYS``): the policy has not moved yet there, so
    the ratio is exactly 1 and both must be 0 up to float rounding, the sanity check of the
    exercises (the means mix in later minibatches, where the policy has moved).

    With ``ppo.length_grouping``, the rows of each optimizer step are cut into minibatches by
    response length (``minibatches``) and each minibatch's gradient is weighted by its share of
    the step's real tokens (``token_share_weights``, ``scaled_gradients``).

    ``around(minibatch)``, when given, is a context manager around each minibatch's call (GRPO's
    ``grpo.policy_loss_swap``); the dict it yields is merged into that minibatch's metrics. PPO
    passes none.

    Data-parallel (``assignment.trainer.distributed``): ``batch`` is this process's rows,
    ``minibatch_size`` and ``grad_accum_steps`` how it cuts its share of each optimizer step
    (``process_minibatches``; exercise 5 reads that ``grad_accum_steps``), and ``agree`` averages
    a figure over the processes: the early stop reads the averaged approx_kl, so that all of them
    stop after the same minibatch (DDP needs every process in every backward). Gradients are
    reduced over the processes once per optimizer step, in the backward of the minibatch that
    steps (``gradient_sync``).
    """
    accum, bound = grad_accum_steps or cfg.ppo.grad_accum_steps, early_stop_bound(cfg.ppo)
    update_cfg = dataclasses.replace(UpdateConfig.from_config(cfg), grad_accum_steps=accum)
    size = minibatch_size or cfg.ppo.minibatch_size
    length_groups = size * accum if cfg.ppo.length_grouping else 0
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    policy.train()
    optimizer.zero_grad()
    mixed = policy if isinstance(policy, MixedPrecision) else None  # model.train_dtype's wrapper
    # under model.train_dtype the working copy's parameters are the ones autograd reaches
    autograd_model = policy if mixed is None else mixed.working
    ran, stopped, first = 0, False, {}
    for _ in range(cfg.ppo.epochs):
        epoch = minibatches(batch, size, generator, length_groups)
        if length_groups:  # the weights need every minibatch's tokens before the first backward
            epoch = list(epoch)
            weights = token_share_weights(epoch, accum)
        else:
            weights = itertools.repeat(None)
        for i, (minibatch, weight) in enumerate(zip(epoch, weights)):
            step_optimizer = (i + 1) % accum == 0
            with gradient_sync(policy, step_optimizer), scaled_gradients(autograd_model, weight):
                if around is None:
                    metrics = impl.ppo_minibatch_update(policy, optimizer, minibatch, update_cfg, step_optimizer)
                else:
                    with around(minibatch) as extra:
                        metrics = impl.ppo_minibatch_update(policy, optimizer, minibatch, update_cfg, step_optimizer)
                    metrics = {**metrics, **extra}
            if step_optimizer:
                scheduler.step()
                if mixed is not None:
                    mixed.end_cycle()
            for key, value in metrics.items():
                sums[key] += float(value)
                counts[key] += 1
            if ran == 0:
                first = {FIRST_MINIBATCH_KEYS[key]: float(metrics[key]) for key in FIRST_MINIBATCH_KEYS if key in metrics}
            ran += 1
            if progress is not None:
                progress.update(1)
            if bound is not None:
                approx_kl = float(metrics["stats/approx_kl"])
                stopped = (approx_kl if agree is None else agree(approx_kl)) > bound
            if stopped:
                break
        if stopped:
            break
    optimizer.zero_grad(set_to_none=True)  # an early stop's unfinished cycle is discarded here
    drop_local_gradients(policy)  # and under FSDP2 its unreduced gradients too
    if mixed is not None:
        mixed.discard_cycle()  # and what its gradient hooks noted of it
    means = {key: sums[key] / counts[key] for key in sums} | first
    means.update({"stats/lr": scheduler.get_last_lr()[0], "stats/minibatches": float(ran),
                  "stats/early_stop": float(stopped)})
    if mixed is not None:
        means.update(mixed.metrics())
    if stopped:
        means.update({"stats/early_stop_minibatch": float(ran - 1),
                      "stats/early_stop_approx_kl": float(metrics["stats/approx_kl"])})
    return means

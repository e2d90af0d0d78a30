"""16-bit training with float32 master weights (``model.train_dtype``).

The optimizer keeps the policy in float32 (the *masters*: at lr 2e-6 a 16-bit weight would round
most updates away), while a copy of it in bfloat16 or float16 (the *working copy*) runs every
forward and backward of a step: the rollout's scoring forwards and exercise 5's minibatches. Its
matmuls then run on the tensor cores' 16-bit rate: 8x the plain float32 rate on a T4 or V100,
twice the TF32 rate on Ampere, Ada and Hopper (Micikevicius et al. 2018, "Mixed Precision
Training"; Megatron-LM keeps its float32 ``main_grad`` the same way).

What exercise 5 sees is ``MixedPrecision``, a module whose forward runs the working copy and whose
``parameters()`` are the masters. So the student's code is unchanged:

- ``model(input_ids, attention_mask)`` runs in 16-bit and returns the logits (B, L, V) and values
  (B, L) in float32: the LM head computes in 16 bits and its output is widened (``logits_dtype``);
- ``loss.backward()`` computes 16-bit gradients of the working copy; as each one is complete, a
  hook adds it, in float32 and divided by the loss scale, to its master's ``.grad`` and frees it.
  Accumulation over minibatches happens in float32, never in 16-bit;
- ``clip_grad_norm_(model.parameters(), ...)`` clips the masters' float32 gradients, unscaled;
- ``optimizer.step()`` steps the masters; a hook of the optimizer then copies them into the
  working copy. ``optimizer.zero_grad()`` clears the masters' gradients.

float16 has 5 exponent bits: gradients below 6e-8 flush to zero. Dynamic loss scaling (the
``LossScaler``) multiplies the gradient that flows back from the model's outputs by S (2^16 at
first), so that the whole backward runs on scaled values; the hooks divide by S in float32. The
scaling has to happen before anything casts the gradient to float16, so under float16 the logits
are returned in float32 (the LM head computes them in float16; the cast back to float16 of their
gradient then carries the scale). Where the scaled gradients overflowed, the optimizer's pre-step
hook finds a non-finite gradient (a flag per parameter, set after each backward) and clears the
masters' gradients: the step changes nothing (AdamW skips a parameter without one) and S halves.
The test runs once a backward on the masters' float32 sums, not on each 16-bit gradient as it
arrives (18,752 tests of three kernels each in one update of the 16 GB profile, 1.8 s under
cProfile): an inf or NaN in a summand stays one in the sum, and finite summands cannot overflow
it (each 16-bit one is at most 65504 / S; the value head's float32 gradient is taken as it is).
bfloat16 has float32's exponent range: no scaling.

One process only: DDP and FSDP reduce the gradients of the parameters that run the backward, here
the working copy's, which the hooks free as they arrive (``Distributed.check`` refuses it).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from assignment.model import PolicyWithValueHead


class LossScaler:
    """The loss scale S of float16 training, with torch.amp.GradScaler's defaults: 2^16 at first,
    halved after an optimizer step whose gradients overflowed (the step is skipped), doubled after
    2000 clean ones in a row."""

    def __init__(self, scale: float = 2.0 ** 16, growth_interval: int = 2000):
        self.scale, self.growth_interval, self.clean = scale, growth_interval, 0

    def update(self, overflow: bool) -> None:
        """After an optimizer step (taken, or skipped because ``overflow``)."""
        if overflow:
            self.scale, self.clean = self.scale / 2, 0
            return
        self.clean += 1
        if self.clean == self.growth_interval:
            self.scale, self.clean = self.scale * 2, 0

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "clean": self.clean}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale, self.clean = state["scale"], int(state["clean"])


class _ScaleGradient(torch.autograd.Function):
    """The identity forward; backward, the gradient times ``scale``, and ``at_end`` queued to run
    once the whole backward is done (after every gradient hook: autograd's engine runs queued
    callbacks last, as DDP's reducer relies on)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float, at_end: Any) -> torch.Tensor:
        ctx.scale, ctx.at_end = scale, at_end
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.at_end()
        return grad * ctx.scale, None, None


def cudnn_attention_safe(model_dtype: str, train_dtype: str | None) -> bool:
    """Whether the policy's backward may use cuDNN's attention kernel: only where it runs in float32.

    cuDNN's fused attention, PyTorch's first choice for 16-bit SDPA on Hopper, returns NaN query
    gradients when a mask is passed, the length is 64 mod 128 and some query row's logsumexp is
    below about -88.7 (pytorch/pytorch#196678; TRL bisected its Qwen2.5-0.5B NaNs to it, trl#7181).
    Qwen2.5's attention sinks give such rows in every batch, so 1 minibatch in 128 (by its length)
    poisons its optimizer step: 13 of 116 steps of the float16 16 GB run skipped, 2 of 192 of the
    bfloat16 24 GB one. Reproduced with Qwen's attention shape on an H200 (torch 2.11: NaN at 704
    and 832 columns, in float16 and bfloat16 alike; none from the memory-efficient kernel,
    PyTorch's next choice, which needs no more memory). float32 never runs cuDNN's attention."""
    return model_dtype == "float32" and train_dtype is None


def working_copy(policy: PolicyWithValueHead, dtype: torch.dtype) -> PolicyWithValueHead:
    """A trainable copy of ``policy`` with its LM's parameters in ``dtype``, each cast as it is
    copied (the float32 copy never exists whole). The value head stays float32 (its own copy), and
    so do the buffers: RoPE's inv_freq in 16-bit would shift the rotary phase (``rollout.generation_copy``)."""
    memo = {id(param): nn.Parameter(param.detach().to(dtype, copy=True)) for param in policy.lm.parameters()}
    return copy.deepcopy(policy, memo)


class MixedPrecision(nn.Module):
    """The policy as exercise 5 trains it under ``model.train_dtype`` (module docstring): forward
    runs ``self.working``, the 16-bit copy; ``parameters()`` are ``self.policy``'s, the float32
    masters (checkpoints save ``self.policy`` itself). ``attach(optimizer)`` before the first step;
    ``end_cycle()`` after each exercise-5 call that was to step the optimizer, ``discard_cycle()``
    where an update stops inside a cycle."""

    def __init__(self, policy: PolicyWithValueHead, dtype: torch.dtype):
        super().__init__()
        self.policy = policy
        # Not a submodule: parameters(), state_dict() and the optimizer see the masters alone.
        self.__dict__["working"] = working_copy(policy, dtype)
        self.scaler = LossScaler() if dtype == torch.float16 else None
        # Float32 logits from the 16-bit head, for the update and the scoring forwards alike: the
        # helpers compute in float32, and given 16-bit logits each of them (the log-probs', the
        # entropy's) would keep a float32 copy of its own for the backward (measured: bfloat16
        # logits ran the 24 GB and 16 GB profiles out of their caps at the first update, float32
        # ones fit). And under float16 the scaled gradient must meet the logits before anything
        # casts it to float16.
        self.working.logits_dtype = torch.float32
        self.pairs = list(zip(self.working.parameters(), policy.parameters(), strict=True))
        for work, master in self.pairs:
            work.register_post_accumulate_grad_hook(self._to_master(master))
        # Under float16, per parameter: were all its gradients of this optimizer step finite? Kept
        # on the device (read once a step), and read where the step skips, by the optimizer's
        # hook or by exercise 5's own finite-norm check, which never calls the optimizer.
        self.finite = None if self.scaler is None else torch.ones(len(self.pairs), dtype=torch.bool,
                                                                  device=self.pairs[0][1].device)
        self.check_queued = False  # the finite test of the backward under way is queued
        self.names = [name for name, _ in policy.named_parameters()]  # parameters() order, as pairs
        self.stepped = self.overflow = False
        self.skipped_steps = 0  # optimizer steps skipped for overflow since the last metrics()
        self.non_finite: list[str] = []  # the parameters whose gradient was not, at the last skip

    def train(self, mode: bool = True) -> "MixedPrecision":
        """Train (or eval) mode for the working copy too: gradient checkpointing runs in train mode only."""
        self.working.train(mode)
        return super().train(mode)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                logits_to_keep: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``PolicyWithValueHead.forward`` of the working copy: logits (B, L, V), values (B, L)."""
        logits, values = self.working(input_ids, attention_mask, logits_to_keep)
        if self.scaler is None:
            return logits, values
        # A backward that raised after queueing its test never ran it: a new forward starts a new
        # graph, whose backward must queue its own.
        self.check_queued = False
        scale = self.scaler.scale
        return (_ScaleGradient.apply(logits, scale, self._queue_check),
                _ScaleGradient.apply(values, scale, self._queue_check))

    def _queue_check(self) -> None:
        """From the backward of the scaled outputs: test the masters' gradients once it is done."""
        if not self.check_queued:
            self.check_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._check_finite)

    @torch.no_grad()
    def _check_finite(self) -> None:
        """After a backward under float16: note, per parameter, whether its master gradient (the
        float32 sum so far of this optimizer step) is finite. One fused norm over all of them; a
        norm is finite exactly when its tensor is, short of a sum of squares above 3.4e38: k
        summands of at most 65504 / S each over n elements reach it only where
        n (65504 k / S)^2 > 3.4e38, for the embeddings (n = 1.4e8) and 16 summands a step S
        below about 2^-30, 46 halvings from 2^16 without a clean step between. Past that the test
        errs only one way: a finite step skipped, never a non-finite one taken."""
        self.check_queued = False
        zero = self.finite.new_zeros((), dtype=torch.float32)  # a parameter the loss did not reach
        norms = torch._foreach_norm([zero if master.grad is None else master.grad for _, master in self.pairs])
        self.finite.logical_and_(torch.stack(norms).isfinite())

    def _to_master(self, master: nn.Parameter) -> Any:
        def hook(work: torch.Tensor) -> None:
            inverse = 1.0 if self.scaler is None else 1.0 / self.scaler.scale
            if master.grad is None:
                # a float32 gradient (the value head's) is taken over as it is, not copied
                master.grad = work.grad.to(torch.float32)
                if inverse != 1.0:
                    master.grad.mul_(inverse)
            else:
                master.grad.add_(work.grad, alpha=inverse)
            work.grad = None
        return hook

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook the optimizer of the masters: skip a step whose gradients overflowed, and copy the
        masters into the working copy after every step taken."""
        optimizer.register_step_pre_hook(self._before_step)
        optimizer.register_step_post_hook(self._after_step)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.stepped = True
        if self.finite is not None and not bool(self.finite.all()):
            self.overflow = True
            for _, master in self.pairs:
                master.grad = None

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.overflow:
            self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the masters into the working copy (after a step, or a checkpoint's load)."""
        for work, master in self.pairs:
            work.copy_(master)

    def end_cycle(self) -> None:
        """After an exercise-5 call that was to step the optimizer. Exercise 5 skips the step itself
        when the gradient norm is not finite (the contract), so a call that did not step overflowed
        too."""
        overflow = self.overflow or not self.stepped
        self.skipped_steps += overflow
        if self.scaler is not None:
            self.scaler.update(overflow)
        if overflow and self.finite is not None:
            self.non_finite = [name for name, ok in zip(self.names, self.finite.tolist()) if not ok]
        self.discard_cycle()  # the next cycle starts clean

    def discard_cycle(self) -> None:
        """Where an update stops inside an accumulation cycle (ppo.target_kl) and its gradients are
        thrown away: forget what the cycle's finite tests noted, so that the next one starts clean."""
        if self.finite is not None:
            self.finite.fill_(True)
        self.stepped = self.overflow = False

    def metrics(self) -> dict[str, float]:
        """``stats/skipped_steps`` since the last call and, under float16, ``stats/loss_scale``."""
        out = {"stats/skipped_steps": float(self.skipped_steps)}
        if self.scaler is not None:
            out["stats/loss_scale"] = self.scaler.scale
        self.skipped_steps = 0
        return out

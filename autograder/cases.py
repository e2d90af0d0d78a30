"""Hypothesis strategies for the inputs of the five exercises.

A ``Case`` is what one example sends to the worker: named tensors and scalars. Shapes,
padding, dtypes, scalars and small tensors are drawn element by element, so Hypothesis
shrinks a failure to a few tokens with simple values. Large tensors (logits, exercise 5's
batches) come from a drawn torch seed and scale, which Hypothesis shrinks instead.

Inputs are shaped to keep correct alternative implementations equal to the reference:
probability ratios stay 1e-3 away from the clip boundaries, and value-loss inputs sit on a
grid of sixteenths, where the clipping arithmetic is exact, so that strict ``>`` decisions
never hinge on rounding. Padded positions hold finite junk, different from real values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import hypothesis.extra.numpy as hnp
import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

DTYPES = (torch.float32, torch.float64)
MASK_KINDS = ("bool", "float", "long")


@dataclass
class Case:
    """One example: tensor arguments, scalar arguments, and the response mask they share."""

    tensors: dict[str, torch.Tensor]
    scalars: dict[str, float] = field(default_factory=dict)

    @property
    def mask(self) -> torch.Tensor:
        return self.tensors["response_mask"].bool()

    def describe(self) -> str:
        """A readable counterexample: scalars, shapes, then each small tensor."""
        lines = [f"{k} = {v!r}" for k, v in self.scalars.items()]
        for name, t in self.tensors.items():
            head = f"{name}: shape {tuple(t.shape)}, {str(t.dtype).removeprefix('torch.')}"
            if t.numel() <= 64:
                lines.append(f"{head}\n    {_fmt(t)}")
            else:
                lines.append(head)
        return "\n".join(lines)


def _fmt(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return str(t.int().tolist())
    if not t.dtype.is_floating_point:
        return str(t.tolist())
    return str([[round(x, 4) for x in row] for row in t.double().reshape(t.shape[0], -1).tolist()]
               if t.dim() > 1 else [round(x, 4) for x in t.double().tolist()])


def _array(draw, shape, lo, hi):
    """A float64 array of finite values in [lo, hi], drawn element by element."""
    return torch.from_numpy(draw(hnp.arrays(np.float64, shape, elements=st.floats(lo, hi))))


@st.composite
def padding(draw, max_b: int = 6, max_t: int = 12):
    """(B, T) right-padded bool mask with at least two real tokens; empty rows allowed."""
    B = draw(st.integers(1, max_b))
    T = draw(st.integers(1, max_t))
    lengths = draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    assume(sum(lengths) >= 2)
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


def _mask_as(draw, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The contract allows 1/True masks: send bool, float or integer ones."""
    kind = draw(st.sampled_from(MASK_KINDS))
    return {"bool": mask, "float": mask.to(dtype), "long": mask.long()}[kind]


def _junk(draw, x: torch.Tensor, mask: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """``x`` with its padded positions overwritten by one finite junk value."""
    value = draw(st.floats(lo, hi))
    return torch.where(mask, x, torch.full_like(x, value))


def _away_from(x: torch.Tensor, points: list[float], margin: float) -> torch.Tensor:
    """Move entries of ``x`` within ``margin`` of any of ``points`` to ``margin`` away."""
    for p in points:
        near = (x - p).abs() < margin
        x = torch.where(near, torch.where(x >= p, p + margin, p - margin), x)
    return x


# ---- exercise 1 ---------------------------------------------------------------------------

@st.composite
def policy_case(draw, unit_ratio: bool = False) -> Case:
    mask = draw(padding())
    B, T = mask.shape
    dtype = draw(st.sampled_from(DTYPES))
    eps = draw(st.floats(0.05, 0.5))
    old = _array(draw, (B, T), -8.0, 0.0)
    if unit_ratio:
        ratio = torch.ones(B, T, dtype=torch.float64)
    else:
        ratio = torch.exp(_array(draw, (B, T), -1.5, 1.5))
        ratio = _away_from(ratio, [1 - eps, 1 + eps], 2e-3)
    new = (old + torch.log(ratio)).to(dtype)
    old = old.to(dtype)
    if unit_ratio:
        new = old.clone()
    adv = _array(draw, (B, T), -5.0, 5.0).to(dtype)
    return Case(
        tensors={
            "logprobs_new": _junk(draw, new, mask, -20.0, 5.0),
            "logprobs_old": _junk(draw, old, mask, -20.0, 5.0),
            "advantages": _junk(draw, adv, mask, -100.0, 100.0),
            "response_mask": _mask_as(draw, mask, dtype),
        },
        scalars={"clip_ratio": eps},
    )


# ---- exercise 2 ---------------------------------------------------------------------------

def _sixteenths(draw, shape, lo: int, hi: int) -> torch.Tensor:
    return torch.from_numpy(draw(hnp.arrays(np.int64, shape, elements=st.integers(lo, hi)))).double() / 16


@st.composite
def value_case(draw) -> Case:
    mask = draw(padding())
    B, T = mask.shape
    dtype = draw(st.sampled_from(DTYPES))
    clip = draw(st.floats(0.05, 1.0))
    # keep the clip range off the grid so that |values_new - values_old| never ties with it
    clip = float(_away_from(torch.tensor([clip]), [k / 16 for k in range(1, 17)], 4e-3)[0])
    old = _sixteenths(draw, (B, T), -64, 64)
    new = old + _sixteenths(draw, (B, T), -24, 24)
    returns = _sixteenths(draw, (B, T), -64, 64)
    return Case(
        tensors={
            "values_new": _junk(draw, new.to(dtype), mask, -100.0, 100.0),
            "values_old": _junk(draw, old.to(dtype), mask, -100.0, 100.0),
            "returns": _junk(draw, returns.to(dtype), mask, -100.0, 100.0),
            "response_mask": _mask_as(draw, mask, dtype),
        },
        scalars={"clip_range_value": clip},
    )


# ---- exercise 3 ---------------------------------------------------------------------------

@st.composite
def entropy_case(draw, scales=(0.0, 1.0, 3.0, 10.0), offsets=(0.0,), vocab=(2, 40), max_b=4, max_t=6,
                 dtypes=DTYPES + (torch.bfloat16,)) -> Case:
    """Logits (B, T, V); bfloat16 ones too, since the contract reduces them in float32."""
    mask = draw(padding(max_b=max_b, max_t=max_t))
    B, T = mask.shape
    dtype = draw(st.sampled_from(dtypes))
    V = draw(st.integers(*vocab)) if isinstance(vocab, tuple) else vocab
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.sampled_from(scales))
    offset = draw(st.sampled_from(offsets))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale + offset
    # a few tokens get one dominant logit: near-deterministic distributions
    peaked = torch.rand(B, T, generator=g) < draw(st.sampled_from([0.0, 0.3]))
    logits[peaked, 0] += 5 * max(scale, 1.0)
    junk = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 50
    logits = torch.where(mask[..., None], logits, junk).to(dtype)
    return Case(tensors={"logits": logits, "response_mask": _mask_as(draw, mask, dtype)},
                scalars={"seed": seed, "scale": scale, "offset": offset})


# ---- exercise 4 ---------------------------------------------------------------------------

@st.composite
def gae_case(draw, lam_zero: bool = False, reward_to_go: bool = False) -> Case:
    mask = draw(padding(max_t=16))
    B, T = mask.shape
    dtype = draw(st.sampled_from(DTYPES))
    gamma = 1.0 if reward_to_go else draw(st.floats(0.0, 1.0))
    lam = 0.0 if lam_zero else 1.0 if reward_to_go else draw(st.floats(0.0, 1.0))
    rewards = _array(draw, (B,), -2.0, 2.0).to(dtype)
    kl = _array(draw, (B, T), -0.5, 0.5).to(dtype)
    values = torch.zeros(B, T, dtype=dtype) if reward_to_go else _array(draw, (B, T), -3.0, 3.0).to(dtype)
    return Case(
        tensors={
            "final_rewards": rewards,
            "kl_penalties": _junk(draw, kl, mask, -100.0, 100.0),
            "values": values if reward_to_go else _junk(draw, values, mask, -100.0, 100.0),
            "response_mask": _mask_as(draw, mask, dtype),
        },
        scalars={"gamma": gamma, "lam": lam},
    )


# ---- exercise 5 ---------------------------------------------------------------------------

@dataclass
class UpdateCase:
    """Exercise 5: a model state, minibatches, the calls to make, and the update config."""

    minibatches: list[dict[str, torch.Tensor]]
    prompt_lengths: list[int]
    calls: list[dict]  # {"minibatch": i, "step_optimizer": bool, "record_grads": bool}
    cfg: dict[str, float]
    seed: int

    def describe(self) -> str:
        mb = self.minibatches[0]
        lines = [f"cfg = {self.cfg}", f"data seed = {self.seed}",
                 "calls (minibatch, step_optimizer) = "
                 f"{[(c['minibatch'], c['step_optimizer']) for c in self.calls]}"]
        for i, (m, P) in enumerate(zip(self.minibatches, self.prompt_lengths)):
            lines.append(f"minibatch {i}: B={m['response_ids'].shape[0]}, P={P}, T={m['response_ids'].shape[1]}, "
                         f"attention_mask={m['attention_mask'].tolist()}")
        lines.append(f"minibatch 0 response_mask = {mb['response_mask'].tolist()}")
        return "\n".join(lines)


UPDATE_CFG = {
    "temperature": (1.0, 0.7, 1.3),
    "clip_ratio": (0.2, 0.1),
    "clip_range_value": (0.2, 0.5),
    "vf_coeff": (0.5, 0.1),
    "entropy_coeff": (0.01, 0.0, 0.05),
    "max_grad_norm": (1.0, 0.05, 100.0),
}


@st.composite
def update_case(draw, model, vocab_size: int, scenario: str = "single", dtype=torch.float64) -> UpdateCase:
    """Minibatches for ``model``; logprobs_old/values_old are the model's own, perturbed.

    scenario: "single" (one accumulating call, gradients recorded), "steps" (two accumulation
    cycles of two minibatches each), "unit_ratio" (one call, old = current policy exactly) or
    "nonfinite" (one stepping call whose advantages are infinite).
    """
    from assignment.helpers import logprobs_from_logits

    cfg = {k: draw(st.sampled_from(v)) for k, v in UPDATE_CFG.items()}
    cfg["grad_accum_steps"] = 2 if scenario == "steps" else draw(st.sampled_from([1, 2, 4]))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    noise = 0.0 if scenario == "unit_ratio" else draw(st.sampled_from([0.0, 0.1, 0.5]))
    n_minibatches = 2 if scenario == "steps" else 1
    minibatches, prompt_lengths = [], []
    for _ in range(n_minibatches):
        mask = draw(padding(max_b=4, max_t=6))
        B, T = mask.shape
        prompt_lens = draw(st.lists(st.integers(1, 5), min_size=B, max_size=B))
        P = max(prompt_lens)
        prompt_mask = torch.arange(P)[None, :] >= (P - torch.tensor(prompt_lens))[:, None]  # left padding
        ids = torch.randint(0, vocab_size, (B, P + T), generator=g)
        attention_mask = torch.cat([prompt_mask, mask], dim=1).long()
        with torch.no_grad():
            logits, values = model(ids, attention_mask)
        logprobs = logprobs_from_logits(logits[:, P - 1 : P + T - 1] / cfg["temperature"], ids[:, P:])
        logprobs_old = logprobs + noise * torch.randn(B, T, generator=g, dtype=dtype)
        values_old = values[:, P - 1 : P + T - 1] + noise * torch.randn(B, T, generator=g, dtype=dtype)
        advantages = torch.randn(B, T, generator=g, dtype=dtype)
        if scenario == "nonfinite":
            advantages = torch.full_like(advantages, math.inf)
        minibatches.append({
            "input_ids": ids, "attention_mask": attention_mask, "response_ids": ids[:, P:].clone(),
            "response_mask": mask.long(), "logprobs_old": logprobs_old.to(dtype), "values_old": values_old.to(dtype),
            "advantages": advantages, "returns": torch.randn(B, T, generator=g, dtype=dtype),
        })
        prompt_lengths.append(P)
    if scenario == "steps":
        calls = [{"minibatch": i % 2, "step_optimizer": i % 2 == 1, "record_grads": False} for i in range(4)]
    else:
        calls = [{"minibatch": 0, "step_optimizer": scenario == "nonfinite", "record_grads": True}]
    return UpdateCase(minibatches, prompt_lengths, calls, cfg, seed)

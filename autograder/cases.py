"""What one Hypothesis example sends to a submission, and the building blocks of the strategies.

A ``Case`` holds named tensors and scalars. Shapes, padding, dtypes, scalars and small tensors
are drawn element by element, so Hypothesis shrinks a failure to a few tokens with simple
values; large tensors (logits) come from a drawn torch seed, which it shrinks instead. Padded
positions hold finite junk, different from the real values: it must change nothing.

Inputs are shaped so that every correct implementation agrees with the reference up to
rounding: step functions of the contract (the clip indicators) are kept away from their
thresholds by far more than float32 rounding could move them (see each exercise's module).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hypothesis.extra.numpy as hnp
import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

DTYPES = (torch.float32, torch.float64)
MASK_KINDS = ("bool", "float", "long")
MAX_PRINTED = 64  # elements: larger tensors are summarised, not printed


@dataclass
class Case:
    """One example: tensor arguments and scalar arguments of an exercise function.

    ``notes`` are facts about how the case was generated that help to read it (a seed, a
    scale); they are printed apart from the arguments. ``raises``: the exception the contract
    demands on these arguments (an unknown mode: "ValueError"), or "" when the function returns.
    """

    tensors: dict[str, torch.Tensor]
    scalars: dict[str, float] = field(default_factory=dict)
    notes: dict[str, object] = field(default_factory=dict)
    raises: str = ""

    @property
    def mask(self) -> torch.Tensor:
        return self.tensors["response_mask"].bool()

    @property
    def n_real(self) -> int:
        return int(self.mask.sum())

    def __repr__(self) -> str:  # Hypothesis prints failing examples: keep it short
        return "Case(" + ", ".join(f"{k}: {tuple(t.shape)}" for k, t in self.tensors.items()) + ")"

    def describe(self) -> str:
        """The arguments as a student would write them, tensors in their shapes; what padding
        holds is named as junk, so that a 52.4 beside logits of scale 0 reads as what it is."""
        mask = self.mask if "response_mask" in self.tensors else None
        lines = [f"{k} = {v!r}" for k, v in self.scalars.items()]
        lines += [describe_tensor(name, t, None if name == "response_mask" else mask)
                  for name, t in self.tensors.items()]
        if mask is not None and not bool(mask.all()):
            lines.append("(where response_mask is 0 the inputs hold padding junk: any finite value, which must "
                         "change no result)")
        if self.notes:
            lines.append("(real tokens generated with " + ", ".join(f"{k} = {v}" for k, v in self.notes.items()) + ")")
        return "\n".join(lines)

    @property
    def rows(self) -> int:
        """B, the number of responses."""
        return self.mask.shape[0]

    def without_row(self, b: int) -> "Case":
        """The same case without row ``b`` (a candidate for a smaller counterexample): every (B, ...)
        tensor loses it; the other rows stay as they are."""
        B = self.rows
        keep = torch.arange(B) != b
        tensors = {k: (t[keep] if t.dim() >= 1 and t.shape[0] == B else t) for k, t in self.tensors.items()}
        return Case(tensors, dict(self.scalars), dict(self.notes), self.raises)


def two_real_tokens(case: Case) -> bool:
    """The contract's one rule on every batch: at least two real tokens (``Check.fewer_rows``)."""
    return case.n_real >= 2


def with_empty_row(case: Case) -> bool:
    """At least two real tokens, and a row with none: what an edge_cases check of empty rows draws."""
    return two_real_tokens(case) and not bool(case.mask.any(1).all())


def describe_tensor(name: str, t: torch.Tensor, mask: torch.Tensor | None = None) -> str:
    """One argument: printed in full when small, else its shape and range (real tokens apart
    from padding junk when ``mask`` (B, T) gives the padding)."""
    head = f"{name}: shape {tuple(t.shape)}, {str(t.dtype).removeprefix('torch.')}"
    if t.numel() > MAX_PRINTED:
        if mask is not None and tuple(t.shape[:2]) == tuple(mask.shape) and t.dtype.is_floating_point:
            real, pad = _span(t[mask]), _span(t[~mask])
            return head + (f", real tokens in {real}" if real else "") + (f", padding junk in {pad}" if pad else "")
        span = _span(t)
        return head + (f", values in {span}" if span else "")
    return head + " =\n" + _indent(nested(t))


def _span(t: torch.Tensor) -> str:
    finite = t[torch.isfinite(t)] if t.dtype.is_floating_point else t
    return f"[{fmt(finite.min().item())}, {fmt(finite.max().item())}]" if finite.numel() else ""


def nested(t: torch.Tensor) -> str:
    """A tensor as nested lists, one row per line, in its own shape: [[1, 0], [0.5, 2]]."""
    if t.dim() == 0:
        return fmt(t.item())
    if t.dim() == 1:
        return "[" + ", ".join(fmt(x) for x in t.tolist()) + "]"
    return "[" + (",\n ".join(nested(row).replace("\n", "\n ") for row in t)) + "]"


def fmt(x) -> str:
    if isinstance(x, bool):
        return str(int(x))
    if isinstance(x, int):
        return str(x)
    return f"{x:.6g}"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


# ---- building blocks of the strategies ------------------------------------------------------

def array(draw, shape, lo: float, hi: float) -> torch.Tensor:
    """A float64 tensor of finite values in [lo, hi], drawn element by element."""
    return torch.from_numpy(draw(hnp.arrays(np.float64, shape, elements=st.floats(lo, hi))))


def grid(draw, shape, lo: int, hi: int, denominator: int) -> torch.Tensor:
    """A float64 tensor of multiples of 1 / denominator: exact in float32 too."""
    ints = draw(hnp.arrays(np.int64, shape, elements=st.integers(lo, hi)))
    return torch.from_numpy(ints).double() / denominator


@st.composite
def padding(draw, max_b: int = 6, max_t: int = 12, empty_rows: bool = True) -> torch.Tensor:
    """(B, T) right-padded bool mask with at least two real tokens; empty rows allowed, unless
    ``empty_rows`` is False (the trainer's responses hold at least one token: their EOS)."""
    B = draw(st.integers(1, max_b))
    T = draw(st.integers(1, max_t))
    lengths = draw(st.lists(st.integers(0 if empty_rows else 1, T), min_size=B, max_size=B))
    assume(sum(lengths) >= 2)
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


def mask_as(draw, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The contract allows 1/True masks: send bool, float or integer ones."""
    kind = draw(st.sampled_from(MASK_KINDS))
    return {"bool": mask, "float": mask.to(dtype), "long": mask.long()}[kind]


def junk(draw, x: torch.Tensor, mask: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """``x`` with its padded positions overwritten by one finite junk value."""
    value = draw(st.floats(lo, hi))
    return torch.where(mask, x, torch.full_like(x, value))


def away_from(x: torch.Tensor, points: list[float], margin: float) -> torch.Tensor:
    """Move entries of ``x`` within ``margin`` of any of ``points`` to ``margin`` away."""
    for p in points:
        near = (x - p).abs() < margin
        x = torch.where(near, torch.where(x >= p, p + margin, p - margin), x)
    return x

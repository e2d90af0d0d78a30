"""Validate what a submission returned and compare it with the reference, in the grader.

The worker's description of each returned object (type, dtype, shape, requires_grad) plus the
plain tensor that carried its values are all the grader ever sees of student code.

Tolerances are derived, not tuned. The contract lets a correct submission compute in float32
even for float64 inputs, sum in any order, and take log_softmax + gather or logsumexp; the
reference runs in float64 on the same inputs (exact to about 1e-16). A correct submission's
error is therefore a sum of float32 roundings, each at most ``U`` times the magnitude it
rounds. Each exercise module defines, per compared quantity, an *error scale* S (in the same
units as the quantity) that bounds that sum of magnitudes; a value passes when
``|got - expected| <= ulps * U * S`` elementwise, with ``ulps`` from grading.yaml. Every
function here returns a list of problems in words; an empty list means the check holds.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .cases import fmt

U = 2.0 ** -24  # float32 unit roundoff: half the gap between 1 and the next float32
# Below the smallest normal float32, 2^-126, float32 keeps only an absolute precision of 2^-149
# (gradual underflow), so relative bounds fail there: every bound also allows 2^-126 per ulp,
# more than 2^-149 for each of a million operations, and far below any real difference.
TINY = 2.0 ** -126
FLOAT_DTYPES = ("float32", "float64")
EXACT_BELOW = 2.0 ** -100  # bounds under this are the TINY allowance only (<= 2^-126 per ulp of grading.yaml)


class Output:
    """One returned object: the worker's description plus its tensor (if it was one)."""

    def __init__(self, desc: dict, tensor: torch.Tensor | None):
        self.desc, self.tensor = desc, tensor


def unpack(desc: dict, tensors: dict[str, torch.Tensor], name: str = "out") -> list[Output] | Output:
    """Rebuild the returned structure: a list of Outputs for a sequence, else one Output."""
    if desc.get("kind") == "sequence":
        return [unpack(d, tensors, f"{name}.{i}") for i, d in enumerate(desc["items"])]
    return Output(desc, tensors.get(name))


def validate(out: Output, label: str, shape: tuple[int, ...]) -> list[str]:
    """An exact torch.Tensor of a float32/float64 dtype and the expected shape."""
    d = out.desc
    if d.get("kind") != "tensor" or out.tensor is None:
        return [f"{label} is a {d.get('type', 'nothing')}, expected a torch.Tensor"]
    if not d.get("exact"):
        return [f"{label} is a subclass of torch.Tensor; return a plain torch.Tensor"]
    if d.get("dtype") not in FLOAT_DTYPES:
        return [f"{label} has dtype {d.get('dtype')}; the contract reduces in float32 or wider"]
    if tuple(d.get("shape", ())) != shape or tuple(out.tensor.shape) != shape:
        want = "()  (a scalar)" if shape == () else str(shape)
        return [f"{label} has shape {tuple(d.get('shape', ()))}, expected {want}"]
    return []


def bound(ulps: float, scale: torch.Tensor | float) -> torch.Tensor:
    """The allowed absolute error: ``ulps * (U * scale + TINY)`` (float64)."""
    return ulps * (U * torch.as_tensor(scale, dtype=torch.float64) + TINY)


def within(got: torch.Tensor, expected: torch.Tensor, tol: torch.Tensor) -> torch.Tensor:
    """Elementwise: |got - expected| <= tol, in float64; equal infinities and NaNs agree, and a
    non-finite value where the reference is finite never passes."""
    g, e = got.double(), expected.double()
    same = (g == e) | (torch.isnan(g) & torch.isnan(e))
    err = (g - e).abs()
    return same | (torch.isfinite(err) & (err <= tol.expand_as(err)))


def compare(label: str, got: torch.Tensor, expected: torch.Tensor, tol: torch.Tensor,
            position: Callable[[int], str] | None = None) -> list[str]:
    """One problem naming the worst element, or none. ``position(i)`` names flat index i
    (default: the tensor's own index)."""
    got, expected = got.double(), expected.double()
    tol = torch.as_tensor(tol, dtype=torch.float64).expand_as(expected)
    ok = within(got, expected, tol)
    if bool(ok.all()):
        return []
    position = position or (lambda i: _index(got, i))
    bad = ~ok
    if not torch.isfinite(got[bad]).all():  # non-finite values first: their cause differs
        first = int(bad.flatten().nonzero()[0])
        return [f"{label} is {fmt(got.flatten()[first].item())}{position(first)} where the reference is "
                f"{fmt(expected.flatten()[first].item())}"]
    excess = torch.where(bad, (got - expected).abs() - tol, torch.full_like(got, -math.inf))
    worst = int(excess.flatten().argmax())
    exp, value = expected.flatten()[worst].item(), got.flatten()[worst].item()
    allowed = tol.flatten()[worst].item()
    # A bound made of the underflow allowance alone (a few TINY) is below any difference float32
    # can show between numbers of ordinary size: for the reader, that value must be exact.
    allowed_words = "none: this value must be exact" if allowed < EXACT_BELOW else f"allowed {fmt(allowed)}"
    exp_text, value_text = apart(exp, value)
    return [f"{label}: expected {exp_text}, got {value_text}{position(worst)} "
            f"(error {fmt(abs(value - exp))}, {allowed_words})"]


def apart(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` with as many significant digits as it takes to tell them apart (6 at least,
    17 at most: float64's round trip), so that "expected 0.25, got 0.25" never happens."""
    for digits in range(6, 18):
        x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if x != y:
            return x, y
    return fmt(a), fmt(b)


def _index(t: torch.Tensor, flat: int) -> str:
    if t.dim() == 0:
        return ""
    return f" at index {[int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape)]}"


def compare_tokens(label: str, got: torch.Tensor, expected: torch.Tensor, tol: torch.Tensor,
                   mask: torch.Tensor) -> list[str]:
    """Compare (B, T, ...) tensors on real tokens only; name the worst element by (b, t, ...)."""
    tol = torch.as_tensor(tol, dtype=torch.float64).expand(expected.shape)
    tokens = mask.nonzero().tolist()
    inner = tuple(expected.shape[2:])
    width = math.prod(inner)

    def position(i: int) -> str:
        token, rest = divmod(i, width)
        index = tokens[token] + ([int(j) for j in torch.unravel_index(torch.tensor(rest), inner)] if inner else [])
        return f" at {'(b, t, v)' if inner else '(b, t)'} = {tuple(index)}"

    return compare(label, got[mask], expected[mask], tol[mask], position)

"""Validate what a submission returned and compare it with the reference, in the grader.

The worker's description of each returned object (type, dtype, shape, requires_grad) plus
the plain tensor that carried its values are all the grader ever sees of student code. Every
function here returns a list of problems in words; an empty list means the check holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FLOAT_DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


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
        what = d.get("type", "nothing")
        return [f"{label} is a {what}, expected a torch.Tensor"]
    if not d.get("exact"):
        return [f"{label} is a {d.get('type')} (a subclass of torch.Tensor); return a plain torch.Tensor"]
    if d.get("dtype") not in FLOAT_DTYPES:
        return [f"{label} has dtype {d.get('dtype')}; the contract reduces in float32 or wider"]
    if tuple(d.get("shape", ())) != shape or tuple(out.tensor.shape) != shape:
        want = "()  (a scalar)" if shape == () else str(shape)
        return [f"{label} has shape {tuple(d.get('shape', ()))}, expected {want}"]
    return []


def close(got: torch.Tensor, expected: torch.Tensor, tol: Tolerance, atol_scale: float = 1.0) -> tuple[bool, float, int]:
    """Elementwise |got - expected| <= atol * atol_scale + rtol * |expected|, in float64.

    Returns (all close, largest error, flat index of the largest violation or of the largest error).
    NaN or inf in ``got`` where ``expected`` is finite always fails.
    """
    g, e = got.double().flatten(), expected.double().flatten()
    if g.numel() == 0:
        return True, 0.0, 0
    err = (g - e).abs()
    both_inf = torch.isinf(g) & torch.isinf(e) & (torch.sign(g) == torch.sign(e))
    both_nan = torch.isnan(g) & torch.isnan(e)
    err = torch.where(both_inf | both_nan, torch.zeros_like(err), err)
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    bound = tol.atol * atol_scale + tol.rtol * e.abs().nan_to_num(posinf=0.0)
    bad = err > bound
    index = int(torch.argmax(torch.where(bad, err, torch.zeros_like(err))).item()) if bad.any() else int(err.argmax())
    return not bool(bad.any()), float(err.max().item()), index


def fmt(x: float) -> str:
    return f"{x:.6g}"


def compare_value(label: str, got: torch.Tensor, expected: torch.Tensor, tol: Tolerance,
                  mask: torch.Tensor | None = None, atol_scale: float = 1.0) -> list[str]:
    """Compare on real tokens only (``mask``), or the whole tensor; explain the largest error."""
    if mask is not None:
        got, expected = got[mask], expected[mask]
        positions = mask.nonzero().tolist()
    ok, largest, i = close(got, expected, tol, atol_scale)
    if ok:
        return []
    if got.numel() == 1:
        return [f"{label}: expected {fmt(expected.item())}, got {fmt(got.item())} (error {fmt(largest)})"]
    where = f" at (b, t) = {tuple(positions[i])}" if mask is not None else f" at flat index {i}"
    return [f"{label}: largest error {fmt(largest)}{where}: expected {fmt(expected.flatten()[i].item())}, "
            f"got {fmt(got.flatten()[i].item())}"]

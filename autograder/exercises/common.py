"""Comparisons and hints shared by exercises 1-4 (one function call per case).

Each of those modules defines ``scales(case, reference) -> {quantity: S}``, the error scale of
every output and of the gradient ("grad"), and ``patterns(case) -> [(output, wrong value,
message)]``, the outputs that known mistakes would produce on the case. Both are computed in
float64 from the case's inputs.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..calls import Called
from ..compare import bound, compare, compare_tokens, within

Scales = Callable[..., dict[str, torch.Tensor]]


def outputs(scales: Scales, *names: str) -> Callable[..., list[str]]:
    """Compare the named outputs with the reference, on real tokens for (B, T) outputs."""
    def check(case, ref: Called, sub: Called, ulps: float) -> list[str]:
        s = scales(case, ref)
        problems = []
        for name in names:
            tol = bound(ulps, s[name])
            if ref.outputs[name].dim() == 2:
                problems += compare_tokens(name, sub.outputs[name], ref.outputs[name], tol, case.mask)
            else:
                problems += compare(name, sub.outputs[name], ref.outputs[name], tol)
        return problems
    return check


def no_gradient(*names: str) -> Callable[..., list[str]]:
    """The named outputs carry no gradient (the contract's metrics, GAE's outputs)."""
    def check(case, ref: Called, sub: Called, ulps: float) -> list[str]:
        return [f"{n} carries a gradient; the contract says it carries none (compute it under torch.no_grad() "
                f"or .detach() it)" for n in names if sub.requires_grad[n]]
    return check


def gradient(scales: Scales, param: str) -> Callable[..., list[str]]:
    """d outputs[0] / d ``param``: equal to the reference's on real tokens, exactly 0 on padding."""
    def check(case, ref: Called, sub: Called, ulps: float) -> list[str]:
        if sub.grad is None:
            return [f"the loss carries no gradient to {param}; it must (do not detach, call .item() or "
                    f"wrap the computation in torch.no_grad())"]
        g, mask = sub.grad.double(), case.mask
        if g.shape != ref.grad.shape:
            return [f"the gradient w.r.t. {param} has shape {tuple(g.shape)}, expected {tuple(ref.grad.shape)}"]
        padded = g[~mask]
        if not torch.isfinite(padded).all():
            return [f"d loss / d {param} is NaN or inf at padded positions: something non-finite meets the mask "
                    f"(log(0) = -inf times 0 gives NaN; inf - inf too). Select the padding away with torch.where, "
                    f"or compute stably"]
        tol = bound(ulps, scales(case, ref)["grad"])
        problems = compare_tokens(f"d loss / d {param}", g, ref.grad, tol, mask)
        if (padded != 0).any():
            problems.append(f"d loss / d {param} is non-zero at padded positions: padding leaks into the loss")
        return problems
    return check


def suggest(patterns, scales: Scales, case, sub: Called | None, ref: Called | None, ulps: float,
            unambiguous: bool = False) -> str | None:
    """A hint when the submission's outputs match a known mistake that, on this case, gives
    something other than the reference. Hints never change a score.

    With ``unambiguous`` (Part II's exercises), no hint at all when two mistakes with different
    hints both match: on a small shrunk case they can give the same number, and the first one's
    hint would then name a mistake the student may not have made."""
    if sub is None or ref is None:
        return None
    if unambiguous:
        matched = {m for m in _matching(patterns, scales, case, sub, ref, ulps)}
        return matched.pop() if len(matched) == 1 else None
    return next(_matching(patterns, scales, case, sub, ref, ulps), None)


def _matching(patterns, scales: Scales, case, sub: Called, ref: Called, ulps: float):
    """The messages of the patterns that ``sub`` matches on ``case`` (and the reference does not), in order."""
    s, mask = scales(case, ref), case.mask
    for name, wrong, message in patterns(case):
        got, right = sub.outputs.get(name), ref.outputs.get(name)
        if got is None:
            continue
        tol = bound(ulps, s[name]).expand_as(right.double())
        if right.dim() == 2:
            got, wrong, right, tol = got[mask], wrong[mask], right[mask], tol[mask]
        if bool(within(got, wrong, tol).all()) and not bool(within(right, wrong, tol).all()):
            yield message

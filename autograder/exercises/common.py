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
        nonfinite = ~torch.isfinite(g)
        if nonfinite.dim() > 2:  # (B, T, V): a token's gradient is non-finite if any of it is
            nonfinite = nonfinite.flatten(2).any(-1)
        if bool((nonfinite & ~mask).any()):
            return [nonfinite_at_padding(f"d loss / d {param}", nonfinite & ~mask)]
        tol = bound(ulps, scales(case, ref)["grad"])
        problems = compare_tokens(f"d loss / d {param}", g, ref.grad, tol, mask)
        if (g[~mask] != 0).any():
            problems.append(f"d loss / d {param} is non-zero at padded positions: padding leaks into the loss")
        return problems
    return check


def nonfinite_at_padding(label: str, bad: torch.Tensor) -> str:
    """The symptom where ``bad`` (B, T) marks padded positions with a NaN or inf gradient (each
    exercise's hint names a cause it recognises). Selecting a non-finite value away after computing
    it (torch.where, a mask, indexing) does not stop its gradient: the selection sends back 0, which
    the operation's own derivative, inf there, turns into 0 * inf = NaN."""
    where = [tuple(int(i) for i in index) for index in bad.nonzero()[:3]]
    return (f"{label} is NaN or inf at padded positions (b, t) = {', '.join(map(str, where))}"
            f"{' ...' if int(bad.sum()) > 3 else ''}: something computed there is not finite (exp overflows above 88.7 "
            f"in float32, log(0) = -inf, a division by 0), and selecting it away afterwards (torch.where, a mask, "
            f"indexing) still sends 0 * inf = NaN back through it: select before that operation")


# (x * mask).mean(): padding zeroed, then divided by all B * T positions (exercises 1-3)
ALL_POSITIONS = ("you zero the padding but divide by every position, B * T: the token-mean divides by the number of "
                 "real tokens (masked_mean(x, response_mask))")


# A mistake fits a case when the submission is this many times closer to what the mistake gives
# than to the reference. The grading bound cannot serve here: it is derived from the reference's
# terms (the real tokens), while a mistake may round terms of its own (an unmasked mean sums
# padding junk of |A| e^5 ~ 1.5e4): float32 rounding of any of them is ~1e-7 relative, while a
# mistake that is not the student's misses by a real amount, so 2^10 separates the two by orders
# of magnitude on either side. Hints never change a score.
FIT_RATIO = 2.0 ** -10


def suggest(patterns, scales: Scales, evidence: list, ulps: float) -> str | None:
    """A hint when exactly one known mistake explains every failing case of the check, the one
    shown included.

    ``evidence`` holds (case, submitted, reference) for each failing case Hypothesis met, the
    first (large, random) one and the shrunk ones alike, and last the counterexample the feedback
    shows. On a case where a mistake gives the reference's value (within the grading bound) the
    case says nothing about it; on every other case, the submission must fit it (within the bound,
    or FIT_RATIO times closer to it than to the reference). A mistake's message is the hint only if
    it fits every case that speaks about it and accounts there for every output that is wrong (an
    inverted ratio gets approx_kl's sign wrong, and clip_frac besides: approx_kl's sign alone does
    not explain it), the case shown speaks about it (a hint rests on what the student sees), and no
    other message does the same: on a small shrunk case several mistakes often give the same
    number (clipping the returns and taking the minimum both leave the unclipped error), and naming
    one of them there would name a mistake the student may not have made."""
    fits: dict[str, bool] = {}
    shown: dict[str, bool] = {}  # whether the last case, the one shown, speaks about each mistake
    for case, sub, ref in evidence:
        shown = {}
        if sub is None or ref is None:
            continue
        s, mask = scales(case, ref), case.mask
        differ = set()  # the outputs of this case that differ from the reference's
        for name, right in ref.outputs.items():
            close = within(sub.outputs[name], right, bound(ulps, s[name]).expand_as(right.double()))
            if not bool((close[mask] if right.dim() == 2 else close).all()):
                differ.add(name)
        # message -> output -> fits: any of the mistake's forms of that output fits, and it must fit
        # every output it changes (whitening two numbers gives +-0.707 whatever they were: on such a
        # case an advantages pattern fits what the returns tell apart)
        here: dict[str, dict[str, bool]] = {}
        for name, wrong, message in patterns(case):
            got, right = sub.outputs.get(name), ref.outputs.get(name)
            here.setdefault(message, {})
            if got is None:
                continue
            tol = bound(ulps, s[name]).expand_as(right.double())
            got, wrong, right = got.double(), wrong.double(), right.double()
            if right.dim() == 2:
                got, wrong, right, tol = got[mask], wrong[mask], right[mask], tol[mask]
            if bool(within(right, wrong, tol).all()):
                continue  # the mistake changes nothing here
            fit = bool(within(got, wrong, tol).all()) or \
                bool(((got - wrong).abs().max() <= FIT_RATIO * (got - right).abs().max()))
            here[message][name] = here[message].get(name, False) or fit
        for message, outputs in here.items():
            fits.setdefault(message, True)
            shown[message] = bool(outputs)
            if outputs:  # the case speaks about this mistake: it must fit, and account for every wrong output
                fits[message] &= all(outputs.values()) and differ <= set(outputs)
    found = [m for m in fits if fits[m] and shown.get(m, False)]
    return found[0] if len(found) == 1 else None

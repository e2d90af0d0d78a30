"""Exercise 2, compute_value_loss: inputs, error scales, checks and hints.

Error scales (see compare.py), over the n real tokens, with w_t = |new_t| + |old_t| + |R_t| + c
(every difference the loss forms is at most w_t in magnitude):
    loss        (n + 8) mean(w_t^2) / 2     each squared error takes <= 8 roundings of
                                            magnitude <= w_t^2 (the casts, the clamp, the
                                            differences, the square); the sum < n more
    clip_frac   1                           an integer count over n: one rounding
    gradient    4 w_t / n                   per real token; exactly 0 on padding
Inputs sit on a grid of sixteenths, exact in float32, and the clip range stays off that grid:
(v_clip - R)^2 and (new - R)^2 then never tie, so every correct implementation makes the same
strict-> decision for clip_frac.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from assignment.contract import exercise
from assignment.helpers import masked_mean

from ..cases import DTYPES, Case, away_from, grid, junk, mask_as, padding
from . import Check, all_of, common, fixed

EXERCISE = exercise(2)


@st.composite
def value_case(draw) -> Case:
    mask = draw(padding())
    B, T = mask.shape
    dtype = draw(st.sampled_from(DTYPES))
    clip = draw(st.floats(0.05, 1.0))
    # off the grid, so that |values_new - values_old| never ties with it
    clip = float(away_from(torch.tensor([clip]), [k / 16 for k in range(1, 17)], 4e-3)[0])
    old = grid(draw, (B, T), -64, 64, 16)
    new = old + grid(draw, (B, T), -24, 24, 16)
    returns = grid(draw, (B, T), -64, 64, 16)
    return Case(
        tensors={
            "values_new": junk(draw, new.to(dtype), mask, -100.0, 100.0),
            "values_old": junk(draw, old.to(dtype), mask, -100.0, 100.0),
            "returns": junk(draw, returns.to(dtype), mask, -100.0, 100.0),
            "response_mask": mask_as(draw, mask, dtype),
        },
        scalars={"clip_range_value": clip},
    )


def scales(case: Case, ref=None) -> dict[str, torch.Tensor]:
    mask, n = case.mask, case.n_real
    new, old, ret = (case.tensors[k].double() for k in ("values_new", "values_old", "returns"))
    w = new.abs() + old.abs() + ret.abs() + case.scalars["clip_range_value"]
    return {"loss": (n + 8) * (w[mask] ** 2).mean() / 2, "clip_frac": torch.tensor(1.0, dtype=torch.float64),
            "grad": torch.where(mask, 4 * w / n, 0.0)}


def patterns(case: Case) -> list[tuple[str, torch.Tensor, str]]:
    mask = case.mask
    new, old, ret = (case.tensors[k].double() for k in ("values_new", "values_old", "returns"))
    c = case.scalars["clip_range_value"]
    v_clip = old + (new - old).clamp(-c, c)
    e_un, e_cl = (new - ret) ** 2, (v_clip - ret) ** 2
    m = mask.double()
    per_token = torch.maximum(e_un, e_cl)
    row_means = (torch.where(mask, per_token, 0.0).sum(1) / m.sum(1))[m.sum(1) > 0].mean()
    # Each mistake lists every output it changes (common.suggest): another clipped error is clip_frac's too.
    e_returns, e_absolute = (new - (old + (ret - old).clamp(-c, c))) ** 2, (new.clamp(-c, c) - ret) ** 2
    returns_clipped = ("you clip the returns around values_old; clip the value instead: "
                       "v_clip = values_old + clamp(values_new - values_old, -c, c), compared with the returns")
    absolute = ("you clip values_new itself to [-c, c]; clip its change around values_old: "
                "v_clip = values_old + clamp(values_new - values_old, -c, c)")
    return [
        ("loss", masked_mean(per_token, mask), "the value loss has a factor 0.5 in front of the token-mean"),
        ("loss", 0.5 * masked_mean(torch.minimum(e_un, e_cl), mask), "you take the minimum of the two squared errors; "
                                                                     "take the maximum"),
        ("loss", 0.5 * masked_mean(e_un, mask), "your value loss ignores the clipped term"),
        ("loss", 0.5 * per_token.mean(), "the mean includes padded positions: use masked_mean"),
        ("loss", 0.5 * torch.where(mask, per_token, 0.0).mean(), common.ALL_POSITIONS),
        ("loss", 0.5 * row_means, "you average per-row means; the token-mean divides the sum over all real tokens by their number"),
        ("loss", 0.5 * masked_mean(torch.maximum(e_un, e_returns), mask), returns_clipped),
        ("clip_frac", masked_mean((e_returns > e_un).double(), mask), returns_clipped),
        ("loss", 0.5 * masked_mean(torch.maximum(e_un, e_absolute), mask), absolute),
        ("clip_frac", masked_mean((e_absolute > e_un).double(), mask), absolute),
        ("clip_frac", masked_mean((e_cl >= e_un).double(), mask), "use a strict > in clip_frac"),
        ("clip_frac", masked_mean((e_un > e_cl).double(), mask), "clip_frac counts tokens where the clipped squared "
                                                                 "error is the larger one; yours counts those where "
                                                                 "the unclipped one is"),
        ("clip_frac", masked_mean(((new - old).abs() > c).double(), mask),
         "clip_frac counts tokens where the clipped squared error is the larger one, not every clipped change"),
    ]


def hint(evidence, ulps) -> str | None:
    """The hint for a failed check; ``evidence`` is [(case, submitted, reference)], the case shown
    last (common.suggest)."""
    return common.suggest(patterns, scales, evidence, ulps)


_loss = common.outputs(scales, "loss")
_clip_frac = all_of(common.outputs(scales, "clip_frac"), common.no_gradient("clip_frac"))
_gradient = common.gradient(scales, "values_new")

CHECKS = (
    Check("loss", "the loss equals the reference (0.5 * token-mean of the larger squared error)",
          fixed(value_case()), _loss),
    Check("clip_frac", "clip_frac (strict >) equals the reference and carries no gradient", fixed(value_case()), _clip_frac),
    Check("gradient", "the gradient of the loss w.r.t. values_new equals the reference's", fixed(value_case()), _gradient),
    Check("hidden_loss", "the loss on the hidden inputs", fixed(value_case()), _loss),
    Check("hidden_clip_frac", "clip_frac on the hidden inputs", fixed(value_case()), _clip_frac),
    Check("hidden_gradient", "the gradient on the hidden inputs", fixed(value_case()), _gradient),
)

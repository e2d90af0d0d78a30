"""Exercise 1, compute_policy_loss: inputs, error scales, checks and hints.

Error scales (see compare.py), over the n real tokens, with a_t = |new_t| + |old_t|,
r_t = exp(new_t - old_t) and m_t = |A_t| * max(r_t, clamp(r_t)):
    loss        mean(m_t * (a_t + n + 8))   casting the inputs and subtracting them perturbs the
                                            log-ratio by u*a_t, which exp turns into a relative
                                            error; exp, the products and the clamp add <= 8
                                            roundings; summing n terms in any order adds < n
    approx_kl   mean(a_t + (n + 2) |new_t - old_t|)
    clip_frac   1                           an integer count over n: one rounding
    gradient    |A_t| r_t (a_t + 8) / n     per real token; exactly 0 on padding
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from assignment.contract import exercise
from assignment.helpers import masked_mean

from ..cases import DTYPES, Case, array, away_from, junk, mask_as, padding
from . import Check, all_of, common, fixed

EXERCISE = exercise(1)
# Ratios stay this far (relative) from the clip boundaries 1 +- eps: float32 moves a ratio by
# about 1e-6, so every correct implementation makes the same strict-> decision.
BOUNDARY_MARGIN = 2e-3


@st.composite
def policy_case(draw, unit_ratio: bool = False) -> Case:
    mask = draw(padding())
    B, T = mask.shape
    dtype = draw(st.sampled_from(DTYPES))
    eps = draw(st.floats(0.05, 0.5))
    old = array(draw, (B, T), -8.0, 0.0)
    if unit_ratio:
        ratio = torch.ones(B, T, dtype=torch.float64)
    else:
        ratio = away_from(torch.exp(array(draw, (B, T), -1.5, 1.5)), [1 - eps, 1 + eps], BOUNDARY_MARGIN)
    new = (old + torch.log(ratio)).to(dtype)
    old = old.to(dtype)
    if unit_ratio:
        new = old.clone()
    adv = array(draw, (B, T), -5.0, 5.0)
    # Advantages below 1e-30 become 0: in float32 their products with the ratio underflow, and the
    # strict > of clip_frac would then compare 0 with 0 where float64 compares two tiny numbers.
    adv = torch.where(adv.abs() < 1e-30, 0.0, adv).to(dtype)
    # Padding holds the log-probs of pad tokens, as a trainer leaves them: down to -300 (exp of it
    # is 0 in float32, so exp(new) / exp(old) gives 0 / 0 = NaN there), and nearly equal under both
    # policies (a log-ratio of at most 5 at padding: exp(new - old) stays finite, as it does in
    # training; a junk log-ratio above 88.7 would overflow exp in float32 and make even the
    # solution's gradient 0 * inf = NaN, which no contract rule forbids).
    pad_old = draw(st.floats(-300.0, 0.0))
    pad_new = pad_old + draw(st.floats(-5.0, 5.0))
    return Case(
        tensors={
            "logprobs_new": torch.where(mask, new, torch.full_like(new, pad_new)),
            "logprobs_old": torch.where(mask, old, torch.full_like(old, pad_old)),
            "advantages": junk(draw, adv, mask, -100.0, 100.0),
            "response_mask": mask_as(draw, mask, dtype),
        },
        scalars={"clip_ratio": eps},
    )


def _real(case: Case):
    """(new, old, A, r, a, m) over real tokens, float64; ratio r, magnitudes a and m as in the docstring."""
    mask = case.mask
    new, old, adv = (case.tensors[k].double()[mask] for k in ("logprobs_new", "logprobs_old", "advantages"))
    eps = case.scalars["clip_ratio"]
    r = torch.exp(new - old)
    return new, old, adv, r, new.abs() + old.abs(), adv.abs() * torch.maximum(r, r.clamp(1 - eps, 1 + eps))


def scales(case: Case, ref=None) -> dict[str, torch.Tensor]:
    new, old, adv, r, a, m = _real(case)
    n = case.n_real
    grad = torch.zeros(case.mask.shape, dtype=torch.float64)
    grad[case.mask] = adv.abs() * r * (a + 8) / n
    return {"loss": (m * (a + n + 8)).mean(), "approx_kl": (a + (n + 2) * (new - old).abs()).mean(),
            "clip_frac": torch.tensor(1.0, dtype=torch.float64), "grad": grad}


def _unit_ratio(case: Case, ref, sub, ulps: float) -> list[str]:
    """With logprobs_new == logprobs_old: loss = -token-mean(A), clip_frac = approx_kl = 0."""
    adv = case.tensors["advantages"].double()[case.mask]
    zero = torch.zeros((), dtype=torch.float64)
    closed = type(ref)({"loss": -adv.mean(), "clip_frac": zero, "approx_kl": zero}, {}, None)
    return common.outputs(scales, "loss", "clip_frac", "approx_kl")(case, closed, sub, ulps)


INVERTED = "your ratio is inverted: ratio = exp(logprobs_new - logprobs_old), and approx_kl's log-ratio too"


def patterns(case: Case) -> list[tuple[str, torch.Tensor, str]]:
    mask = case.mask
    new, old, adv = (case.tensors[k].double() for k in ("logprobs_new", "logprobs_old", "advantages"))
    eps = case.scalars["clip_ratio"]
    r = torch.exp(new - old)
    un, cl = -adv * r, -adv * r.clamp(1 - eps, 1 + eps)
    m = mask.double()
    row_means = (torch.where(mask, torch.maximum(un, cl), 0.0).sum(1) / m.sum(1))[m.sum(1) > 0].mean()
    sign = "your loss has the opposite sign: the per-token loss is max(-A * ratio, -A * clamp(ratio)), and we minimise it"
    product = "you clamp A * ratio; clamp the ratio alone: -A * clamp(ratio, 1 - eps, 1 + eps)"
    log_ratio = ("clamp the ratio to [1 - eps, 1 + eps], not the log-ratio to [-eps, eps] (that clips to "
                 "[e^-eps, e^eps])")
    # Each mistake lists every output it changes (common.suggest): without its minus the clip test
    # compares A * clamp(ratio) with A * ratio; a clipped term of another form is clip_frac's too.
    clipped_product, clipped_log = -(adv * r).clamp(1 - eps, 1 + eps), -adv * torch.exp((new - old).clamp(-eps, eps))
    return [
        ("loss", masked_mean(torch.minimum(-un, -cl), mask), sign + " (the paper's min(A r, A clip(r)) is maximised)"),
        ("loss", masked_mean(torch.maximum(-un, -cl), mask), sign),
        ("clip_frac", masked_mean((-cl > -un).double(), mask), sign),
        ("loss", masked_mean(torch.minimum(un, cl), mask),
         "you take the minimum of the two terms; PPO's loss takes the maximum (the pessimistic bound)"),
        ("loss", masked_mean(torch.maximum(un, clipped_product), mask), product),
        ("clip_frac", masked_mean((clipped_product > un).double(), mask), product),
        ("loss", masked_mean(torch.maximum(un, clipped_log), mask), log_ratio),
        ("clip_frac", masked_mean((clipped_log > un).double(), mask), log_ratio),
        ("loss", torch.maximum(un, cl).mean(), "the mean includes padded positions: use masked_mean(x, response_mask)"),
        ("loss", torch.where(mask, torch.maximum(un, cl), 0.0).mean(), common.ALL_POSITIONS),
        ("loss", row_means, "you average per-row means; the token-mean divides the sum over all real tokens by their number"),
        ("loss", masked_mean(un, mask), "your loss ignores the clipped term"),
        ("loss", masked_mean(torch.maximum(-adv / r, -adv * (1 / r).clamp(1 - eps, 1 + eps)), mask), INVERTED),
        ("clip_frac", masked_mean((-adv * (1 / r).clamp(1 - eps, 1 + eps) > -adv / r).double(), mask), INVERTED),
        ("approx_kl", masked_mean(new - old, mask), INVERTED),
        ("clip_frac", masked_mean(((r - 1).abs() > eps).double(), mask),
         "clip_frac counts tokens where the clipped term is active ([-A*clamp(ratio) > -A*ratio]), "
         "not every ratio outside [1 - eps, 1 + eps]"),
        ("clip_frac", masked_mean((cl >= un).double(), mask), "use a strict > in clip_frac: where both terms are equal, nothing is clipped"),
        ("clip_frac", masked_mean((un > cl).double(), mask), "clip_frac counts tokens where the clipped term is the "
                                                              "larger one, [-A*clamp(ratio) > -A*ratio]; yours counts "
                                                              "those where the unclipped one is"),
        ("approx_kl", masked_mean(new - old, mask), "approx_kl is token-mean(logprobs_old - logprobs_new); yours is "
                                                    "token-mean(logprobs_new - logprobs_old)"),
        ("approx_kl", masked_mean((r - 1) - torch.log(r), mask), "approx_kl is the k1 estimator, not k3"),
        ("approx_kl", (old - new).mean(), "approx_kl includes padded positions: use masked_mean"),
    ]


# exp(x) is exactly 0 in float32 below log(2**-149) = -103.28 (bfloat16 has float32's exponents):
# there exp(new) / exp(old) is 0 / 0.
EXP_UNDERFLOW = -103.28
DIVISION = ("exp(logprobs_new) / exp(logprobs_old) is 0 / 0 = NaN where both log-probs are below about -103 "
            "(exp underflows to 0 in float32; the padding holds such numbers): compute "
            "ratio = exp(logprobs_new - logprobs_old)")


def _division(case, sub) -> bool:
    """The evidence of exp(new) / exp(old): NaN in the gradient only where both exps underflow."""
    if sub is None or sub.grad is None or case.tensors["logprobs_new"].dtype == torch.float64:
        return False
    bad = ~torch.isfinite(sub.grad)
    under = (case.tensors["logprobs_new"].double() < EXP_UNDERFLOW) & (case.tensors["logprobs_old"].double() < EXP_UNDERFLOW)
    return bool(bad.any()) and bool((bad <= under).all())


def hint(evidence, ulps) -> str | None:
    """The hint for a failed check; ``evidence`` is [(case, submitted, reference)], the case shown
    last (common.suggest)."""
    if _division(*evidence[-1][:2]):
        return DIVISION
    return common.suggest(patterns, scales, evidence, ulps)


_loss = common.outputs(scales, "loss")
_metrics = all_of(common.outputs(scales, "clip_frac", "approx_kl"), common.no_gradient("clip_frac", "approx_kl"))
_gradient = common.gradient(scales, "logprobs_new")

CHECKS = (
    Check("loss", "the loss equals the reference (clipped surrogate, token-mean over real tokens)",
          fixed(policy_case()), _loss),
    Check("metrics", "clip_frac (strict >) and approx_kl (k1) equal the reference and carry no gradient",
          fixed(policy_case()), _metrics),
    Check("gradient", "the gradient of the loss w.r.t. logprobs_new equals the reference's", fixed(policy_case()), _gradient),
    Check("unit_ratio", "with ratio = 1 the loss is -token-mean(A) and both metrics are 0",
          fixed(policy_case(unit_ratio=True)), _unit_ratio),
    Check("hidden_loss", "the loss on the hidden inputs", fixed(policy_case()), _loss),
    Check("hidden_metrics", "clip_frac and approx_kl on the hidden inputs", fixed(policy_case()), _metrics),
    Check("hidden_gradient", "the gradient on the hidden inputs", fixed(policy_case()), _gradient),
)

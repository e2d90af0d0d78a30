"""Exercise 8 (Part II), compute_kl: inputs, error scales, checks and hints.

Error scales (see compare.py), per real token, with x = ref_logprobs - logprobs the exact log-ratio
and a = |logprobs| + |ref_logprobs| + |x| (the casts of both inputs and the subtraction perturb
x by at most u a):
    k1 = -x                  a
    k2 = x^2 / 2             |x| a + x^2                     d k2 / d x = x; the square rounds once
    k3 = e^x - 1 - x         |e^x - 1| a + e^x + |e^x - 1| + |k3|
                                 d k3 / d x = e^x - 1; exp (or expm1), then the two subtractions
                                 in either order, each one rounding of its result
    gradient (d sum(kl) / d logprobs = -d kl / d x):
      k1  1                  exact: only casts and a sign
      k2  a                  the gradient is -x: x's own error
      k3  e^x (a + 1) + |e^x - 1|
                                 1 - e^x: e^x perturbed relatively by x's error and by exp's
                                 rounding, then one subtraction
Padded positions must be exactly 0 (output and gradient). Real inputs stay in [-20, 0]. The
padding holds log-probs of -300 to -100 (the contract's junk is up to a few hundred in magnitude)
against reference junk in [-20, 5]: e^x computed there overflows float32 (x > 88.7), and only code
that selects the padding away before exp keeps the gradient there 0 (hint 8.2; float64, the
reference's, holds e^305).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from assignment.contract import KL_ESTIMATORS, exercise

from ..cases import DTYPES, Case, array, junk, mask_as, padding
from . import Check, all_of, common, fixed

EXERCISE = exercise(8)


UNKNOWN_ESTIMATORS = ("k0", "k4", "kl", "low_var_kl", "mse", "K3")  # verl's names, near misses


@st.composite
def kl_case(draw, estimators=KL_ESTIMATORS, spread: float = 6.0) -> Case:
    """Log-ratios x in [-spread, spread] around log-probs in [-12, 0]: k3 passes verl's clamp at 10
    from x > 2.6 on, so every check meets the tokens where a clamp would change k3 or its gradient."""
    mask = draw(padding(max_b=5, max_t=8))
    B, T = mask.shape
    dtype = draw(st.sampled_from(DTYPES))
    logprobs = array(draw, (B, T), -12.0, 0.0)
    ref = (logprobs + array(draw, (B, T), -spread, spread)).clamp(max=0.0)  # log-probs are <= 0
    return Case(tensors={"logprobs": junk(draw, logprobs.to(dtype), mask, -300.0, -100.0),
                         "ref_logprobs": junk(draw, ref.to(dtype), mask, -20.0, 5.0),
                         "response_mask": mask_as(draw, mask, dtype)},
                scalars={"kl_estimator": draw(st.sampled_from(estimators))})


@st.composite
def unknown_estimator(draw) -> Case:
    case, name = draw(kl_case()), draw(st.sampled_from(UNKNOWN_ESTIMATORS))
    return Case(case.tensors, {"kl_estimator": name}, {"why": f"kl_estimator {name!r} is none of k1, k2 and k3"},
                raises="ValueError")


def estimate(case: Case, estimator: str | None = None, flip: bool = False) -> torch.Tensor:
    """(B, T) float64 per-token KL; ``flip`` takes the log-ratio the other way up (a known mistake)."""
    x = case.tensors["ref_logprobs"].double() - case.tensors["logprobs"].double()
    x = -x if flip else x
    estimator = estimator or case.scalars["kl_estimator"]
    kl = {"k1": -x, "k2": 0.5 * x ** 2, "k3": torch.expm1(x) - x}[estimator]
    return torch.where(case.mask, kl, 0.0)


def scales(case: Case, ref=None) -> dict[str, torch.Tensor]:
    lp, rl = case.tensors["logprobs"].double(), case.tensors["ref_logprobs"].double()
    x = rl - lp
    a = lp.abs() + rl.abs() + x.abs()
    e = torch.exp(x)
    k = case.scalars["kl_estimator"]
    if k == "k1":
        value, grad = a, torch.ones_like(a)
    elif k == "k2":
        value, grad = x.abs() * a + x ** 2, a
    else:
        k3 = torch.expm1(x) - x
        value = (e - 1).abs() * a + e + (e - 1).abs() + k3.abs()
        grad = e * (a + 1) + (e - 1).abs()
    mask = case.mask
    return {"kl": torch.where(mask, value, 0.0), "grad": torch.where(mask, grad, 0.0)}


def _zero_padding(case, ref, sub, ulps) -> list[str]:
    """kl is exactly 0 at padded positions, and its gradient is finite there: every value check looks
    (the gradient check, of every estimator, meets k3 in float32, where junk overflows exp, too
    seldom to be the only one)."""
    pad = ~case.mask
    problems = []
    if not bool((sub.outputs["kl"][pad] == 0).all()):
        problems.append("kl is non-zero (or NaN) at padded positions; the contract asks for 0 there")
    if sub.grad is not None and not bool(torch.isfinite(sub.grad[pad]).all()):
        problems.append(common.nonfinite_at_padding("d sum(kl) / d logprobs", pad & ~torch.isfinite(sub.grad)))
    return problems


def patterns(case: Case) -> list[tuple[str, torch.Tensor, str]]:
    k = case.scalars["kl_estimator"]
    if k == "k1":
        return [("kl", -estimate(case), "k1 is logprobs - ref_logprobs (= -log r with r = pi_ref / pi): the sign "
                                        "is flipped")]
    if k == "k2":
        return [("kl", 2 * estimate(case), "k2 is half the squared log-ratio: 0.5 * (ref_logprobs - logprobs)**2")]
    return [
        ("kl", estimate(case, flip=True), "k3's ratio is r = pi_ref / pi = exp(ref_logprobs - logprobs); the other "
                                          "way up it estimates KL(pi_ref || pi) instead"),
        ("kl", -estimate(case), "k3 = r - 1 - log r is never negative: check its sign"),
        ("kl", estimate(case) + 1, "k3 = r - 1 - log r: subtract the 1"),
        ("kl", estimate(case).clamp(-10.0, 10.0), "the contract's k3 has no clamp: verl clamps it to [-10, 10], which "
                                                  "changes k3 and zeroes its gradient wherever k3 > 10"),
    ]


# e^x is inf in float32 (and bfloat16, of float32's exponents) above log(2^128) = 88.72.
EXP_OVERFLOW_AT = 88.72
EXP_OVERFLOW = ("exp(ref_logprobs - logprobs) overflows float32 on the padding junk (inf above 88.7), and selecting it "
                "away afterwards still sends 0 * inf = NaN back to logprobs: select the padding away before exp")


def _overflow(case: Case, sub) -> bool:
    """The evidence of exp before the padding is selected away: a non-finite gradient only at padded
    positions where exp of the junk log-ratio overflows float32."""
    if sub.grad is None or case.tensors["logprobs"].dtype == torch.float64:
        return False
    bad = ~torch.isfinite(sub.grad)
    x = case.tensors["ref_logprobs"].double() - case.tensors["logprobs"].double()
    return bool(bad.any()) and bool((bad <= (~case.mask & (x > EXP_OVERFLOW_AT))).all())


def hint(evidence, ulps) -> str | None:
    """The hint for a failed check; ``evidence`` is [(case, submitted, reference)], the case shown
    last (common.suggest)."""
    if _overflow(*evidence[-1][:2]):
        return EXP_OVERFLOW
    return common.suggest(patterns, scales, evidence, ulps)


_values = all_of(common.outputs(scales, "kl"), _zero_padding)
_gradient = common.gradient(scales, "logprobs")

CHECKS = (
    Check("k1", "k1 = logprobs - ref_logprobs on real tokens, 0 on padding (with its gradient)",
          fixed(kl_case(estimators=("k1",))), _values),
    Check("k2", "k2 = 0.5 * (ref_logprobs - logprobs)**2 on real tokens, 0 on padding (with its gradient)",
          fixed(kl_case(estimators=("k2",))), _values),
    Check("k3", "k3 = exp(ref_logprobs - logprobs) - 1 - (ref_logprobs - logprobs), 0 on padding (with its gradient), "
          "no clamp", fixed(kl_case(estimators=("k3",))), _values),
    Check("gradient", "the gradient of sum(kl) w.r.t. logprobs, every estimator, 0 on padding; on the inputs of the "
          "three checks above", fixed(kl_case()), _gradient),
    Check("edge_cases", "an unknown estimator raises ValueError (the trainer asks for k3 only)",
          fixed(unknown_estimator()), _values),
    Check("hidden_kl", "the estimates on the hidden inputs, every estimator", fixed(kl_case()), _values),
)

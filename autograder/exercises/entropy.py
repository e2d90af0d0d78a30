"""Exercise 3, compute_entropy_loss: inputs, error scales, checks and hints.

Error scales (see compare.py), with V the vocabulary, for a real token t with logits z,
M_t = max(1, max_v |z_v|), p = softmax(z) and H_t its entropy, over the n real tokens:
    loss        mean(M_t (V + 2 log V + 8) + V + 8) + (n + 2) mean(H_t)
                    logsumexp(z) and sum(p z) each err by u M_t (log V + V + 4) at most: the
                    shift z - max, exp, a sum of V terms in any order, log; log_softmax and
                    Categorical take the same steps. Their difference H_t then takes the
                    token-mean: n more roundings of magnitude H_t
    gradient    p_v M_t (4 |z_v - max z| + 3 V + 2 log V + 17) / n, per (t, v); 0 on padding
                    d loss / d z_v = p_v (z_v - sum(p z)) / n: the relative error of p_v
                    (u (2 |z_v - max z| + V + 4)) times |z_v - sum(p z)| <= 2 M_t, plus p_v
                    times the error of sum(p z) and of z_v
bfloat16 logits are exact in float32, so the same scales hold for them.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from assignment.contract import exercise
from assignment.helpers import masked_mean

from ..cases import DTYPES, Case, mask_as, padding
from ..compare import bound, within
from . import Check, common, fixed

EXERCISE = exercise(3)


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
    return Case(tensors={"logits": logits, "response_mask": mask_as(draw, mask, dtype)},
                notes={"logits seed": seed, "scale": scale, "offset": offset})


def _entropy(z: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)


def scales(case: Case, ref=None) -> dict[str, torch.Tensor]:
    mask, n = case.mask, case.n_real
    z = case.tensors["logits"].double()
    V = z.shape[-1]
    M = z.abs().amax(-1).clamp(min=1.0)  # (B, T)
    log_v = math.log(V)
    loss = (M * (V + 2 * log_v + 8) + V + 8)[mask].mean() + (n + 2) * _entropy(z)[mask].mean()
    spread = (z - z.amax(-1, keepdim=True)).abs()
    grad = torch.softmax(z, -1) * M[..., None] * (4 * spread + 3 * V + 2 * log_v + 17) / n
    return {"loss": loss, "grad": torch.where(mask[..., None], grad, 0.0)}


def patterns(case: Case) -> list[tuple[str, torch.Tensor, str]]:
    mask = case.mask
    z = case.tensors["logits"].double()
    h = _entropy(z)
    m = mask.double()
    row_means = (torch.where(mask, h, 0.0).sum(1) / m.sum(1))[m.sum(1) > 0].mean()
    return [
        ("loss", masked_mean(h, mask), "your entropy loss has the opposite sign: it is -token-mean(H), so that "
                                       "minimising it raises the entropy"),
        ("loss", -masked_mean(torch.logsumexp(z, -1) - (torch.softmax(z, 1) * z).sum(-1), mask),
         "take the softmax over the vocabulary (dim=-1), not over the response's positions"),
        ("loss", -masked_mean(torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).mean(-1), mask),
         "sum p * z over the vocabulary, not the mean"),
        ("loss", -h.mean(), "the mean includes padded positions: use masked_mean"),
        ("loss", -row_means, "you average per-row means; use the token-mean over all real tokens"),
        ("loss", -torch.where(mask, h, 0.0).mean(), common.ALL_POSITIONS),
    ]


NAIVE_LOG = ("log(softmax(z)) underflows: softmax is exactly 0 for logits far below the maximum, log(0) = -inf, "
             "and p * log p = 0 * (-inf) = NaN. Use the stable form logsumexp(z) - sum(softmax(z) * z), or log_softmax")


# The scales above bound float32 roundings of unit U = 2^-24; the same steps done in bfloat16
# round with unit 2^-8, so their error is bounded by the same scale times 2^16.
BF16_OVER_F32 = 2.0 ** 16
NO_UPCAST = ("only bfloat16 logits fail, by about bfloat16's rounding: upcast the logits to float32 before "
             "the softmax and the sums (z = logits.to(reduction_dtype(logits.dtype)))")


def _bfloat16_arithmetic(evidence, ulps) -> bool:
    """Every failing case has bfloat16 logits and misses the loss by no more than bfloat16 rounding."""
    seen = False
    for case, sub, ref in evidence:
        if sub is None or ref is None:
            continue
        if case.tensors["logits"].dtype != torch.bfloat16:
            return False
        tol = bound(ulps, scales(case, ref)["loss"]) * BF16_OVER_F32
        if not bool(within(sub.outputs["loss"], ref.outputs["loss"], tol).all()):
            return False
        seen = True
    return seen


def hint(evidence, ulps) -> str | None:
    """The hint for a failed check; ``evidence`` is [(case, submitted, reference)], the case shown
    last (common.suggest)."""
    case, sub, _ = evidence[-1]  # a non-finite loss on real tokens is its own evidence
    if sub is not None and (not torch.isfinite(sub.outputs["loss"]).all()
                            or (sub.grad is not None and not torch.isfinite(sub.grad[case.mask]).all())):
        return NAIVE_LOG
    if _bfloat16_arithmetic(evidence, ulps):
        return NO_UPCAST
    return common.suggest(patterns, scales, evidence, ulps)


_loss = common.outputs(scales, "loss")
_gradient = common.gradient(scales, "logits")

CHECKS = (
    Check("entropy", "the loss equals -token-mean of the per-token entropy", fixed(entropy_case()), _loss),
    Check("extreme_logits", "the loss stays finite and correct for logits of magnitude up to 1e3",
          fixed(entropy_case(scales=(100.0, 1000.0), offsets=(0.0, 1000.0, -1000.0))), _loss),
    Check("large_vocab", "the loss is correct for a 50257-token vocabulary",
          fixed(entropy_case(scales=(1.0, 10.0), vocab=50257, max_b=2, max_t=3)), _loss),
    # float32/64 only: a gradient w.r.t. bfloat16 logits is itself rounded to bfloat16
    Check("gradient", "the gradient of the loss w.r.t. the logits equals the reference's",
          fixed(entropy_case(dtypes=DTYPES)), _gradient),
    Check("hidden_entropy", "the loss on the hidden inputs, moderate and extreme logits",
          fixed(entropy_case(scales=(0.0, 1.0, 10.0, 1000.0))), _loss),
    Check("hidden_gradient", "the gradient on the hidden inputs",
          fixed(entropy_case(scales=(0.0, 1.0, 10.0, 1000.0), dtypes=DTYPES)), _gradient),
)

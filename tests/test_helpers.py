"""The given helpers: masked reductions and log-prob gathering."""

import math

import pytest
import torch

from assignment.helpers import logprobs_from_logits, masked_mean, masked_var, masked_whiten, reduction_dtype

MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
X = torch.tensor([[1.0, 2.0, 3.0, 100.0], [10.0, -7.0, float("nan"), float("inf")]])
U = 2.0 ** -24  # float32 unit roundoff


def test_masked_mean_is_token_mean_not_mean_of_row_means():
    assert masked_mean(X, MASK).item() == pytest.approx((1 + 2 + 3 + 10) / 4)  # row means would give 6.0


def test_masked_reductions_ignore_nan_and_inf_in_padding():
    assert math.isfinite(masked_mean(X, MASK).item())
    assert math.isfinite(masked_var(X, MASK).item())
    assert torch.isfinite(masked_whiten(X, MASK)[MASK]).all()


def test_masked_var_uses_bessel_correction():
    real = torch.tensor([1.0, 2.0, 3.0, 10.0])
    assert masked_var(X, MASK).item() == pytest.approx(real.var(unbiased=True).item())


def test_masked_whiten_gives_zero_mean_unit_sample_std():
    w = masked_whiten(X, MASK)[MASK]
    # Float32, u = 2^-24. The mean 4 and the deviations x - 4 are exact (small integers) and sum
    # to exactly 0, so w_i = (x_i - 4) r (1 + e_i), |e_i| <= u, for a common factor r: their sum
    # is r sum_i (x_i - 4) e_i, at most u sum|w|, and its 3 additions add 3 u sum|w| (a bound in
    # the magnitudes: the sum itself cancels to 0). Measured: exactly 0 on an AMD EPYC.
    assert w.mean().item() == pytest.approx(0.0, abs=4 * U * w.abs().mean().item())
    # The sample std of w is exactly 1 - eps / (2 var) = 1 - 3e-10 (0.005u). r errs by the
    # variance's rounding and eps's (u/2 each after the square root) and rsqrt's 2u, each w_i by
    # u more: 4u. Its std, a float32 variance of n = 4 terms by whichever algorithm (two passes;
    # Welford's, at most 4 roundings an update): within 4n u = 16u relative, 8u after the root,
    # and the root's own u. Sum: 13u < 16u. (Measured: exactly 1 on an AMD EPYC.)
    assert w.std(unbiased=True).item() == pytest.approx(1.0, abs=16 * U)


def test_float_masks_work_like_bool_masks():
    assert masked_mean(X, MASK.float()).item() == masked_mean(X, MASK).item()


@pytest.mark.parametrize("dtype,expected", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                            (torch.float32, torch.float32), (torch.float64, torch.float64)])
def test_reductions_run_in_float32_or_wider(dtype, expected):
    assert reduction_dtype(dtype) == expected
    assert masked_mean(X.to(dtype), MASK).dtype == expected


def test_logprobs_from_logits_matches_log_softmax_and_is_stable():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0)) * 1e3
    labels = torch.tensor([[0, 1, 4], [2, 2, 3]])
    got = logprobs_from_logits(logits, labels)
    want = torch.log_softmax(logits.double(), -1).gather(-1, labels[..., None]).squeeze(-1)
    assert got.shape == (2, 3) and torch.isfinite(got).all()
    # Float32 log p = z - lse, lse = m + log(sum_v exp(z_v - m)) with m = max z: each z_v - m
    # rounds by u |z_v - m|, which exp(z_v - m) turns into a relative error of at most that (its
    # weight e^-x x <= 1/e), exp adds 2u, the V - 1 additions (V - 1) u of a sum >= 1, the log
    # 2u log V; then m + log rounds by u |lse| and z - lse by u |log p|. Elementwise,
    #     |got - want| <= u (|lse| + |log p| + V / e + V + 1 + 2 log V) <= u (|lse| + |log p| + 2V + 4),
    # in the magnitudes of the two terms, of 1e3 here, not in |log p|, which cancels to ~0 for the
    # largest logit. (Measured: at most 0.6 of it on an AMD EPYC, with its scalar kernels.)
    lse = logits.double().gather(-1, labels[..., None]).squeeze(-1) - want
    assert bool(((got.double() - want).abs() <= U * (lse.abs() + want.abs() + 2 * logits.shape[-1] + 4)).all())

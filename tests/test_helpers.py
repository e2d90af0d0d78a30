"""The given helpers: masked reductions and log-prob gathering."""

import math

import pytest
import torch

from assignment.helpers import logprobs_from_logits, masked_mean, masked_var, masked_whiten, reduction_dtype

MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
X = torch.tensor([[1.0, 2.0, 3.0, 100.0], [10.0, -7.0, float("nan"), float("inf")]])


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
    assert w.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert w.std(unbiased=True).item() == pytest.approx(1.0, abs=1e-6)


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
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-3)

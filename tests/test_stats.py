"""The two-proportion z-test used by the GSM8K report."""

import math

import pytest

from assignment.trainer.stats import two_proportion_z_test


def test_textbook_example():
    # 45/100 vs 56/100: pooled p = 0.505, se = sqrt(0.505 * 0.495 * 0.02) = 0.070709, z = 1.5557.
    t = two_proportion_z_test(45, 100, 56, 100)
    assert t.z == pytest.approx(0.11 / math.sqrt(0.505 * 0.495 * 0.02), rel=1e-12)
    assert t.z == pytest.approx(1.5557, abs=1e-4)
    assert t.p_value == pytest.approx(0.11980, abs=1e-4)  # 2 * (1 - Phi(1.5557))
    assert t.diff == pytest.approx(0.11)
    assert t.ci_low < 0.11 < t.ci_high


def test_symmetric_and_significant_for_large_gaps():
    up, down = two_proportion_z_test(10, 500, 60, 500), two_proportion_z_test(60, 500, 10, 500)
    assert up.z == pytest.approx(-down.z) and up.p_value == pytest.approx(down.p_value)
    assert up.p_value < 1e-6 and up.ci_low > 0


def test_equal_and_degenerate_proportions():
    assert two_proportion_z_test(30, 100, 30, 100).p_value == pytest.approx(1.0)
    assert two_proportion_z_test(0, 50, 0, 80).p_value == 1.0  # zero variance: no evidence


@pytest.mark.parametrize("args", [(1, 0, 1, 1), (5, 4, 1, 4), (-1, 4, 1, 4)])
def test_rejects_impossible_counts(args):
    with pytest.raises(ValueError):
        two_proportion_z_test(*args)

"""The exact McNemar test used by the GSM8K report, against binomial tails computed by hand."""

import pytest

from assignment.trainer.stats import binomial_two_sided_p, mcnemar_exact


@pytest.mark.parametrize("k, n, expected", [
    (1, 6, 2 * (1 + 6) / 64),  # P(X <= 1) of Bin(6, 1/2) = (C(6,0) + C(6,1)) / 2^6 = 7/64
    (3, 15, 2 * (1 + 15 + 105 + 455) / 32768),  # = 1152/32768 = 0.03515625
    (12, 15, 2 * (1 + 15 + 105 + 455) / 32768),  # symmetric: min(k, n - k) = 3
    (0, 10, 2 / 1024),
    (0, 1, 1.0), (5, 10, 1.0), (0, 0, 1.0),  # the doubled tail is capped at 1; no discordant pair: 1
])
def test_binomial_two_sided_p_is_the_doubled_exact_tail(k, n, expected):
    assert binomial_two_sided_p(k, n) == pytest.approx(expected, rel=1e-12)


def test_large_counts_stay_exact():
    # Bin(2000, 1/2): 2 * 2^-2000 is below the smallest float; the exact fraction rounds to ~0, no error.
    assert 0.0 <= binomial_two_sided_p(0, 2000) < 1e-300
    assert binomial_two_sided_p(1000, 2000) == 1.0
    # Normal check: 900 of 2000 is 4.47 sd below the mean; two-sided p ~ 8.6e-6 (by the normal, ~7.7e-6).
    assert 5e-6 < binomial_two_sided_p(900, 2000) < 1.2e-5


def test_mcnemar_counts_only_the_discordant_pairs():
    before = [True] * 10 + [False] * 20 + [True] * 3 + [False] * 12  # 3 regressed, 12 improved below
    after = [True] * 10 + [False] * 20 + [False] * 3 + [True] * 12
    test = mcnemar_exact(before, after)
    assert (test.n, test.before, test.after, test.b, test.c) == (45, 13, 22, 3, 12)
    assert test.p_value == pytest.approx(0.03515625, rel=1e-12)
    assert test.diff == pytest.approx(9 / 45)
    swapped = mcnemar_exact(after, before)
    assert (swapped.b, swapped.c, swapped.p_value) == (12, 3, test.p_value)


def test_no_change_is_p_one():
    same = [True, False, True]
    assert mcnemar_exact(same, same).p_value == 1.0


@pytest.mark.parametrize("before, after", [([], []), ([True], [True, False])])
def test_rejects_unpaired_outcomes(before, after):
    with pytest.raises(ValueError):
        mcnemar_exact(before, after)


def test_rejects_impossible_counts():
    with pytest.raises(ValueError):
        binomial_two_sided_p(7, 6)

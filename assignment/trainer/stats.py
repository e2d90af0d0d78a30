"""Did greedy accuracy change with training? The exact McNemar test on paired outcomes.

Before and after training the *same* test problems are answered, so the outcomes are paired.
Only the discordant pairs carry evidence: ``b`` problems right before and wrong after, ``c``
wrong before and right after. Under H0 (no change) each discordant pair is equally likely to
go either way, so ``c ~ Binomial(b + c, 1/2)``; the exact two-sided p-value is
``min(1, 2 * P(X <= min(b, c)))`` (McNemar 1947; the exact binomial form, e.g. Fagerland,
Lydersen and Laake 2013, "The McNemar test for binary matched-pairs data"). With no
discordant pair, p = 1. Computed with integers (``math.comb``), exact for any n, no scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence


@dataclass(frozen=True)
class McNemar:
    n: int  # pairs
    before: int  # right before
    after: int  # right after
    b: int  # right before, wrong after (regressed)
    c: int  # wrong before, right after (improved)
    p_value: float  # exact, two-sided

    @property
    def diff(self) -> float:
        """Accuracy after minus accuracy before."""
        return (self.c - self.b) / self.n


def binomial_two_sided_p(k: int, n: int) -> float:
    """Exact two-sided p of observing min(k, n - k) or fewer of n fair coin flips (p = 1/2)."""
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2 ** n)))


def mcnemar_exact(before: Sequence[bool], after: Sequence[bool]) -> McNemar:
    """The exact McNemar test of paired outcomes ``before[i]`` and ``after[i]`` (same problems)."""
    if len(before) != len(after) or not before:
        raise ValueError(f"need two non-empty outcome lists of one length, got {len(before)} and {len(after)}")
    b = sum(bool(x) and not bool(y) for x, y in zip(before, after))
    c = sum(not bool(x) and bool(y) for x, y in zip(before, after))
    return McNemar(len(before), sum(map(bool, before)), sum(map(bool, after)), b, c, binomial_two_sided_p(c, b + c))

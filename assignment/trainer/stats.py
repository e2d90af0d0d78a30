"""Is the accuracy after training different from before? The two-proportion z-test.

For k1 successes out of n1 and k2 out of n2, under H0 (equal proportions) the pooled
proportion is p = (k1 + k2) / (n1 + n2) and z = (p2 - p1) / sqrt(p (1 - p) (1/n1 + 1/n2)),
approximately standard normal for large n. The two-sided p-value is erfc(|z| / sqrt(2)).
The 95% interval of p2 - p1 uses the unpooled (Wald) standard error.

Before/after accuracies on the *same* test problems are paired, which this test ignores; it is
conservative there (McNemar's test on the discordant pairs would have more power).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal


@dataclass(frozen=True)
class ZTest:
    p1: float
    p2: float
    z: float
    p_value: float
    # 95% confidence interval of p2 - p1.
    ci_low: float
    ci_high: float

    @property
    def diff(self) -> float:
        return self.p2 - self.p1


def two_proportion_z_test(k1: int, n1: int, k2: int, n2: int) -> ZTest:
    """Two-sided test of H0: p1 == p2, from k1/n1 (e.g. before) and k2/n2 (after)."""
    if not (n1 > 0 and n2 > 0 and 0 <= k1 <= n1 and 0 <= k2 <= n2):
        raise ValueError(f"need 0 <= k <= n and n > 0, got {k1}/{n1} and {k2}/{n2}")
    p1, p2 = k1 / n1, k2 / n2
    pooled = (k1 + k2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    # Both samples all-success or all-failure: no evidence of a difference.
    z = (p2 - p1) / se if se > 0 else 0.0
    wald = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    return ZTest(p1, p2, z, math.erfc(abs(z) / math.sqrt(2)), p2 - p1 - Z95 * wald, p2 - p1 + Z95 * wald)

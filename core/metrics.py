"""Evaluation statistics as pure functions: Wilson score intervals and the two-proportion z-test.

Used by the A/B tests of two library states (the workbench shows them, the evaluator computes
them) and by held-out evaluation. Only `math`: no numpy, no scipy, so any floor may import it.
"""
from __future__ import annotations

import math


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a success rate (z = 1.96: 95%).

    Unlike the normal approximation p ± z·sqrt(p(1−p)/n), it stays inside [0, 1] and is not of
    zero width at 0/n or n/n, which is where small A/B tests of agents often land.
    `n = 0` (no episodes) gives the uninformative (0, 1).
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def two_proportion_test(s1: int, n1: int, s2: int, n2: int) -> tuple[float, float]:
    """(p1 − p2, two-sided p-value) of the pooled two-proportion z-test.

    z = (p1 − p2) / sqrt(p (1 − p) (1/n1 + 1/n2)), p = (s1 + s2) / (n1 + n2); p-value = erfc(|z| / √2).
    When the pooled rate is 0 or 1 (both arms all failures or all successes) the arms cannot be told
    apart: p-value 1. An empty arm has no rate: the difference is 0 and the p-value 1.
    """
    for s, n in ((s1, n1), (s2, n2)):
        if n < 0 or s < 0 or s > n:
            raise ValueError(f"need 0 <= successes <= n, got successes={s}, n={n}")
    if n1 == 0 or n2 == 0:
        return 0.0, 1.0
    p1, p2 = s1 / n1, s2 / n2
    pooled = (s1 + s2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0.0:
        return p1 - p2, 1.0
    z = (p1 - p2) / se
    return p1 - p2, math.erfc(abs(z) / math.sqrt(2.0))

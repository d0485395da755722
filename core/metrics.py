"""Evaluation statistics as pure functions: Wilson score intervals, the two-proportion z-test and McNemar's paired test.

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


EXACT_MCNEMAR_BELOW = 25  # discordant pairs under which the exact binomial test is used (Fagerland et al.'s advice)


def mcnemar_test(a_only: int, b_only: int) -> tuple[float, str]:
    """(two-sided p-value, method) of McNemar's test for paired outcomes: the same tasks played by both arms.

    Only the discordant pairs count: `a_only` tasks that A solved and B did not, `b_only` the reverse. Under
    "no difference" each discordant pair goes either way with probability 1/2. With fewer than
    EXACT_MCNEMAR_BELOW discordant pairs the exact binomial test (p = min(1, 2·P[X ≤ min(a, b)]), X ~ Bin(a+b, ½));
    otherwise the chi-square statistic with continuity correction, (|a − b| − 1)² / (a + b), on one degree of
    freedom (p = erfc(√(χ²/2))). No discordant pair: p-value 1 (nothing tells the arms apart)."""
    if a_only < 0 or b_only < 0:
        raise ValueError(f"need discordant counts >= 0, got {a_only}, {b_only}")
    n = a_only + b_only
    if n == 0:
        return 1.0, "exact"
    if n < EXACT_MCNEMAR_BELOW:
        k = min(a_only, b_only)
        tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
        return min(1.0, 2.0 * tail), "exact"
    chi2 = max(0.0, abs(a_only - b_only) - 1.0) ** 2 / n
    return math.erfc(math.sqrt(chi2 / 2.0)), "chi-square, continuity-corrected"


def paired_outcomes(a: dict, b: dict) -> dict[str, int]:
    """Counts of the 2x2 table of paired outcomes from {task key: success} per arm, over the keys both arms played:
    both solved, only A, only B, neither."""
    keys = sorted(set(a) & set(b), key=str)
    out = {"pairs": len(keys), "both": 0, "a_only": 0, "b_only": 0, "neither": 0}
    for k in keys:
        x, y = bool(a[k]), bool(b[k])
        out["both" if x and y else "a_only" if x else "b_only" if y else "neither"] += 1
    return out


# After a weight sync the rollout engine and the learner score the same tokens (trainers/backends/common.py
# checked_sync_metrics). A synced engine is within float noise (measured on the CPU: 1e-6 in float32, about 0.05 in
# bf16 on a GPU); past this the sync most likely missed a tensor, and rollouts sample from another policy. The run's
# log and the Runs tab warn with the same threshold.
SYNC_GAP_WARN = 0.5


def sync_warning(metrics: dict[str, float]) -> str | None:
    """A one-line warning when a run's latest sync gap (actor or extractor) passes SYNC_GAP_WARN, else None."""
    worst = [(k, v) for k, v in metrics.items()
             if k in ("sync/logprob_gap_max", "sync/extractor_logprob_gap_max") and v is not None and v > SYNC_GAP_WARN]
    if not worst:
        return None
    key, gap = max(worst, key=lambda kv: kv[1])
    who = "extractor" if "extractor" in key else "actor"
    return (f"weight sync ({who}): the engine's log-probs differ from the learner's by up to {gap:.2f} nats "
            f"(> {SYNC_GAP_WARN}): rollouts may not come from the trained weights")

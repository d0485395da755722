"""Eq. 6 re-ranking on hand-computed numbers."""
from __future__ import annotations

import math
import random

from core.diversify import diversify, eq6_scores, random_demotion


def test_eq6_scores_by_hand():
    # s = score − 0.4·ln(1+c) − 1[recent]
    s = eq6_scores([0.9, 0.8, 0.7], [10, 0, 3], [False, False, True], lam=0.4)
    assert math.isclose(s[0], 0.9 - 0.4 * math.log(11))  # 0.9 − 0.95916 = −0.05916
    assert math.isclose(s[1], 0.8)
    assert math.isclose(s[2], 0.7 - 0.4 * math.log(4) - 1.0)  # −0.85452


def test_diversify_orders_by_eq6_and_keeps_k():
    # −0.0592, 0.8, −0.8545 -> candidate 1 first, then 0
    assert diversify([0.9, 0.8, 0.7], [10, 0, 3], [False, False, True], k=2) == [1, 0]
    # a never-retrieved, not-recent list keeps the raw order
    assert diversify([0.5, 0.9, 0.7], [0, 0, 0], [False] * 3, k=3) == [1, 2, 0]
    # lam = 0 and nothing recent: pure similarity ranking
    assert diversify([0.1, 0.3, 0.2], [100, 0, 5], [False] * 3, k=1, lam=0.0) == [1]


def test_ties_keep_original_order():
    assert diversify([0.5, 0.5, 0.5], [0, 0, 0], [False] * 3, k=3) == [0, 1, 2]
    # 0.6 − 0.4·ln 2 = 0.32274 vs 0.32274: equal -> original order
    c = 0.6 - 0.4 * math.log(2)
    assert diversify([0.6, c], [1, 0], [False, False], k=2) == [0, 1]


def test_random_demotion_switch():
    rng = random.Random(0)
    moved = sum(random_demotion([0, 1, 2], [True, False, False], p=0.5, rng=rng) == [1, 0, 2] for _ in range(2000))
    assert 850 < moved < 1150
    assert random_demotion([0, 1], [False, True], p=1.0, rng=rng) == [0, 1]  # top not recent: untouched
    assert random_demotion([0], [True], p=1.0, rng=rng) == [0]

"""Eq. 6 re-ranking on hand-computed numbers."""
from __future__ import annotations

import math
import random

import pytest

from core.diversify import diversify, eq6_scores, random_demotion, s_rank


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


def test_s_rank_is_minus_the_rank_in_similarity_order():
    assert s_rank([0.9, 0.7, 0.8], "rank") == [0.0, -2.0, -1.0]
    assert s_rank([0.5, 0.5, 0.4], "rank") == [0.0, -1.0, -2.0]  # equal similarities keep input order
    assert s_rank([0.9, 0.7], "cosine") == [0.9, 0.7]
    with pytest.raises(ValueError, match="rank"):
        s_rank([0.9], "bm25")


def test_worked_case_rank_vs_cosine():
    # 16 candidates, cosines 0.80 (rank 0) down to 0.60 (rank 15) in steps of 0.2/15. Ranks 0..14 were each
    # retrieved 3 times (long ago: not recent), rank 15 never. Penalty 0.4·ln 4 = 0.55452.
    sims = [0.80 - 0.2 * r / 15 for r in range(16)]
    counts = [3] * 15 + [0]
    recent = [False] * 16
    pen = 0.4 * math.log(4)
    assert math.isclose(pen, 0.554518, abs_tol=1e-6)
    # cosine: rank 0 scores 0.80 − 0.55452 = 0.24548 < 0.60 of rank 15 (every other rank is lower still)
    cos = eq6_scores(s_rank(sims, "cosine"), counts, recent)
    assert math.isclose(cos[0], 0.245482, abs_tol=1e-6) and math.isclose(cos[15], 0.60)
    assert diversify(s_rank(sims, "cosine"), counts, recent, k=1) == [15]
    # −rank: rank 0 scores 0 − 0.55452 = −0.55452, rank 1 −1.55452, rank 15 −15: the top stays on top
    rk = eq6_scores(s_rank(sims, "rank"), counts, recent)
    assert math.isclose(rk[0], -0.554518, abs_tol=1e-6) and math.isclose(rk[1], -1.554518, abs_tol=1e-6) and rk[15] == -15.0
    assert diversify(s_rank(sims, "rank"), counts, recent, k=1) == [0]
    # with −rank a recent top hit (−0.55452 − 1 = −1.55452) falls just behind a fresh rank 1 (−1)
    assert diversify(s_rank(sims, "rank"), [3, 0] + [0] * 14, [True] + [False] * 15, k=2) == [1, 0]

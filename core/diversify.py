"""Retrieval diversification, docs/method.md Eq. 6, as pure functions.

    s(m) = s_rank(m) − λ · ln(1 + c(m)) − 1[m retrieved within the recent window]

Oversample N×k candidates, re-rank by s, keep the top k. Both stabilisers of the paper target the
same problem: with low task diversity the same entry keeps coming back.

s_rank is minus the candidate's rank in the similarity order (0, −1, −2, …) by default, as in the
authors' release: one rank step then weighs as much as the recency penalty, so the count penalty
(λ·ln(1+c) ≤ ~1) only reorders near neighbours. The cosine itself (`kind="cosine"`) spreads over
~0.2, which lets the count penalty pull far-down candidates to the top (docs/method.md, Eq. 6).
"""
from __future__ import annotations

import math
import random
from typing import Sequence

from core.index import SCORE_DECIMALS


RANK_SCORES = ("rank", "cosine")


def s_rank(similarities: Sequence[float], kind: str = "rank") -> list[float]:
    """The s_rank term of Eq. 6 for each candidate: −rank in the similarity order, or the similarity.

    Ranks count from 0 for the most similar; similarities equal to core.index.SCORE_DECIMALS places
    keep their input order (the index's: the newer entry first), as the release's enumerate over its
    result list does.
    """
    if kind == "cosine":
        return [float(x) for x in similarities]
    if kind != "rank":
        raise ValueError(f"s_rank kind must be one of {RANK_SCORES}, not {kind!r}")
    order = sorted(range(len(similarities)), key=lambda i: (-round(float(similarities[i]), SCORE_DECIMALS), i))
    out = [0.0] * len(similarities)
    for r, i in enumerate(order):
        out[i] = -float(r)
    return out


def eq6_scores(scores: Sequence[float], retrieval_counts: Sequence[int], recent: Sequence[bool], *, lam: float = 0.4) -> list[float]:
    """s(m) for each candidate (Eq. 6)."""
    if not (len(scores) == len(retrieval_counts) == len(recent)):
        raise ValueError("scores, retrieval_counts and recent must have the same length")
    return [s - lam * math.log1p(max(c, 0)) - (1.0 if r else 0.0) for s, c, r in zip(scores, retrieval_counts, recent)]


def diversify(scores: Sequence[float], retrieval_counts: Sequence[int], recent: Sequence[bool], *, k: int, lam: float = 0.4) -> list[int]:
    """Indices (into the candidate list) of the top k by Eq. 6, ties broken by original order."""
    s = eq6_scores(scores, retrieval_counts, recent, lam=lam)
    order = sorted(range(len(s)), key=lambda i: (-s[i], i))
    return order[:k]


def random_demotion(order: list[int], recent: Sequence[bool], *, p: float, rng: random.Random) -> list[int]:
    """Released code: a recently used top hit is moved behind the next candidate with probability p."""
    if len(order) >= 2 and recent[order[0]] and rng.random() < p:
        return [order[1], order[0], *order[2:]]
    return order

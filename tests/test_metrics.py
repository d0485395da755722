"""core/metrics.py against numbers worked out by hand (DESIGN.md habit 3)."""
from __future__ import annotations

import math

import pytest

from core.metrics import two_proportion_test, wilson_interval


def test_wilson_half_rate():
    # p = .5, n = 10, z² = 3.8416: denom 1.38416, centre (.5 + .19208) / 1.38416 = .5,
    # half = 1.96·sqrt(.025 + .009604) / 1.38416 = .263410
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.236590, abs=1e-6)
    assert hi == pytest.approx(0.763410, abs=1e-6)


def test_wilson_zero_successes_is_not_degenerate():
    # p = 0: centre = half = .19208 / 1.38416 = .138770 -> (0, .277540)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0
    assert hi == pytest.approx(0.277540, abs=1e-6)
    lo, hi = wilson_interval(10, 10)
    assert lo == pytest.approx(1 - 0.277540, abs=1e-6) and hi == 1.0


def test_wilson_empty_and_bad_input():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_wilson_matches_slow_formula():
    # Against the quadratic's roots: (p̂ - p)² = z² p (1 - p) / n solved for p.
    for s, n in [(1, 7), (13, 40), (99, 100)]:
        z = 1.96
        ph = s / n
        a = 1 + z * z / n
        b = -(2 * ph + z * z / n)
        c = ph * ph
        r = math.sqrt(b * b - 4 * a * c)
        assert wilson_interval(s, n) == pytest.approx(((-b - r) / (2 * a), (-b + r) / (2 * a)), abs=1e-12)


def test_two_proportion_hand_computed():
    # 30/50 vs 20/50: pooled .5, se = sqrt(.25 · .04) = .1, z = 2, p = erfc(2 / √2) = .0455003
    diff, p = two_proportion_test(30, 50, 20, 50)
    assert diff == pytest.approx(0.2)
    assert p == pytest.approx(0.0455003, abs=1e-6)
    diff, p2 = two_proportion_test(20, 50, 30, 50)
    assert diff == pytest.approx(-0.2) and p2 == pytest.approx(p)


def test_two_proportion_degenerate():
    assert two_proportion_test(0, 10, 0, 12) == (0.0, 1.0)
    assert two_proportion_test(5, 5, 8, 8) == (0.0, 1.0)
    assert two_proportion_test(0, 0, 3, 5) == (0.0, 1.0)
    # equal rates: z = 0, p = 1
    assert two_proportion_test(3, 6, 5, 10)[1] == pytest.approx(1.0)


def test_mcnemar_exact_for_few_discordant_pairs_and_chi_square_above():
    from core.metrics import mcnemar_test, paired_outcomes

    assert mcnemar_test(0, 0) == (1.0, "exact")  # nothing tells the arms apart
    p, how = mcnemar_test(6, 1)
    assert how == "exact" and abs(p - 2 * 8 / 128) < 1e-12  # 2·P[Bin(7, 1/2) <= 1]
    assert mcnemar_test(0, 5)[0] == 0.0625 and mcnemar_test(3, 3)[0] == 1.0
    p, how = mcnemar_test(10, 30)  # (|10-30| - 1)^2 / 40 = 9.025 -> p = 0.00266
    assert how.startswith("chi-square") and abs(p - 0.0026631) < 1e-6
    counts = paired_outcomes({1: True, 2: True, 3: False, 4: False, 9: True}, {1: True, 2: False, 3: True, 4: False})
    assert counts == {"pairs": 4, "both": 1, "a_only": 1, "b_only": 1, "neither": 1}

"""core/losses.py against hand-computed numbers, hand gradients and slow loop references."""
from __future__ import annotations

import math

import pytest
import torch

from core.losses import cispo_loss, cispo_stats, clipped_surrogate_loss

LN = math.log


def close(a, b, tol=1e-5):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, atol=tol, rtol=0), (a.tolist(), b.tolist())


def example():
    # logp_old = 0, so ratios are exp(logp): [[1.5, .9], [1.1, (masked)]]
    logp = torch.tensor([[LN(1.5), LN(0.9)], [LN(1.1), LN(0.5)]], requires_grad=True)
    old = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    with_exp = torch.tensor([True, False])
    return logp, old, mask, adv, with_exp


# ---------------------------------------------------------------- PPO clipped surrogate, by hand

def test_token_level_by_hand_and_gradients():
    logp, old, mask, adv, we = example()
    loss, stats = clipped_surrogate_loss(logp, old, adv, mask, we, eps=0.2, level="token")
    # with:    tokens min(1.5, 1.2)=1.2 and min(.9, .9)=.9 -> mean 1.05
    # without: token min(-1.1, -1.1) = -1.1 -> mean -1.1
    # subgroup mean: -(1.05 - 1.1)/2 = .025 (a global token mean would give -(1.2+.9-1.1)/3)
    close(loss, 0.025)
    loss.backward()
    # d/dlogp = -(1/2 subgroups)(1/n_tokens) ρ A, and 0 on the clipped token
    close(logp.grad, [[0.0, -0.25 * 0.9], [0.5 * 1.1, 0.0]])
    assert logp.grad[0, 0] == 0.0  # the PPO-clipped token gets no gradient
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    k3 = (0.5 - LN(1.5)) + (-0.1 - LN(0.9)) + (0.1 - LN(1.1))
    assert stats["approx_kl"] == pytest.approx(k3 / 3, abs=1e-6)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.9 + 1.1) / 3, abs=1e-6)


def test_sequence_level_by_hand():
    logp, old, mask, adv, we = example()
    loss, stats = clipped_surrogate_loss(logp, old, adv, mask, we, eps=0.2, level="sequence")
    rho0 = math.sqrt(1.5 * 0.9)  # exp(mean of the log-ratios) = 1.1619, inside the clip range
    close(loss, -(rho0 - 1.1) / 2)
    loss.backward()
    # d/dlogp_t of ρ0 = ρ0 / 2 (two tokens); the subgroup's token mean of a per-sequence value is that value
    close(logp.grad, [[-0.5 * rho0 / 2, -0.5 * rho0 / 2], [0.5 * 1.1, 0.0]])
    assert stats["clip_frac"] == 0.0
    assert stats["ratio_mean"] == pytest.approx((rho0 + 1.1) / 2, abs=1e-6)


def test_sequence_level_clipped_sequence_has_zero_gradient():
    logp = torch.tensor([[LN(1.5), LN(1.5)], [LN(1.0), LN(1.0)]], requires_grad=True)
    mask = torch.ones(2, 2)
    loss, stats = clipped_surrogate_loss(logp, torch.zeros(2, 2), torch.tensor([1.0, 1.0]), mask, None, level="sequence")
    close(loss, -(1.2 * 2 + 1.0 * 2) / 4)  # one subgroup, token mean
    loss.backward()
    close(logp.grad[0], [0.0, 0.0])
    close(logp.grad[1], [-0.25, -0.25])
    assert stats["clip_frac"] == 0.5


def test_negative_advantage_below_clip_range_gets_no_gradient():
    logp = torch.tensor([[LN(0.5)]], requires_grad=True)
    loss, _ = clipped_surrogate_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), level="token")
    close(loss, 0.8)  # min(-.5, -.8) = -.8
    loss.backward()
    assert logp.grad[0, 0] == 0.0


def test_missing_subgroup_is_skipped_and_empty_mask_is_zero():
    logp, old, mask, adv, _ = example()
    all_with = torch.tensor([True, True])
    loss, _ = clipped_surrogate_loss(logp, old, adv, mask, all_with, level="token")
    close(loss, -(1.2 + 0.9 - 1.1) / 3)  # one subgroup: a plain token mean
    zero, _ = clipped_surrogate_loss(logp, old, adv, torch.zeros(2, 2), all_with)
    assert float(zero.detach()) == 0.0
    zero.backward()
    close(logp.grad, torch.zeros(2, 2))


def test_shape_and_level_errors():
    logp, old, mask, adv, we = example()
    with pytest.raises(ValueError):
        clipped_surrogate_loss(logp, old, adv, mask, we, level="bogus")
    with pytest.raises(ValueError):
        clipped_surrogate_loss(logp, old[:1], adv, mask, we)
    with pytest.raises(ValueError):
        cispo_loss(logp, old, adv[:1], mask)


def slow_surrogate(logp, old, adv, mask, with_exp, eps, level):
    n, t = len(logp), len(logp[0])
    obj = [[0.0] * t for _ in range(n)]
    for i in range(n):
        if level == "sequence":
            toks = [logp[i][k] - old[i][k] for k in range(t) if mask[i][k]]
            seq_rho = math.exp(sum(toks) / len(toks)) if toks else 1.0
        for k in range(t):
            rho = math.exp(logp[i][k] - old[i][k]) if level == "token" else seq_rho
            obj[i][k] = min(rho * adv[i], min(max(rho, 1 - eps), 1 + eps) * adv[i])
    parts = []
    for kind in (True, False):
        vals = [obj[i][k] for i in range(n) for k in range(t) if mask[i][k] and with_exp[i] == kind]
        if vals:
            parts.append(sum(vals) / len(vals))
    return -sum(parts) / len(parts) if parts else 0.0


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_surrogate_matches_slow_reference(seed, level):
    gen = torch.Generator().manual_seed(seed)
    n, t = 9, 12
    old = -torch.rand(n, t, generator=gen) * 3
    logp = old + torch.randn(n, t, generator=gen) * 0.3
    mask = (torch.rand(n, t, generator=gen) < 0.7).float()
    mask[0] = 0.0  # a sequence with no loss tokens
    adv = torch.randn(n, generator=gen)
    we = torch.rand(n, generator=gen) < 0.5
    loss, _ = clipped_surrogate_loss(logp, old, adv, mask, we, eps=0.2, level=level)
    want = slow_surrogate(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), we.tolist(), 0.2, level)
    assert float(loss) == pytest.approx(want, abs=1e-5)


def test_surrogate_is_policy_gradient_at_ratio_one():
    # At logp == logp_old the gradient of the surrogate is the plain policy gradient -A/n per token.
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    mask = torch.ones(2, 3)
    loss, _ = clipped_surrogate_loss(logp, logp.detach().clone(), torch.tensor([2.0, -1.0]), mask, None, level="token")
    loss.backward()
    close(logp.grad, [[-2 / 6] * 3, [1 / 6] * 3])


# ---------------------------------------------------------------- CISPO

def test_cispo_by_hand_and_clipped_token_keeps_gradient():
    logp = torch.tensor([[LN(1.5), LN(0.9)], [LN(1.05), LN(0.5)]], requires_grad=True)
    old = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss = cispo_loss(logp, old, adv, mask, eps_low=0.1, eps_high=0.1)
    # weights: 1.5 -> 1.1 (clipped), .9 -> .9, 1.05 -> 1.05
    want = -(1.1 * 1 * LN(1.5) + 0.9 * 1 * LN(0.9) + 1.05 * -2 * LN(1.05)) / 3
    close(loss, want)
    loss.backward()
    close(logp.grad, [[-1.1 / 3, -0.9 / 3], [2.1 / 3, 0.0]])
    assert logp.grad[0, 0] != 0.0  # the clipped token still learns, with the clipped weight
    st = cispo_stats(logp, old, mask)
    assert st["clip_frac"] == pytest.approx(1 / 3)


def test_cispo_empty_mask():
    logp = torch.zeros(2, 2, requires_grad=True)
    loss = cispo_loss(logp, torch.zeros(2, 2), torch.ones(2), torch.zeros(2, 2))
    assert float(loss.detach()) == 0.0
    loss.backward()


@pytest.mark.parametrize("seed", range(5))
def test_cispo_matches_slow_reference_value_and_gradient(seed):
    gen = torch.Generator().manual_seed(seed)
    n, t = 7, 10
    old = -torch.rand(n, t, generator=gen) * 3
    logp = (old + torch.randn(n, t, generator=gen) * 0.3).requires_grad_(True)
    mask = (torch.rand(n, t, generator=gen) < 0.6).float()
    adv = torch.randn(n, generator=gen)
    lo, hi = 0.1, 0.2
    loss = cispo_loss(logp, old, adv, mask, eps_low=lo, eps_high=hi)
    loss.backward()
    lp, od, m, a = logp.tolist(), old.tolist(), mask.tolist(), adv.tolist()
    total = sum(sum(row) for row in m)
    val = 0.0
    grad = [[0.0] * t for _ in range(n)]
    for i in range(n):
        for k in range(t):
            if m[i][k]:
                w = min(max(math.exp(lp[i][k] - od[i][k]), 1 - lo), 1 + hi)
                val -= w * a[i] * lp[i][k] / total
                grad[i][k] = -w * a[i] / total
    assert float(loss.detach()) == pytest.approx(val, abs=1e-5)
    close(logp.grad, grad)

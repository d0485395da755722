"""core/advantages.py against hand-computed numbers and slow, obvious loop references."""
from __future__ import annotations

import math
import statistics

import pytest
import torch

from core.advantages import (
    batch_subgroup_advantages,
    count_aware_weights,
    entry_rewards,
    experience_free_baseline,
    extractor_advantages,
    signed_outcomes,
    subgroup_advantages,
    weights_for_entries,
)

T, F = True, False
EPS = 1e-6


def close(a, b, tol=1e-5):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, atol=tol, rtol=0), (a.tolist(), b.tolist())


# ---------------------------------------------------------------- subgroup advantages, by hand

def test_subgroup_std_normalised_by_hand():
    r = torch.tensor([1.0, 0, 1, 1, 0, 0, 1, 0])
    w = torch.tensor([T, T, T, T, F, F, F, F])
    # with: [1,0,1,1] mean .75, unbiased var (3*.0625+.5625)/3 = .25, std .5
    # without: [0,0,1,0] mean .25, std .5
    s = 0.5 + EPS
    close(subgroup_advantages(r, w), [0.25 / s, -0.75 / s, 0.25 / s, 0.25 / s, -0.25 / s, -0.25 / s, 0.75 / s, -0.25 / s])


def test_subgroup_mean_only_by_hand():
    r = torch.tensor([1.0, 0, 1, 1, 0, 0, 1, 0])
    w = torch.tensor([T, T, T, T, F, F, F, F])
    close(subgroup_advantages(r, w, normalize_std=False), [0.25, -0.75, 0.25, 0.25, -0.25, -0.25, 0.75, -0.25])


def test_joint_normalisation_by_hand():
    r = torch.tensor([1.0, 0, 1, 1, 0, 0, 1, 0])
    w = torch.tensor([T, T, T, T, F, F, F, F])
    std = math.sqrt(2 / 7)  # mean .5, eight deviations of ±.5, unbiased
    a = 0.5 / (std + EPS)
    close(subgroup_advantages(r, w, joint=True), [a, -a, a, a, -a, -a, a, -a])
    close(subgroup_advantages(r, w, joint=True, normalize_std=False), [0.5, -0.5, 0.5, 0.5, -0.5, -0.5, 0.5, -0.5])


def test_size_one_subgroup_gets_zero():
    r = torch.tensor([1.0, 0.0, 1.0])
    w = torch.tensor([T, F, F])
    s = math.sqrt(0.5) + EPS
    close(subgroup_advantages(r, w), [0.0, -0.5 / s, 0.5 / s])
    close(subgroup_advantages(r, w, normalize_std=False), [0.0, -0.5, 0.5])
    # A group of one (joint) and an all-one-kind group of one.
    close(subgroup_advantages(torch.tensor([3.0]), torch.tensor([T])), [0.0])
    close(subgroup_advantages(torch.tensor([3.0]), torch.tensor([T]), joint=True), [0.0])


def test_identical_rewards_give_zero_not_nan():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0])
    w = torch.tensor([T, T, F, F])
    close(subgroup_advantages(r, w), [0.0, 0.0, 0.0, 0.0])


def test_plain_grpo_is_one_subgroup():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    w = torch.tensor([F, F, F, F])
    std = statistics.stdev([1, 0, 0, 1])
    close(subgroup_advantages(r, w), [(x - 0.5) / (std + EPS) for x in [1, 0, 0, 1]])


def test_batch_by_hand_with_unsorted_negative_group_ids():
    r = torch.tensor([1.0, 5.0, 0.0, 7.0, 1.0, 5.0])
    w = torch.tensor([T, T, T, F, F, T])
    g = torch.tensor([-3, 9, -3, 9, -3, 9])
    # group -3: with {1,0} -> ±.5/std(.7071); without {1} -> 0
    # group 9: with {5,5} -> 0, 0; without {7} -> 0
    s = math.sqrt(0.5) + EPS
    close(batch_subgroup_advantages(r, w, g), [0.5 / s, 0.0, -0.5 / s, 0.0, 0.0, 0.0])
    # joint: group -3 = {1,0,1} mean 2/3, std sqrt(1/3); group 9 = {5,7,5} mean 17/3, std sqrt(4/3)
    s1, s2 = math.sqrt(1 / 3) + EPS, math.sqrt(4 / 3) + EPS
    close(
        batch_subgroup_advantages(r, w, g, joint=True),
        [(1 / 3) / s1, (5 - 17 / 3) / s2, (-2 / 3) / s1, (7 - 17 / 3) / s2, (1 / 3) / s1, (5 - 17 / 3) / s2],
    )


def test_shape_errors():
    with pytest.raises(ValueError):
        subgroup_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.bool))
    with pytest.raises(ValueError):
        batch_subgroup_advantages(torch.zeros(3), torch.zeros(3, dtype=torch.bool), torch.zeros(2))


# ---------------------------------------------------------------- against a slow loop reference

def slow_batch(rewards, with_exp, groups, normalize_std=True, eps=EPS, joint=False):
    out = [0.0] * len(rewards)
    for gid in set(groups):
        kinds = [None] if joint else [True, False]
        for kind in kinds:
            idx = [i for i in range(len(rewards)) if groups[i] == gid and (joint or with_exp[i] == kind)]
            if len(idx) < 2:
                continue
            vals = [rewards[i] for i in idx]
            mu = sum(vals) / len(vals)
            sd = statistics.stdev(vals)
            for i in idx:
                out[i] = (rewards[i] - mu) / (sd + eps) if normalize_std else rewards[i] - mu
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("joint", [True, False])
def test_batch_matches_slow_reference(seed, normalize_std, joint):
    gen = torch.Generator().manual_seed(seed)
    n = 40
    rewards = torch.randint(0, 2, (n,), generator=gen).float() if seed % 2 else torch.randn(n, generator=gen)
    with_exp = torch.rand(n, generator=gen) < 0.5
    groups = torch.randint(0, 7, (n,), generator=gen)
    got = batch_subgroup_advantages(rewards, with_exp, groups, normalize_std=normalize_std, joint=joint)
    want = slow_batch(rewards.tolist(), with_exp.tolist(), groups.tolist(), normalize_std, EPS, joint)
    close(got, want, tol=1e-4)
    # The one-group function is the batch one restricted to a group.
    sel = groups == groups[0]
    close(
        subgroup_advantages(rewards[sel], with_exp[sel], normalize_std=normalize_std, joint=joint),
        [want[i] for i in range(n) if bool(sel[i])],
        tol=1e-4,
    )


# ---------------------------------------------------------------- extractor advantages and Eq. 7

def test_extractor_advantages_by_hand():
    r = torch.tensor([1.0, -1.0, 0.0, 1.0])  # mean .25
    close(extractor_advantages(r), [0.75, -1.25, -0.25, 0.75])
    close(extractor_advantages(r, torch.tensor([1.0, 0.5, 0.0, 2.0])), [0.75, -0.625, 0.0, 1.5])
    assert extractor_advantages(torch.zeros(0)).numel() == 0


@pytest.mark.parametrize("seed", range(4))
def test_extractor_advantages_slow_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(17, generator=gen)
    w = torch.rand(17, generator=gen)
    mu = sum(r.tolist()) / 17
    close(extractor_advantages(r, w), [(x - mu) * y for x, y in zip(r.tolist(), w.tolist())])


def test_count_aware_weights_by_hand():
    counts = torch.tensor([0, 1, 3, 0, 2])
    since = torch.tensor([math.inf, 0, 2, 1, 5])
    close(count_aware_weights(counts, since), [1.0, 0.0, 0.5, 1.0, 3 ** -0.5])  # Eq. 7, δ=1, α=.5
    close(count_aware_weights(counts, since, cooldown=3), [1.0, 0.0, 0.0, 0.0, 3 ** -0.5])
    close(count_aware_weights(counts, since, alpha=1.0), [1.0, 0.0, 0.25, 1.0, 1 / 3])
    close(count_aware_weights(counts, since, alpha=0.0, cooldown=0), [1.0, 1.0, 1.0, 1.0, 1.0])


@pytest.mark.parametrize("seed", range(4))
def test_count_aware_weights_slow_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 10, (30,), generator=gen)
    since = torch.randint(0, 5, (30,), generator=gen).float()
    since[::4] = math.inf
    alpha, cooldown = 0.3 + seed * 0.2, seed % 3
    want = [0.0 if s < cooldown else (1 + c) ** -alpha for c, s in zip(counts.tolist(), since.tolist())]
    close(count_aware_weights(counts, since, alpha=alpha, cooldown=cooldown), want)


def test_weights_for_entries_by_id():
    w = weights_for_entries([7, 8, 9, 7], {7: 3, 8: 1}, {7: 4, 8: 10}, current_step=10)
    # 7: trained 3 times, 6 steps ago -> 4^-.5; 8: trained at this step -> cooldown 0; 9: never -> 1
    close(w, [0.5, 0.0, 1.0, 0.5])
    assert not torch.all(w == 1.0)


# ---------------------------------------------------------------- entry rewards

def test_signed_outcomes():
    close(signed_outcomes(torch.tensor([1.0, 0.0, -1.0, 0.5])), [1.0, -1.0, -1.0, 0.5])


def test_entry_rewards_by_hand():
    retrieved = [[1], [1, 2], [2], [], [3, 3]]
    outcomes = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])  # signed: 1, -1, -1, 1, 1
    assert entry_rewards(retrieved, outcomes) == pytest.approx({1: 0.0, 2: -1.0, 3: 1.0})
    base = torch.tensor([0.5, 0.5, -1.0, 0.0, 0.0])
    # relative: episode improvements .5, -1.5, 0, 1, 1
    assert entry_rewards(retrieved, outcomes, baselines=base) == pytest.approx({1: -0.5, 2: -0.75, 3: 1.0})
    with pytest.raises(ValueError):
        entry_rewards([[1]], torch.tensor([1.0, 0.0]))


def test_experience_free_baseline_by_hand():
    outcomes = torch.tensor([1.0, 0, 1, 0, 1, 1, 0, 1])
    with_exp = torch.tensor([T, T, F, F, T, F, F, F])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    # group 0 free: signed 1, -1 -> 0; group 1 free: 1, -1, 1 -> 1/3
    close(experience_free_baseline(outcomes, with_exp, groups), [0, 0, 0, 0, 1 / 3, 1 / 3, 1 / 3, 1 / 3])
    # a group with no experience-free episode has baseline 0
    close(experience_free_baseline(torch.tensor([1.0]), torch.tensor([T]), torch.tensor([4])), [0.0])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("relative", [False, True])
def test_entry_rewards_slow_reference(seed, relative):
    gen = torch.Generator().manual_seed(seed)
    e = 25
    outcomes = torch.randint(0, 2, (e,), generator=gen).float()
    with_exp = torch.rand(e, generator=gen) < 0.5
    groups = torch.randint(0, 4, (e,), generator=gen)
    retrieved = [[int(x) for x in torch.randint(0, 6, (int(k),), generator=gen)] for k in torch.randint(0, 3, (e,), generator=gen)]
    base = experience_free_baseline(outcomes, with_exp, groups) if relative else None
    got = entry_rewards(retrieved, outcomes, baselines=base)
    want = {}
    for m in range(6):
        vals = []
        for i in range(e):
            if m in retrieved[i]:
                o = 1.0 if outcomes[i] == 1 else -1.0
                if relative:
                    free = [1.0 if outcomes[j] == 1 else -1.0 for j in range(e) if groups[j] == groups[i] and not with_exp[j]]
                    o -= sum(free) / len(free) if free else 0.0
                vals.append(o)
        if vals:
            want[m] = sum(vals) / len(vals)
    assert got == pytest.approx(want, abs=1e-5)


def test_critic_entry_rewards_hand_computed():
    from core.advantages import critic_entry_rewards

    # ep0 succeeded and showed 1 (accepted) and hid 2 (rejected); ep1 failed and showed 1 (refined)
    r = critic_entry_rewards([{1: 1.0, 2: 0.0}, {1: 0.5}], [[1], [1]], torch.tensor([1.0, 0.0]))
    assert r == {1: ((1.0 + 1.0) + (0.5 - 1.0)) / 2, 2: 0.0}
    with pytest.raises(ValueError, match="align"):
        critic_entry_rewards([{1: 1.0}], [[1], [2]], torch.tensor([1.0, 0.0]))

"""Advantages for the actor (GRPO with split subgroups) and the extractor (CISPO, Eq. 7).

Pure tensor math (DESIGN.md habit 3): free functions of tensors and scalars, no model, store or
config. Shapes are given in the comments; N is the number of samples in a batch.

Actor (docs/method.md, "Actor objective"): for each task a group of K rollouts, half with retrieved
experience and half without. Advantages are normalised within each subgroup separately:

    A_i = (r_i - mean_c) / (std_c + eps),   c in {with, without}

because normalising across both subgroups together collapses training (experience-guided rollouts
win every comparison and the others only ever get a negative advantage). `joint=True` is that
ablation. The released code subtracts the mean only: `normalize_std=False`.

Extractor (docs/method.md, "Extractor objective"): one sample per retrieved entry, the reward is the mean
±1 outcome of the episodes that retrieved it, the baseline is the batch mean, and the advantage is
multiplied by the training-count-aware weight of Eq. 7.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

__all__ = [
    "subgroup_advantages",
    "batch_subgroup_advantages",
    "extractor_advantages",
    "count_aware_weights",
    "signed_outcomes",
    "experience_free_baseline",
    "entry_rewards",
    "critic_entry_rewards",
    "weights_for_entries",
]


def _segment_normalise(rewards: Tensor, keys: Tensor, *, normalize_std: bool, eps: float) -> Tensor:
    """Normalise `rewards` within each segment of equal `keys`; segments of size < 2 get 0.

    rewards (N,) float, keys (N,) int. Vectorised with scatter-adds so that a batch of many groups
    costs one pass, not a Python loop per group.
    """
    r = rewards.to(torch.float64)  # (N,) — float64 so the two-pass variance is exact enough
    _, inv = torch.unique(keys, return_inverse=True)  # inv (N,) in [0, S)
    num_seg = int(inv.max().item()) + 1 if inv.numel() else 0
    counts = torch.zeros(num_seg, dtype=torch.float64, device=r.device).scatter_add_(0, inv, torch.ones_like(r))  # (S,)
    sums = torch.zeros(num_seg, dtype=torch.float64, device=r.device).scatter_add_(0, inv, r)  # (S,)
    mean = sums / counts.clamp(min=1)  # (S,)
    centred = r - mean[inv]  # (N,)
    if normalize_std:
        sq = torch.zeros(num_seg, dtype=torch.float64, device=r.device).scatter_add_(0, inv, centred * centred)
        std = (sq / (counts - 1).clamp(min=1)).sqrt()  # (S,) unbiased, as torch.std's default
        adv = centred / (std[inv] + eps)
    else:
        adv = centred
    adv = torch.where(counts[inv] >= 2, adv, torch.zeros_like(adv))  # a lone sample has no baseline
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def subgroup_advantages(
    rewards: Tensor,
    with_experience: Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    joint: bool = False,
) -> Tensor:
    """Advantages for one task's group, normalised within the with- and without-experience subgroups.

    rewards (G,) float, with_experience (G,) bool -> (G,) float.
    Each subgroup: (r - mean) / (std + eps) with torch's default unbiased std, or r - mean when
    `normalize_std=False`; a subgroup with fewer than 2 members gets 0. `joint=True` normalises the
    whole group together (the ablation docs/method.md says collapses).
    """
    if rewards.shape != with_experience.shape or rewards.dim() != 1:
        raise ValueError(f"rewards and with_experience must both be (G,), got {tuple(rewards.shape)} and {tuple(with_experience.shape)}")
    keys = torch.zeros_like(with_experience, dtype=torch.long) if joint else with_experience.to(torch.long)
    return _segment_normalise(rewards, keys, normalize_std=normalize_std, eps=eps)


def batch_subgroup_advantages(
    rewards: Tensor,
    with_experience: Tensor,
    group_ids: Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    joint: bool = False,
) -> Tensor:
    """`subgroup_advantages` over a batch of many tasks' groups at once.

    rewards (N,) float, with_experience (N,) bool, group_ids (N,) int (any values; samples with the
    same id form one task's group, in any order) -> (N,) float.
    """
    if not (rewards.shape == with_experience.shape == group_ids.shape) or rewards.dim() != 1:
        raise ValueError(
            "rewards, with_experience and group_ids must all be (N,), got "
            f"{tuple(rewards.shape)}, {tuple(with_experience.shape)}, {tuple(group_ids.shape)}"
        )
    g = group_ids.to(torch.long)
    # One segment per (group, subgroup): shift group ids to be non-negative, then interleave the bit.
    g = g - g.min() if g.numel() else g
    keys = g if joint else g * 2 + with_experience.to(torch.long)
    return _segment_normalise(rewards, keys, normalize_std=normalize_std, eps=eps)


def extractor_advantages(rewards: Tensor, weights: Tensor | None = None) -> Tensor:
    """CISPO advantages for the extractor: (r - mean_batch(r)) · w.

    rewards (N,) float, weights (N,) float or None (all ones) -> (N,). The baseline is the batch mean,
    not a group mean (docs/method.md); `weights` are the Eq. 7 weights of `count_aware_weights`.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (N,), got {tuple(rewards.shape)}")
    if rewards.numel() == 0:
        return rewards.to(torch.float32)
    r = rewards.to(torch.float32)
    adv = r - r.mean()
    if weights is not None:
        if weights.shape != rewards.shape:
            raise ValueError(f"weights must match rewards' shape {tuple(rewards.shape)}, got {tuple(weights.shape)}")
        adv = adv * weights.to(adv.dtype)
    return adv


def count_aware_weights(
    train_counts: Tensor,
    steps_since_trained: Tensor,
    *,
    alpha: float = 0.5,
    cooldown: float = 1,
) -> Tensor:
    """Training-count-aware advantage weights, Eq. 7.

    train_counts (N,) — how many extractor updates each entry's generation has been trained in;
    steps_since_trained (N,) — extractor steps since it was last trained (`inf` if never) -> (N,):

        w = 0                        if steps_since_trained < cooldown   (δ, released: 1)
        w = (1 + train_counts)^(-α)  otherwise                           (released: α = 0.5)
    """
    if train_counts.shape != steps_since_trained.shape:
        raise ValueError(
            f"train_counts and steps_since_trained must have one shape, got {tuple(train_counts.shape)} and {tuple(steps_since_trained.shape)}"
        )
    c = train_counts.to(torch.float32)
    s = steps_since_trained.to(torch.float32)
    w = (1.0 + c).pow(-alpha)  # Eq. 7, second case
    return torch.where(s < cooldown, torch.zeros_like(w), w)  # Eq. 7, cooldown case


def signed_outcomes(outcomes: Tensor) -> Tensor:
    """Map episode outcomes to the extractor's reward scale: a score of 0 becomes -1, others are kept.

    outcomes (E,) -> (E,) float. With binary envs (success 1, failure 0) this is the ±1 of docs/method.md;
    the released code maps 0 to -1 the same way.
    """
    o = outcomes.to(torch.float32)
    return torch.where(o == 0, torch.full_like(o, -1.0), o)


def experience_free_baseline(outcomes: Tensor, with_experience: Tensor, group_ids: Tensor) -> Tensor:
    """Per episode, the mean signed outcome of the without-experience episodes of its group.

    outcomes (E,), with_experience (E,) bool, group_ids (E,) int -> (E,) float; a group with no
    without-experience episode gets baseline 0. Used by the "relative" reward ablation.
    """
    o = signed_outcomes(outcomes)
    g = group_ids.to(torch.long)
    _, inv = torch.unique(g, return_inverse=True)
    num_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    free = (~with_experience.to(torch.bool)).to(torch.float32)
    sums = torch.zeros(num_groups).scatter_add_(0, inv, o * free)
    counts = torch.zeros(num_groups).scatter_add_(0, inv, free)
    base = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
    return base[inv]


def entry_rewards(
    retrieved: Sequence[Sequence[int]],
    outcomes: Tensor,
    *,
    baselines: Tensor | None = None,
) -> dict[int, float]:
    """Reward per experience entry: the mean signed outcome of the episodes that retrieved it.

    retrieved[e] — entry ids shown to episode e (E episodes); outcomes (E,) — episode outcomes
    (0 -> -1, see `signed_outcomes`). Returns {entry_id: reward}, only for entries retrieved at least
    once. With `baselines` (E,) (the "relative" ablation, e.g. `experience_free_baseline`), each
    episode contributes its improvement `signed_outcome - baseline` instead.
    """
    if len(retrieved) != outcomes.numel():
        raise ValueError(f"retrieved has {len(retrieved)} episodes but outcomes has {outcomes.numel()}")
    o = signed_outcomes(outcomes.reshape(-1))
    if baselines is not None:
        if baselines.numel() != o.numel():
            raise ValueError(f"baselines must have one value per episode ({o.numel()}), got {baselines.numel()}")
        o = o - baselines.reshape(-1).to(torch.float32)
    totals: dict[int, float] = {}
    counts: dict[int, int] = {}
    for e, ids in enumerate(retrieved):
        for m in set(int(i) for i in ids):  # an entry shown twice in one episode counts once for it
            totals[m] = totals.get(m, 0.0) + float(o[e])
            counts[m] = counts.get(m, 0) + 1
    return {m: totals[m] / counts[m] for m in totals}


def critic_entry_rewards(
    judged: Sequence[dict[int, float]],
    shown: Sequence[Sequence[int]],
    outcomes: Tensor,
    *,
    baselines: Tensor | None = None,
) -> dict[int, float]:
    """Entry rewards with the actor as critic (docs/method.md): score + signed outcome, averaged per entry.

    judged[e] — {entry id: critic score in {1, 0.5, 0}} of episode e; shown[e] — the entries episode e
    then used. A rejected entry was not shown, so the outcome says nothing about it: its reward is its
    score alone (0). `baselines` as in `entry_rewards`.
    """
    if not len(judged) == len(shown) == outcomes.numel():
        raise ValueError(f"judged ({len(judged)}), shown ({len(shown)}) and outcomes ({outcomes.numel()}) must align")
    o = signed_outcomes(outcomes.reshape(-1))
    if baselines is not None:
        o = o - baselines.reshape(-1).to(torch.float32)
    totals: dict[int, float] = {}
    counts: dict[int, int] = {}
    for e, (scores, ids) in enumerate(zip(judged, shown)):
        used = set(int(i) for i in ids)
        for m, score in scores.items():
            m = int(m)
            totals[m] = totals.get(m, 0.0) + float(score) + (float(o[e]) if m in used else 0.0)
            counts[m] = counts.get(m, 0) + 1
    return {m: totals[m] / counts[m] for m in totals}


def weights_for_entries(
    entry_ids: Sequence[int],
    train_counts: Mapping[int, int],
    last_trained_step: Mapping[int, int | None],
    current_step: int,
    *,
    alpha: float = 0.5,
    cooldown: float = 1,
) -> Tensor:
    """Eq. 7 weights looked up by entry id (the authors' release looked them up by the wrong key).

    entry_ids (N,) — the samples' entries; train_counts / last_trained_step — by entry id (missing or
    None = never trained); current_step — the extractor update about to run -> (N,) float.
    """
    counts = torch.tensor([float(train_counts.get(m, 0)) for m in entry_ids], dtype=torch.float32)
    since = torch.tensor(
        [
            float("inf") if last_trained_step.get(m) is None else float(current_step - int(last_trained_step[m]))  # type: ignore[arg-type]
            for m in entry_ids
        ],
        dtype=torch.float32,
    )
    return count_aware_weights(counts, since, alpha=alpha, cooldown=cooldown)

"""The actor learner: GRPO with split subgroups (docs/method.md "Actor objective").

    stats = actor_update(backend, optimizer, episodes, loss_cfg, model_cfg)

1. Advantages per task group, normalised within the with-experience and without-experience
   subgroups separately (core.advantages; the joint ablation is a switch).
2. Every actor turn of an episode is one row (prompt ids + reply ids, loss on the reply only).
   Rows of zero-advantage episodes are kept for the denominators but never run forward: their
   objective and gradient are exactly zero, yet docs/method.md (like every TRL loss type) counts their
   tokens, and their episodes, in their subgroup's mean; dropping them would up-weight the rest.
3. Clipped surrogate (core.losses), token mean within each subgroup over the WHOLE batch, then the
   mean over the two subgroups: micro-batches hold one subgroup each and are weighted by their share
   of that subgroup's tokens, so gradient accumulation gives exactly the full-batch objective.
   With `loss.aggregation = "episode"` each episode weighs the same within its subgroup: a row's
   advantage is scaled by (subgroup tokens / subgroup episodes) / (its episode's tokens), which is
   exact because the clipped objective is positively homogeneous in A.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from core.advantages import batch_subgroup_advantages
from core.losses import clipped_surrogate_loss
from trainers.backends.logprobs import row_logprobs
from trainers.models import pad_right
from trainers.rollout import Episode


@dataclass
class Row:
    ids: list[int]  # prompt + reply
    start: int  # first reply position in ids
    old: list[float]  # (len(reply),) sampling-time log-probs
    adv: float
    with_exp: bool
    episode: int = 0  # index of its episode in the batch


def episode_advantages(episodes: Sequence[Episode], *, normalize_std: bool, joint: bool, reward: str = "env") -> torch.Tensor:
    if reward == "outcome":
        rewards = torch.tensor([1.0 if e.success else -1.0 for e in episodes], dtype=torch.float32)  # (E,)
    else:
        rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float32)  # (E,)
    with_exp = torch.tensor([e.spec.with_experience for e in episodes], dtype=torch.bool)  # (E,)
    groups = torch.tensor([e.spec.group_id for e in episodes], dtype=torch.long)  # (E,)
    return batch_subgroup_advantages(rewards, with_exp, groups, normalize_std=normalize_std, joint=joint)


def build_rows(episodes: Sequence[Episode], adv: torch.Tensor) -> list[Row]:
    """One row per actor turn with a reply, zero-advantage ones included (they count in the denominators)."""
    rows = []
    for i, (e, a) in enumerate(zip(episodes, adv.tolist())):
        for t in e.turns:
            if not t.response_ids:
                continue
            rows.append(Row(t.prompt_ids + t.response_ids, len(t.prompt_ids), t.logprobs, a, e.spec.with_experience, i))
    return rows


def weight_by_episode(rows: list[Row]) -> list[Row]:
    """Rescale advantages so that the subgroup's token mean weighs every episode equally.

    The subgroup's tokens and episodes include its zero-advantage episodes (rows with adv 0)."""
    out = []
    for flag in (True, False):
        g = [r for r in rows if r.with_exp == flag]
        if not g:
            continue
        ep_tok: dict[int, int] = {}
        for r in g:
            ep_tok[r.episode] = ep_tok.get(r.episode, 0) + len(r.ids) - r.start
        per_episode = sum(ep_tok.values()) / len(ep_tok)
        out += [Row(r.ids, r.start, r.old, r.adv * per_episode / ep_tok[r.episode], r.with_exp, r.episode) for r in g]
    return out


def reply_tensors(rows: Sequence[tuple[Sequence[int], Sequence[int], Sequence[float]]],
                  pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The learners' one batch builder (the actor's GRPO step here, the extractor's CISPO step in
    trainers/extractor.py): (prompt ids, reply ids, sampling-time reply log-probs) rows -> ids (N, T)
    right-padded, attention (N, T), loss mask (N, T) that is 1 on reply tokens only, old log-probs (N, T)
    at the reply positions (0 elsewhere)."""
    ids, attn = pad_right([list(p) + list(r) for p, r, _ in rows], pad_id)
    mask = torch.zeros_like(ids, dtype=torch.float32)
    old = torch.zeros_like(ids, dtype=torch.float32)
    for i, (p, r, o) in enumerate(rows):
        a, n = len(p), len(r)
        mask[i, a:a + n] = 1.0
        old[i, a:a + n] = torch.tensor(o[:n], dtype=torch.float32)
    return ids, attn, mask, old


def _tensors(rows: Sequence[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`reply_tensors` of actor rows: ids (N, T), attention (N, T), loss mask (N, T), old log-probs (N, T)."""
    return reply_tensors([(r.ids[:r.start], r.ids[r.start:], r.old) for r in rows], pad_id)


def _learner_autocast(backend):
    """bf16 autocast around the learner's forward on a CPU (actor.cpu_bf16_autocast): matmuls in bf16, the
    log-softmax in fp32. Faster on CPUs with bf16 units; the ratio to the fp32 sampling log-probs then
    carries bf16 rounding (~1e-2 per token), so it is off by default."""
    if getattr(backend, "autocast_bf16", False) and backend.device.type == "cpu":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def policy_gradient(backend, rows: Sequence[Row], loss_cfg, micro_batch: int) -> dict[str, float]:
    """Accumulate the gradient of the full-batch objective into .grad, micro-batch by micro-batch.

    Denominators (a subgroup's tokens, the number of subgroups) count every row; only rows with a
    non-zero advantage run forward, since the others add exactly 0 to the objective and its gradient.
    The kl/clip/ratio diagnostics are averaged over the rows that ran."""
    subgroups = [g for g in ([r for r in rows if r.with_exp], [r for r in rows if not r.with_exp]) if g]
    tokens = [sum(len(r.ids) - r.start for r in g) for g in subgroups]
    live = [[r for r in g if r.adv != 0.0] for g in subgroups]
    n_live = sum(1 for g in live if g)
    total_loss, ent_sum, ent_n = 0.0, 0.0, 0
    kl = clip = ratio = 0.0
    for g, n_tok in zip(live, tokens):
        g_tok = sum(len(r.ids) - r.start for r in g)
        g = sorted(g, key=lambda r: len(r.ids))  # similar lengths per micro-batch: less padding
        for s in range(0, len(g), micro_batch):
            mb = g[s:s + micro_batch]
            ids, attn, mask, old = _tensors(mb, backend.pad_id)
            with _learner_autocast(backend):
                logp, ent = row_logprobs(backend, ids, attn, mask, entropy=True)  # (N, T) each, 0 off the mask
            mask_d, old_d = mask.to(backend.device), old.to(backend.device)
            a = torch.tensor([r.adv for r in mb], dtype=torch.float32, device=backend.device)  # (N,)
            loss_mb, st = clipped_surrogate_loss(logp, old_d, a, mask_d, None, eps=loss_cfg.eps, level=loss_cfg.ratio_level)
            share = float(mask.sum()) / n_tok
            # token mean within this subgroup over the whole batch, then the mean over subgroups (docs/method.md)
            loss = loss_mb * share / len(subgroups)
            loss.backward()
            total_loss += float(loss.detach())
            seen = float(mask.sum()) / g_tok / n_live
            kl += st["approx_kl"] * seen
            clip += st["clip_frac"] * seen
            ratio += st["ratio_mean"] * seen
            ent_sum += float((ent * mask_d).sum())
            ent_n += int(mask_d.sum())
    return {"policy/loss": total_loss, "policy/kl_to_old": kl, "policy/clip_frac": clip, "policy/ratio_mean": ratio,
            "policy/entropy": ent_sum / max(1, ent_n)}


def warmed_lr(optimizer: torch.optim.Optimizer, lr: float, warmup: int) -> float:
    """Set and return the learning rate of the optimiser's next step: linear warm-up over `warmup` steps,
    counted by the optimiser's own step count (so a resumed run continues where it was)."""
    state = next((optimizer.state[p] for g in optimizer.param_groups for p in g["params"] if p in optimizer.state), {})
    done = int(state.get("step", 0))
    value = lr * min(1.0, (done + 1) / warmup) if warmup > 0 else lr
    for g in optimizer.param_groups:
        g["lr"] = value
    return value


def actor_update(backend, optimizer: torch.optim.Optimizer, episodes: Sequence[Episode], loss_cfg, model_cfg) -> dict[str, float]:
    """One optimiser step per epoch on a batch of episodes; returns policy/* metrics."""
    adv = episode_advantages(episodes, normalize_std=loss_cfg.normalize_std, joint=loss_cfg.joint_normalization,
                             reward=loss_cfg.reward)
    rows = build_rows(episodes, adv)
    if loss_cfg.aggregation == "episode":
        rows = weight_by_episode(rows)
    live = [r for r in rows if r.adv != 0.0]  # the rows that run forward (the others only count in denominators)
    stats: dict[str, float] = {"policy/frac_nonzero_adv": float((adv != 0).float().mean()) if len(adv) else 0.0,
                               "policy/rows": float(len(live)), "policy/tokens": float(sum(len(r.ids) for r in live)),
                               "policy/adv_abs_mean": float(adv.abs().mean()) if len(adv) else 0.0}
    if not live:
        stats.update({"policy/loss": 0.0, "policy/grad_norm": 0.0, "policy/skipped": 1.0})
        return stats
    params = list(backend.trainable_parameters())
    backend.model.train()
    try:
        for _ in range(max(1, loss_cfg.epochs)):
            lr = warmed_lr(optimizer, model_cfg.lr, model_cfg.lr_warmup)
            optimizer.zero_grad(set_to_none=True)
            stats.update(policy_gradient(backend, rows, loss_cfg, model_cfg.micro_batch))
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, model_cfg.grad_clip))
            optimizer.step()
        stats["policy/lr"] = lr
    finally:
        backend.model.eval()
    stats["policy/grad_norm"] = grad_norm if math.isfinite(grad_norm) else -1.0
    stats["policy/skipped"] = 0.0
    return stats

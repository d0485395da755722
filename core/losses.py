"""Policy-gradient losses: the actor's clipped surrogate and the extractor's CISPO objective.

Pure tensor math (DESIGN.md habit 3). Shapes: N sequences, T token positions (right-padded);
`logp` and `logp_old` are per-token log-probabilities of the sequence's own tokens, (N, T);
`mask` (N, T) is 1 on the tokens that carry loss (actor- or extractor-generated tokens only, never
observations, experience text or tool results) and 0 elsewhere; `advantages` is (N,), one per
sequence. Both functions return a loss to *minimise* (the negated objective).
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["clipped_surrogate_loss", "cispo_loss", "cispo_stats"]


def _check_shapes(logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor) -> None:
    if logp.dim() != 2 or logp.shape != logp_old.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp, logp_old and mask must all be (N, T), got {tuple(logp.shape)}, {tuple(logp_old.shape)}, {tuple(mask.shape)}"
        )
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be (N,) = ({logp.shape[0]},), got {tuple(advantages.shape)}")


def clipped_surrogate_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    with_experience: Tensor | None = None,
    *,
    eps: float = 0.2,
    level: str = "sequence",
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with the with/without-experience subgroup averaging of docs/method.md.

    logp, logp_old, mask (N, T); advantages (N,); with_experience (N,) bool or None (one subgroup).

    Per token: obj = min(ρ·A, clip(ρ, 1-ε, 1+ε)·A), where
      - level="token":    ρ_{i,t} = exp(logp_{i,t} - logp_old_{i,t})  (the released code);
      - level="sequence": ρ_i = exp(mean_t over the mask of (logp - logp_old)), the same for every
        token of sequence i (the paper's sequence-level ratio, length-normalised as in GSPO so that
        long replies do not get exponentially extreme ratios).
    The objective is averaged over the masked tokens of each subgroup, then over the subgroups that
    have any masked token (a missing subgroup is skipped, so plain GRPO is the one-subgroup case).
    With a sequence-level ratio, the token average weights each sequence by its length.

    Returns (loss, stats) with stats {clip_frac, approx_kl, ratio_mean} as floats: the share of
    masked tokens whose ratio is outside [1-ε, 1+ε], the k3 estimate mean(ρ_t - 1 - log ρ_t) of
    KL(old || new) over masked tokens, and the mean ratio (over masked tokens or over sequences).
    """
    _check_shapes(logp, logp_old, advantages, mask)
    if level not in ("sequence", "token"):
        raise ValueError(f"level must be 'sequence' or 'token', got {level!r}")
    m = mask.to(logp.dtype)  # (N, T)
    log_ratio = (logp - logp_old.detach()) * m  # (N, T); 0 off the mask
    tokens_per_seq = m.sum(-1)  # (N,)
    if level == "token":
        log_rho = log_ratio  # (N, T)
    else:
        log_rho_seq = log_ratio.sum(-1) / tokens_per_seq.clamp(min=1)  # (N,)
        log_rho = log_rho_seq[:, None].expand_as(log_ratio)  # (N, T)
    rho = torch.exp(log_rho)  # (N, T)
    adv = advantages.detach().to(logp.dtype)[:, None]  # (N, 1)
    obj = torch.minimum(rho * adv, rho.clamp(1.0 - eps, 1.0 + eps) * adv)  # (N, T)

    if with_experience is None:
        groups = [torch.ones(logp.shape[0], dtype=torch.bool, device=logp.device)]
    else:
        if with_experience.shape != advantages.shape:
            raise ValueError(f"with_experience must be (N,), got {tuple(with_experience.shape)}")
        we = with_experience.to(device=logp.device, dtype=torch.bool)
        groups = [we, ~we]
    per_group = []
    for sel in groups:
        sel_m = m * sel.to(m.dtype)[:, None]  # (N, T)
        n = sel_m.sum()
        if n > 0:
            per_group.append((obj * sel_m).sum() / n)  # token mean within the subgroup
    if per_group:
        loss = -torch.stack(per_group).mean()  # mean over present subgroups
    else:
        loss = (logp * 0.0).sum()  # nothing to learn from; keeps the graph so backward() works

    with torch.no_grad():
        n_tok = m.sum().clamp(min=1)
        outside = ((rho < 1.0 - eps) | (rho > 1.0 + eps)).to(m.dtype) * m
        tok_log_ratio = (logp - logp_old) * m
        k3 = (torch.exp(tok_log_ratio) - 1.0 - tok_log_ratio) * m
        if level == "token":
            ratio_mean = (rho * m).sum() / n_tok
        else:
            has = tokens_per_seq > 0
            ratio_mean = rho[:, 0][has].mean() if bool(has.any()) else torch.ones(())
        stats = {
            "clip_frac": float(outside.sum() / n_tok),
            "approx_kl": float(k3.sum() / n_tok),
            "ratio_mean": float(ratio_mean),
        }
    return loss, stats


def cispo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.1,
    eps_high: float = 0.1,
) -> Tensor:
    """CISPO loss for the extractor (docs/method.md, "Extractor objective").

    logp, logp_old, mask (N, T); advantages (N,) — already multiplied by the Eq. 7 weights.

        loss = -Σ_{i,t} sg(clip(ρ_{i,t}, 1-ε_low, 1+ε_high)) · A_i · logp_{i,t} · mask_{i,t} / Σ mask

    with ρ = exp(logp - logp_old). The importance weight is clipped and detached; the token itself
    is not dropped, so a clipped token still gets the gradient -w·A/Σmask on its log-prob (unlike
    PPO, where it gets none). That is what keeps the heavily off-policy extractor stable.
    """
    _check_shapes(logp, logp_old, advantages, mask)
    m = mask.to(logp.dtype)  # (N, T)
    n = m.sum()
    if n <= 0:
        return (logp * 0.0).sum()
    with torch.no_grad():
        w = torch.exp(logp - logp_old).clamp(1.0 - eps_low, 1.0 + eps_high)  # (N, T), sg(clip(ρ))
    adv = advantages.detach().to(logp.dtype)[:, None]  # (N, 1)
    return -(w * adv * logp * m).sum() / n


def cispo_stats(
    logp: Tensor, logp_old: Tensor, mask: Tensor, *, eps_low: float = 0.1, eps_high: float = 0.1
) -> dict[str, float]:
    """Diagnostics for a CISPO batch: share of masked tokens whose ratio was clipped, k3 KL to old, mean ratio.

    logp, logp_old, mask (N, T).
    """
    with torch.no_grad():
        m = mask.to(logp.dtype)
        n = m.sum().clamp(min=1)
        lr = (logp - logp_old) * m
        rho = torch.exp(lr)
        clipped = ((rho < 1.0 - eps_low) | (rho > 1.0 + eps_high)).to(m.dtype) * m
        return {
            "clip_frac": float(clipped.sum() / n),
            "approx_kl": float(((rho - 1.0 - lr) * m).sum() / n),
            "ratio_mean": float((rho * m).sum() / n),
        }

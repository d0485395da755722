"""The one computation of per-token log-probs of given sequences under an hf model: scoring
(`HFBackend.logprobs`), the actor's GRPO step (trainers/actor_step.py) and the extractor's CISPO step
(trainers/extractor.py) call `row_logprobs` on a backend; the warm start's SFT (trainers/warmstart/sft.py), which
trains a bare model, calls `model_logprobs` with the same switches given explicitly (`forward_switches`).

    logp, ent = row_logprobs(backend, ids, attn, mask, entropy=True)   # ids, attn, mask (N, T) right-padded
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from trainers.backends.common import PREFIX_CACHE_MIN


def forward_switches(model: Any) -> dict[str, Any]:
    """`model_logprobs`'s keywords for a bare hf model (the warm start's SFT), read off it as HFBackend reads its
    own: its device; whether its forward takes `logits_to_keep`; whether this transformers' key/value cache can be
    repeated over rows (the prefix cache); the forward's cache keyword (`cache` in transformers 5, before
    `past_key_values`)."""
    from transformers import DynamicCache

    fwd = inspect.signature(model.forward).parameters
    return {"device": model.device, "logits_to_keep": "logits_to_keep" in fwd,
            "prefix_cache": hasattr(DynamicCache, "batch_repeat_interleave"),
            "cache_kw": "cache" if "cache" in fwd else "past_key_values"}


def shared_prefix(ids: Tensor, mask: Tensor) -> int:
    """How many leading tokens every row has in common, stopping before the position that predicts
    the first masked token (its logits are needed). ids, mask (N, T)."""
    same = (ids == ids[:1]).all(0).long().cumprod(0)  # (T,): 1 while every row agrees
    first = int(mask.any(0).long().argmax())  # the earliest masked position over the rows
    return min(int(same.sum()), max(0, first - 1))


def row_logprobs(backend: Any, ids: Tensor, attn: Tensor, mask: Tensor | None = None, *, temperature: float = 1.0,
                 entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """`model_logprobs` of an HFBackend's model, with the backend's device, cache keyword and its two switches
    (`supports_logits_to_keep`, `prefix_cache`), read at the call: a benchmark may turn them off."""
    return model_logprobs(backend.model, ids, attn, mask, device=backend.device,
                          logits_to_keep=backend.supports_logits_to_keep, prefix_cache=backend.prefix_cache,
                          cache_kw=backend.cache_kw, temperature=temperature, entropy=entropy)


def model_logprobs(model: Any, ids: Tensor, attn: Tensor, mask: Tensor | None = None, *, device: torch.device,
                   logits_to_keep: bool, prefix_cache: bool, cache_kw: str, temperature: float = 1.0,
                   entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """model: an hf causal LM on `device`. ids, attn (N, T) right-padded -> (logp (N, T) with
    logp[:, t] = log p(ids[t] | ids[:t]) under the logits divided by `temperature`, 0 at t = 0 and on padding;
    with entropy=True the entropy (N, T) of each of those predictions, without a graph, else None). logp keeps
    the graph unless the caller runs under no_grad.

    With a loss mask (N, T), two savings that change no number beyond float rounding:
    - only the positions that predict a masked token go through the output layer and the softmax
      (`logits_to_keep`: the model's forward takes that keyword): a turn's prompt is ~200x its reply;
    - the rows' shared leading tokens (the system prompt and task, ~a third of a MiniHack turn) run
      once, as a key/value cache repeated over the rows (`prefix_cache`, passed to the forward as `cache_kw`);
      gradients flow back through it.
    logp and entropy are 0 off the mask then. Without a mask every position is computed."""
    n, t = ids.shape
    ids_d = ids.to(device)
    logits, at, on = _kept_logits(model, ids, attn, mask, device=device, logits_to_keep=logits_to_keep,
                                  prefix_cache=prefix_cache, cache_kw=cache_kw)
    if temperature != 1.0:
        logits = logits / temperature
    lp_all = torch.log_softmax(logits, dim=-1)
    logp = _placed(lp_all.gather(-1, ids_d[:, at, None]).squeeze(-1) * on, at, n, t)
    ent = None
    if entropy:
        with torch.no_grad():
            ent = _placed(-(lp_all.exp() * lp_all).sum(-1) * on, at, n, t)
    return logp, ent


def row_logprobs_kl(backend: Any, reference: Any, ids: Tensor, attn: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """`row_logprobs` of `backend`'s model and, at the same positions, the exact KL(π || π_ref) of each prediction
    over the whole vocabulary against `reference` (an HFBackend on the same device, run without a graph):
    Σ_v π(v) (log π(v) − log π_ref(v)). logp and kl (N, T), 0 off the mask; kl keeps the learner's graph. Unlike an
    estimate at the sampled token, this sees mass moving onto tokens the batch never sampled."""
    n, t = ids.shape
    sw = {"device": backend.device, "logits_to_keep": backend.supports_logits_to_keep}
    logits, at, on = _kept_logits(backend.model, ids, attn, mask, prefix_cache=backend.prefix_cache,
                                  cache_kw=backend.cache_kw, **sw)
    with torch.no_grad():
        ref, _, _ = _kept_logits(reference.model, ids, attn, mask, prefix_cache=reference.prefix_cache,
                                 cache_kw=reference.cache_kw, **sw)
        ref_all = torch.log_softmax(ref, dim=-1)
    lp_all = torch.log_softmax(logits, dim=-1)
    logp = _placed(lp_all.gather(-1, ids.to(backend.device)[:, at, None]).squeeze(-1) * on, at, n, t)
    kl = _placed((lp_all.exp() * (lp_all - ref_all)).sum(-1) * on, at, n, t)
    return logp, kl


def _placed(values: Tensor, at: Tensor, n: int, t: int) -> Tensor:
    """(N, P) values at positions `at` (P,) into an (N, T) tensor of zeros (differentiable)."""
    out = torch.zeros((n, t), device=values.device, dtype=values.dtype)
    return out.index_put((torch.arange(n)[:, None], at[None, :]), values)


def _kept_logits(model: Any, ids: Tensor, attn: Tensor, mask: Tensor | None, *, device: torch.device,
                 logits_to_keep: bool, prefix_cache: bool, cache_kw: str) -> tuple[Tensor, Tensor, Tensor]:
    """The logits (N, P, V) that predict positions `at` (P,), and `on` (N, P): which of them are a row's own
    (masked, or not padding without a mask). model_logprobs' two savings apply here."""
    n, t = ids.shape
    ids_d, attn_d = ids.to(device), attn.to(device)
    if mask is not None and logits_to_keep:
        keep = torch.nonzero(mask[:, 1:].any(0)).squeeze(-1)  # (P,) positions whose next token is masked in some row
        prefix = shared_prefix(ids, mask) if n > 1 and prefix_cache else 0
        kw: dict[str, Any] = {"use_cache": False}
        if prefix >= PREFIX_CACHE_MIN:  # the sampler's threshold too: below it the extra call costs more than it saves
            out = model(input_ids=ids_d[:1, :prefix], use_cache=True)
            cache = getattr(out, "cache", None)  # transformers 5; `past_key_values` before
            if cache is None:
                cache = out.past_key_values
            cache.batch_repeat_interleave(n)  # (1, ...) -> (N, ...), differentiable
            kw = {cache_kw: cache, "use_cache": True}
        else:
            prefix = 0
        logits = model(input_ids=ids_d[:, prefix:], attention_mask=attn_d,
                       logits_to_keep=(keep - prefix).to(device), **kw).logits.float()  # (N, P, V)
        at = keep + 1  # (P,) the positions predicted
        on = mask[:, at].to(device)  # (N, P): the kept positions that are this row's masked tokens
    else:
        logits = model(input_ids=ids_d, attention_mask=attn_d, use_cache=False).logits[:, :-1].float()  # (N, T-1, V)
        at = torch.arange(1, t)
        on = attn_d[:, 1:].float()  # (N, T-1): 0 on padding
    return logits, at, on

"""What every model back end shares: the protocol rollouts and learners talk to, the output and LoRA
containers, the one error type, and the helpers all three engines use (weights files, chat templates,
end tokens, right padding). trainers/models.py picks the back end; this module knows none of them."""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from core.metrics import SYNC_GAP_WARN
from trainers.backends.choices import ActionChoice

PREFIX_CACHE_MIN = 16  # shared prompt tokens below which running them once saves less than the extra call (sampler and learner)


class BackendError(RuntimeError):
    """A model back end cannot be built or asked for this; the message says what to do."""


@dataclass
class GenerationOutput:
    """One completion. token_ids run through the token that ended it (an end token is kept, so the
    learner can train the model to emit it); `text` is decoded without special tokens and cut before
    the first stop string."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float]  # (len(token_ids),) under the raw model: temperature 1, no top-p
    sample_logprobs: list[float] = field(default_factory=list)  # under the sampling distribution; [] if unknown
    finish_reason: str = "length"  # "eos" (an end token), "stop" (a stop string) or "length"


@dataclass
class LoraSettings:
    """LoRA adapters through peft (only the adapters train; the base stays frozen)."""

    r: int = 8  # adapter rank
    alpha: int = 16  # scaling numerator (scale = alpha / r)
    dropout: float = 0.0  # dropout on the adapter input
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")  # module names to adapt


Prompts = Sequence[str] | Sequence[Sequence[int]]
Messages = Sequence[Mapping[str, str]]


@runtime_checkable
class ModelBackend(Protocol):
    """What rollouts and learners may ask of a model, whatever engine serves it."""

    kind: str
    tokenizer: Any  # a transformers tokenizer, or None (openai without a local tokenizer)

    def generate(
        self,
        prompts: Prompts,
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        choices: Sequence[ActionChoice | Sequence[str] | None] | None = None,  # constrained replies (HFBackend.generate)
    ) -> list[GenerationOutput]: ...

    def chat(self, conversations: Sequence[Messages], **generate_kwargs: Any) -> list[GenerationOutput]: ...

    def logprobs(self, sequences: Sequence[Sequence[int]], *, temperature: float = 1.0) -> Tensor: ...

    def apply_chat_template(
        self, messages: Messages, *, add_generation_prompt: bool = True, tokenize: bool = False
    ) -> str | list[int]: ...

    def load_weights(self, weights: Mapping[str, Tensor] | str | os.PathLike) -> None: ...

    def sync_weights(self, weights: Mapping[str, Tensor] | str | os.PathLike) -> None: ...

    def describe(self) -> str: ...


def check_model_folder(model_path: str | os.PathLike) -> Path:
    """The model folder as a Path, or a BackendError saying how to get one."""
    p = Path(model_path).expanduser()
    if not p.is_dir() or not (p / "config.json").is_file():
        raise BackendError(
            f"Model path {str(p)!r} is not a Hugging Face model folder (no config.json there): build the default "
            "models with `comprl models init` or point the config at a folder written by save_pretrained."
        )
    return p


def pad_right(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad token sequences: returns ids (N, T) long and attention mask (N, T) long."""
    n = len(sequences)
    t = max((len(s) for s in sequences), default=0)
    ids = torch.full((n, t), pad_id, dtype=torch.long)
    mask = torch.zeros((n, t), dtype=torch.long)
    for i, s in enumerate(sequences):
        if len(s):
            ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, : len(s)] = 1
    return ids, mask


def error_line(e: BaseException) -> str:
    """An exception as one line for a run's log: its type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def sync_gap(engine: Any, learner: Any, sequences: Sequence[Sequence[int]], *, n: int = 4) -> dict[str, float]:
    """After a weight sync: the rollout engine's log-probs against the learner's on the same tokens (up to `n`
    sequences, every position after the first) — the mean and largest absolute gap, and the mean importance ratio
    exp(engine - learner). {} when there is nothing to score or the engine cannot score (an OpenAI endpoint)."""
    seqs = [list(map(int, s)) for s in sequences if len(s) > 1][:n]
    if not seqs or not callable(getattr(engine, "logprobs", None)):
        return {}
    a = engine.logprobs(seqs).float().cpu()
    with torch.no_grad():
        b = learner.logprobs(seqs).float().cpu()
    width = min(a.shape[1], b.shape[1])
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for r, sq in enumerate(seqs):
        mask[r, 1:min(len(sq), width)] = True
    d = (a[:, :width] - b[:, :width])[mask]
    return {"logprob_gap_mean": float(d.abs().mean()), "logprob_gap_max": float(d.abs().max()),
            "ratio_mean": float(d.exp().mean())}


def checked_sync_metrics(engine: Any, learner: Any, sequences: Sequence[Sequence[int]], prefix: str) -> dict[str, float]:
    """sync_gap after a weight sync, as the step's metrics (`<prefix>logprob_gap_mean`, ...), with a warning line in
    the run's log when the gap passes SYNC_GAP_WARN: rollouts may then not come from the trained weights."""
    gap = sync_gap(engine, learner, sequences)
    if gap and gap["logprob_gap_max"] > SYNC_GAP_WARN:
        print(f"[comprl] warning: after the weight sync ({prefix.rstrip('_')}) the engine's log-probs differ from the "
              f"learner's by up to {gap['logprob_gap_max']:.3f} nats (mean {gap['logprob_gap_mean']:.3f}); rollouts may "
              "not come from the trained weights", flush=True)
    return {f"{prefix}{k}": v for k, v in gap.items()}


def read_weights(path: str | os.PathLike) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) pairs from a .safetensors file or every .safetensors file of a folder."""
    from safetensors import safe_open

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise BackendError(f"No .safetensors weights found at {str(p)!r}: pass a model folder or a .safetensors file.")
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for k in fh.keys():
                yield k, fh.get_tensor(k)


def write_weights(weights: Mapping[str, Tensor], path: Path) -> None:
    """Save a state dict as one safetensors file; tied tensors (one storage, two names) are kept once,
    as save_pretrained does, since safetensors refuses shared storage."""
    from safetensors.torch import save_file

    seen: set[tuple[int, int]] = set()
    out: dict[str, Tensor] = {}
    for k, v in weights.items():
        t = v.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        out[k] = t.to("cpu").contiguous()
    save_file(out, str(path))


def chat_template(tokenizer: Any, messages: Messages, *, add_generation_prompt: bool = True, tokenize: bool = False) -> str | list[int]:
    """The tokenizer's chat template over `messages`: the text, or its token ids when `tokenize`."""
    res = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=tokenize)
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); 4.x a list.
    if tokenize and not isinstance(res, list):
        res = res["input_ids"]
    return res


def end_token_ids(tokenizer: Any, generation_config: Any = None) -> set[int]:
    """Token ids that end a completion: the tokenizer's EOS, generation_config's EOS ids, <|im_end|>."""
    ids: set[int] = set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    if tokenizer is not None:
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != tokenizer.unk_token_id and im_end >= 0:
            ids.add(im_end)
    return ids


def chat_generate(backend: Any, conversations: Sequence[Messages], **kw: Any) -> list[GenerationOutput]:
    """`backend.generate` over conversations, each rendered by the back end's chat template with the assistant turn opened."""
    prompts = [backend.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in conversations]
    return backend.generate(prompts, **kw)


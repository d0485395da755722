"""Model back ends: the only module that knows which inference engine runs (DESIGN.md habit 6).

Rollouts and learners talk to a `ModelBackend`:

    backend = load_backend("auto", "path/to/hf-folder")        # prints which back end and device
    outs = backend.generate(prompt_ids, max_new_tokens=32, temperature=1.0, top_p=1.0,
                            stop=["\\n"], seed=step * 1000 + worker)
    outs[0].token_ids, outs[0].text, outs[0].logprobs        # sampled ids, text, (len,) log-probs
    lp = backend.logprobs([prompt + reply for ...])            # (N, T), aligned with the ids
    backend.sync_weights(learner.state_dict_for_sync())        # after each update

Three back ends:
- `hf`: transformers on CPU or CUDA, our own batched sampling loop with a KV cache (left padding,
  explicit position ids), bf16 on GPU, optional LoRA through peft. It also trains: `logprobs(...,
  grad=True)` and `trainable_parameters()`.
- `vllm`: rollouts on a GPU through vLLM's offline `LLM`, weights synced after each update through a
  worker extension (`collective_rpc`). Needs the `[gpu]` extra.
- `openai`: any OpenAI-compatible HTTP endpoint (a vLLM server, a hosted model), inference only.

Which log-probs come back: `GenerationOutput.logprobs` are under the *raw* model (temperature 1, no
top-p) — exactly what `logprobs()` recomputes, so they serve as `logp_old` in the PPO/CISPO ratios
(vLLM's default "raw" log-probs are the same quantity). `sample_logprobs` are under the distribution
actually sampled from (after temperature and top-p); the hf back end fills them, for importance
corrections and entropy diagnostics.

Constrained replies (`generate(..., choices=[ActionChoice | admissible list | None, ...])`): each back end keeps
a reply on its row's allowed strings, the hf back end with a logits mask in its sampling loop, vLLM through its
structured outputs, an OpenAI-compatible llama.cpp server through a GBNF grammar. The log-probs rule above holds:
`logprobs` are the unmasked model's (see HFBackend.generate for why).

Also here: building the tiny embedded default models (`build_tokenizer`, `build_tiny_qwen2`).
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = [
    "BackendError",
    "GenerationOutput",
    "LoraSettings",
    "ModelBackend",
    "HFBackend",
    "VLLMBackend",
    "OpenAIBackend",
    "VLLMWeightSyncExtension",
    "load_backend",
    "inference_backend",
    "ActionChoice",
    "as_choice",
    "vllm_available",
    "build_tokenizer",
    "build_tiny_qwen2",
    "save_model_folder",
    "pad_right",
    "CHATML_TEMPLATE",
    "SPECIAL_TOKENS",
]

GPU_EXTRA_HINT = 'pip install -e ".[gpu]"'

# ChatML, as Qwen2 uses it: "<|im_start|>role\ncontent<|im_end|>\n" per message.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")


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
        choices: Sequence["ActionChoice | Sequence[str] | None"] | None = None,  # constrained replies (HFBackend.generate)
    ) -> list[GenerationOutput]: ...

    def chat(self, conversations: Sequence[Messages], **generate_kwargs: Any) -> list[GenerationOutput]: ...

    def logprobs(self, sequences: Sequence[Sequence[int]], *, temperature: float = 1.0) -> Tensor: ...

    def apply_chat_template(
        self, messages: Messages, *, add_generation_prompt: bool = True, tokenize: bool = False
    ) -> str | list[int]: ...

    def load_weights(self, weights: Mapping[str, Tensor] | str | os.PathLike) -> None: ...

    def sync_weights(self, weights: Mapping[str, Tensor] | str | os.PathLike) -> None: ...

    def describe(self) -> str: ...


# ---------------------------------------------------------------------------- shared helpers

def vllm_available() -> bool:
    """True when `import vllm` would succeed (checked without importing it: it is slow and heavy)."""
    return importlib.util.find_spec("vllm") is not None


def _check_model_folder(model_path: str | os.PathLike) -> Path:
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


def _read_weights(path: str | os.PathLike) -> Iterator[tuple[str, Tensor]]:
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


def _write_weights(weights: Mapping[str, Tensor], path: Path) -> None:
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


def _as_chat_template_output(res: Any, tokenize: bool) -> str | list[int]:
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); 4.x a list.
    if tokenize and not isinstance(res, list):
        res = res["input_ids"]
    return res


def _end_token_ids(tokenizer: Any, generation_config: Any = None) -> set[int]:
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


def _chat_generate(backend: Any, conversations: Sequence[Messages], **kw: Any) -> list[GenerationOutput]:
    prompts = [backend.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in conversations]
    return backend.generate(prompts, **kw)


# ---------------------------------------------------------------------------- constrained replies (admissible actions)

PLACEHOLDER = re.compile(r"<[A-Za-z_][A-Za-z0-9_ -]*>")  # "search[<query>]": the part from here on is free text


@dataclass(frozen=True)
class ActionChoice:
    """What a constrained reply may be ("guided choice"): exactly one of `actions`, then an end token; or one of
    `open_prefixes` followed by free text (a search-and-ask call "<search_and_ask>…", WebShop's "search[<query>]",
    whose query no list can hold). Every back end reads it at the character level: any tokenization of an allowed
    string is allowed, as vLLM's structured outputs and llama.cpp's grammars do.

        ActionChoice.of(["go to fridge 1", "look", "search[<query>]"])
        -> actions ("go to fridge 1", "look"), open_prefixes ("search[",)
    """

    actions: tuple[str, ...]
    open_prefixes: tuple[str, ...] = ()

    @classmethod
    def of(cls, admissible: Sequence[str], open_prefixes: Sequence[str] = ()) -> "ActionChoice":
        """An env's admissible-action list: an entry with a <placeholder> becomes an open prefix (the text before it)."""
        acts: list[str] = []
        opens: list[str] = [p for p in open_prefixes if p]
        for a in admissible:
            a = str(a)
            m = PLACEHOLDER.search(a)
            if m:
                if a[: m.start()]:
                    opens.append(a[: m.start()])
            elif a.strip():
                acts.append(a)
        return cls(tuple(dict.fromkeys(acts)), tuple(dict.fromkeys(opens)))

    def __bool__(self) -> bool:
        return bool(self.actions or self.open_prefixes)

    def gbnf(self) -> str:
        """A GBNF grammar (llama.cpp's `grammar` field) whose sentences are exactly the allowed replies."""
        alts = [_gbnf_literal(a) for a in self.actions] + [f'{_gbnf_literal(p)} [^\\n]*' for p in self.open_prefixes]
        return "root ::= " + " | ".join(alts) + "\n"

    def regex(self) -> str:
        """The same set as a regular expression (vLLM's structured outputs when an open prefix needs one)."""
        alts = [_regex_literal(a) for a in self.actions] + [_regex_literal(p) + r"[^\n]*" for p in self.open_prefixes]
        return "(" + "|".join(alts) + ")"


def _regex_literal(s: str) -> str:
    # only the metacharacters (re.escape also escapes spaces, which some grammar compilers' regex readers refuse)
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", s).replace("\n", "\\n")


def _gbnf_literal(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + '"'


def as_choice(c: ActionChoice | Sequence[str] | None) -> ActionChoice | None:
    """None (free), an ActionChoice, or a plain list of admissible actions (read by ActionChoice.of)."""
    if c is None or isinstance(c, ActionChoice):
        return c or None
    if isinstance(c, str):
        raise TypeError("a choice is a list of actions, not one string")
    return ActionChoice.of(c) or None


class ChoiceVocab:
    """A tokenizer's vocabulary as text, for masking: `by_text` maps a token's text (as it reads inside a reply,
    leading space kept) to its ids. Special tokens, empty pieces and pieces that are part of a UTF-8 character are
    left out (a reply may still end in an end token, which the constraint adds itself)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        n = min(vocab_size, len(tokenizer))
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        # Decoded after an anchor token so that tokenizers which drop a piece's leading space when it starts the
        # text (sentencepiece's "▁to") give " to"; byte-level BPE gives the same with or without the anchor.
        anchor = tokenizer("a", add_special_tokens=False)["input_ids"][:1]
        head = tokenizer.decode(anchor) if anchor else ""
        texts = tokenizer.batch_decode([anchor + [i] for i in range(n)], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
        self.by_text: dict[str, list[int]] = {}
        self.piece: dict[int, str] = {}
        for i, t in enumerate(texts):
            if i in special or not t.startswith(head):
                continue
            piece = t[len(head):]
            if piece and "\ufffd" not in piece:
                self.by_text.setdefault(piece, []).append(i)
                self.piece[i] = piece
        self.longest = max((len(k) for k in self.by_text), default=1)
        self._ntok: dict[str, int] = {"": 0}

    def tokens_for(self, s: str) -> int:
        """Tokens the tokenizer spends on `s` (a bound on the fewest a reply needs to write it)."""
        n = self._ntok.get(s)
        if n is None:
            n = self._ntok[s] = len(self.tokenizer(s, add_special_tokens=False)["input_ids"])
            if len(self._ntok) > 200_000:
                self._ntok = {"": 0}
        return n


class ChoiceState:
    """One row's progress through an ActionChoice while it decodes: the reply's text so far, which token ids may
    come next, and when the reply has reached an open prefix (free from then on)."""

    def __init__(self, choice: ActionChoice, vocab: ChoiceVocab, end_ids: Iterable[int]) -> None:
        self.choice, self.vocab, self.end_ids = choice, vocab, sorted(end_ids)
        self.text = ""
        self.free = False

    def allowed(self, budget: int) -> list[int] | None:
        """Token ids that keep the reply on an allowed string, with `budget` tokens left for the reply (this one
        included). A token of a string is offered while the rest of that string still fits after it, with room for
        the end token where the string and its end fit the budget at all (a tokenizer's own spelling of the rest
        bounds what it needs); when no token fits, every token that stays on a string, so a reply too long for its
        budget is cut as a prefix of one rather than wander off. None: no constraint (free)."""
        if self.free:
            return None
        g = self.text
        fits: set[int] = set()
        rest_any: set[int] = set()
        for a in self.choice.actions:
            if a.startswith(g):
                self._extend(a[len(g):], budget, 1, fits, rest_any)
        for p in self.choice.open_prefixes:
            if p.startswith(g):
                self._extend(p[len(g):], budget, 0, fits, rest_any)
        if g in self.choice.actions:  # a complete action: it may end here
            fits.update(self.end_ids)
        out = fits or rest_any
        if not out:  # off every allowed string (only after an unconstrained token): free from here
            self.free = True
            return None
        return sorted(out)

    def _extend(self, rest: str, budget: int, end: int, fits: set[int], rest_any: set[int]) -> None:
        if not rest:
            return
        if self.vocab.tokens_for(rest) + end > budget:
            end = 0  # the string fits only without its end token: the reply may stop at the budget, complete
        for k in range(1, min(len(rest), self.vocab.longest) + 1):
            ids = self.vocab.by_text.get(rest[:k])
            if ids:
                (fits if 1 + self.vocab.tokens_for(rest[k:]) + end <= budget else rest_any).update(ids)

    def advance(self, token_id: int) -> None:
        if self.free or token_id in self.end_ids:
            return
        piece = self.vocab.piece.get(token_id)
        if piece is None:  # not a token allowed() offers: the reply has left the choice, nothing more to constrain
            self.free = True
            return
        self.text += piece
        if any(self.text.startswith(p) for p in self.choice.open_prefixes):
            self.free = True


# ---------------------------------------------------------------------------- hf back end

PREFIX_CACHE_MIN = 16  # shared prompt tokens below which running them once saves less than the extra call (sampler and learner)


def _common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Leading tokens all prompts share, leaving every prompt at least one token of its own."""
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    k = 0
    while k < n and all(p[k] == first[k] for p in prompts):
        k += 1
    return k


class HFBackend:
    """transformers on CPU or CUDA, with our own batched sampling loop.

    Why not `model.generate`: we need the raw-model log-prob of each sampled token *and* the
    sampling-distribution one, stop strings that cut text but keep ids, and one RNG per call for
    determinism; computing them in a 40-line loop with a KV cache is cheaper than asking generate
    for full-vocabulary scores at every step.
    """

    kind = "hf"

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        device: str = "auto",
        dtype: str = "auto",
        lora: LoraSettings | None = None,
        max_batch_size: int = 64,
        num_threads: int | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if num_threads is not None:
            # Process-wide. On a busy small CPU, torch's spinning OpenMP threads fight the other
            # processes: measured here under load ~9 on 2 cores, 8x32 tokens took 12 s with 2 threads
            # and 0.4 s with 1.
            torch.set_num_threads(int(num_threads))

        self.path = _check_model_folder(model_path)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendError(f"Device {device!r} was asked for but CUDA is not available here: use device 'cpu' or 'auto'.")
        self.device = torch.device(device)
        if dtype == "auto":
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        if dtype not in ("float32", "bfloat16", "float16"):
            raise BackendError(f"dtype {dtype!r} is not one of auto, float32, bfloat16, float16.")
        self.dtype = getattr(torch, dtype)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
            kw = {"dtype": self.dtype} if "dtype" in inspect.signature(AutoModelForCausalLM.from_pretrained).parameters or _transformers_major() >= 5 else {"torch_dtype": self.dtype}
            model = AutoModelForCausalLM.from_pretrained(str(self.path), **kw)
        except (OSError, ValueError) as e:
            raise BackendError(f"Could not load the model folder {str(self.path)!r} ({type(e).__name__}: {str(e).splitlines()[0]}); check that it holds a causal LM and its tokenizer.") from e
        model.to(self.device)
        self.lora = lora
        if lora is not None:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model,
                LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules), task_type="CAUSAL_LM"),
            )
        self.model = model
        self.model.eval()  # no dropout: sampling and the learner's log-probs must see one function
        self.max_batch_size = int(max_batch_size)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        if self.pad_id is None:
            raise BackendError(f"The tokenizer in {str(self.path)!r} has neither a pad nor an EOS token; set one with tokenizer.pad_token.")
        self.end_ids = _end_token_ids(self.tokenizer, getattr(self._base_model(), "generation_config", None))
        fwd = inspect.signature(self._base_model().forward).parameters
        self.cache_kw = "cache" if "cache" in fwd else "past_key_values"  # renamed in transformers 5
        # the learner projects only reply positions onto the vocabulary when the model allows it
        self.supports_logits_to_keep = "logits_to_keep" in fwd
        # generate runs the prompts' shared prefix once (a cache repeated over the rows) where the cache can be repeated
        self.prefix_cache = _cache_repeatable()
        # identical prompts (a group's first turn: K rollouts of one task) are prefilled once, their cache rows repeated
        self.dedupe_prompts = hasattr(_dynamic_cache(), "batch_select_indices")
        # Rollout threads and a learner may share one backend: generate/logprobs/load_weights hold
        # this lock; a learner holds it around optimizer.step() so that one generate call never
        # samples from two policy versions.
        self.lock = threading.RLock()
        # Episode sessions (rollouts reusing their prefix): key -> (ids the cache covers, per-layer (K, V) of shape
        # (1, H, L, D)). generate(..., sessions=keys) prefills only what a row's prompt adds to its session's ids.
        self.sessions: dict[Any, tuple[list[int], list[tuple[Tensor, Tensor]]]] = {}
        self.sessions_ok = _cache_roundtrips()
        self.prefill_computed = 0  # prompt tokens run through the model by generate (a counter for benchmarks)

    # -- plumbing

    def _base_model(self) -> Any:
        return self.model.get_base_model() if self.lora is not None else self.model

    def describe(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        lora = f", LoRA r={self.lora.r}" if self.lora else ""
        threads = f", {torch.get_num_threads()} threads" if self.device.type == "cpu" else ""
        return f"hf (transformers) on {self.device}{threads} [{str(self.dtype).removeprefix('torch.')}], model {self.path} ({n / 1e6:.2f}M params{lora})"

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters an optimiser should update (only the adapters when LoRA is on)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def apply_chat_template(self, messages: Messages, *, add_generation_prompt: bool = True, tokenize: bool = False) -> str | list[int]:
        res = self.tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=tokenize)
        return _as_chat_template_output(res, tokenize)

    def chat(self, conversations: Sequence[Messages], **generate_kwargs: Any) -> list[GenerationOutput]:
        return _chat_generate(self, conversations, **generate_kwargs)

    def encode(self, text: str) -> list[int]:
        """Token ids of a piece of text, without special tokens added (pieces are joined by the caller)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- sampling

    def drop_sessions(self, keys: Iterable[Any] | None = None) -> None:
        """Forget the KV caches of these sessions (all of them when None)."""
        with self.lock:
            if keys is None:
                self.sessions.clear()
            else:
                for k in keys:
                    self.sessions.pop(k, None)

    @torch.no_grad()
    def generate(
        self,
        prompts: Prompts,
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        sessions: Sequence[Any] | None = None,
        choices: Sequence[ActionChoice | Sequence[str] | None] | None = None,
    ) -> list[GenerationOutput]:
        """Sample one completion per prompt (strings are tokenised without special tokens).

        temperature 0 is greedy. One RNG per call, seeded by `seed` (or drawn from torch's global RNG),
        so a call is reproducible; prompts are sorted by length and run in batches of `max_batch_size`.

        `sessions` (one hashable key per prompt, e.g. an episode): the KV cache of each row is kept under
        its key after the call, covering the prompt and the reply; the next call with the same key
        prefills only the tokens past the longest common prefix of that cache and the new prompt (a
        multi-turn episode whose prompt extends the last one runs only the new turn). `drop_sessions`
        frees them; new weights (`load_weights`) drop them all. Outputs equal those without sessions up
        to float rounding.

        `choices` (one per prompt: an ActionChoice, a list of admissible actions, or None for a free reply):
        constrained decoding. At each step a row's logits outside the tokens that keep its reply on one of its
        allowed strings are set to -inf (any tokenization of the string; an end token once it is complete), then
        temperature, top-p and the draw (or argmax) apply to what is left; a token is only offered while the rest
        of its action fits in max_new_tokens. Which log-probs come back: `logprobs` stay under the raw, unmasked
        model, the quantity the learner's `logprobs()` recomputes, so the PPO ratio is exactly 1 before an update
        and the gradient moves the model's own probability toward the chosen action (what it needs to write valid
        actions without the mask); `sample_logprobs` are under the masked distribution the token was drawn from
        (log of the behaviour policy's probability, e.g. for an importance correction). vLLM returns the same raw
        log-probs under its structured outputs.
        """
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        ids = [self.encode(p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
        if any(len(p) == 0 for p in ids):
            raise ValueError("every prompt needs at least one token")
        max_pos = getattr(self._base_model().config, "max_position_embeddings", None)
        longest = max((len(p) for p in ids), default=0)
        if max_pos is not None and longest + max_new_tokens > max_pos:
            raise ValueError(f"prompt of {longest} tokens + {max_new_tokens} new tokens exceeds the model's {max_pos} positions; shorten the prompt")
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        gen = torch.Generator(device=self.device).manual_seed(int(seed))
        stops = [s for s in (stop or []) if s]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths together: less padding
        results: list[GenerationOutput | None] = [None] * len(ids)
        if sessions is not None and len(sessions) != len(ids):
            raise ValueError(f"sessions names {len(sessions)} keys for {len(ids)} prompts")
        keys = list(sessions) if sessions is not None and self.sessions_ok else None
        if choices is not None and len(choices) != len(ids):
            raise ValueError(f"choices names {len(choices)} action sets for {len(ids)} prompts")
        cons = [as_choice(c) for c in choices] if choices is not None else None
        with self.lock:
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                outs = self._generate_batch([ids[i] for i in chunk], max_new_tokens, float(temperature), float(top_p), stops, gen,
                                            keys=[keys[i] for i in chunk] if keys is not None else None,
                                            choices=[cons[i] for i in chunk] if cons is not None and any(cons) else None)
                for i, o in zip(chunk, outs):
                    results[i] = o
        return [r for r in results if r is not None]

    def _forward(self, **kw: Any) -> tuple[Tensor, Any]:
        cache = kw.pop("cache", None)
        if cache is not None:
            kw[self.cache_kw] = cache
        out = self.model(use_cache=True, **kw)
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = getattr(out, "past_key_values", None)
        return out.logits, new_cache

    def _generate_batch(
        self, prompts: list[list[int]], max_new: int, temperature: float, top_p: float, stops: list[str], gen: torch.Generator,
        keys: list[Any] | None = None, choices: list[ActionChoice | None] | None = None,
    ) -> list[GenerationOutput]:
        b = len(prompts)
        reuse = [0] * b  # per row: leading prompt tokens its session's cache already holds
        if keys is not None:
            for i, (k, p) in enumerate(zip(keys, prompts)):
                held = self.sessions.get(k)
                if held is not None:
                    reuse[i] = min(_common_len(held[0], p), len(p) - 1)
        if max(reuse) > 0:
            logits, cache, attn = self._prefill_from_sessions(prompts, keys, reuse)
            return self._decode(prompts, logits, cache, attn, max_new, temperature, top_p, stops, gen, keys, choices)
        # Identical prompts are prefilled once: a GRPO group's K rollouts of one task start from one
        # prompt, and rollouts that took the same actions meet again (measured on the default: 12 unique
        # first-turn prompts of 128, 9% of a step's prefill tokens repeated). Rows are restored below.
        given, rows = prompts, None
        if b > 1 and self.dedupe_prompts:
            first: dict[tuple[int, ...], int] = {}
            where = [first.setdefault(tuple(p), len(first)) for p in prompts]
            if len(first) < b:
                prompts, rows = [list(k) for k in first], torch.as_tensor(where, dtype=torch.long, device=self.device)
        n = len(prompts)
        # The prompts' shared leading tokens (system prompt and task: ~a third of a MiniHack turn) are
        # run once and their key/value cache repeated over the rows; each row keeps >= 1 token of its own.
        shared = _common_prefix(prompts) if n > 1 and self.prefix_cache else 0
        shared = shared if shared >= PREFIX_CACHE_MIN else 0
        cache = None
        if shared:
            _, cache = self._forward(input_ids=torch.as_tensor([prompts[0][:shared]], dtype=torch.long, device=self.device),
                                     logits_to_keep=1)
            cache.batch_repeat_interleave(n)
        rest = [p[shared:] for p in prompts]
        width = max(len(p) for p in rest)
        # Left padding so every row's next token sits in the last column. Positions come from the
        # cumulative attention mask (FIELD-NOTES pitfall): a left-padded row must start at position 0,
        # not at its pad count, or batched and single-prompt decoding disagree. With a shared prefix
        # the mask is [prefix ones | pads | the row's own tokens].
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, shared + width), dtype=torch.long)
        attn[:, :shared] = 1
        for i, p in enumerate(rest):
            input_ids[i, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
            attn[i, shared + width - len(p) :] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)[:, shared:]  # (B, W)
        logits, cache = self._forward(input_ids=input_ids, attention_mask=attn, position_ids=pos, logits_to_keep=1, cache=cache)
        self.prefill_computed += shared + sum(len(p) for p in rest)
        if rows is not None:  # one row per prompt again, each sampled on its own
            cache.batch_select_indices(rows)
            logits, attn = logits[rows], attn[rows]
        return self._decode(given, logits, cache, attn, max_new, temperature, top_p, stops, gen, keys, choices)

    def _prefill_from_sessions(self, prompts: list[list[int]], keys: list[Any], reuse: list[int]) -> tuple[Tensor, Any, Tensor]:
        """Prefill where rows continue their sessions: each row's kept cache (its first reuse[i] tokens) is
        left-padded to a common width, then the rows' new tokens run in one left-padded batch. Mask:
        [pads | row's cached tokens | pads | row's new tokens]; positions from its cumulative sum."""
        n = len(prompts)
        width_c = max(reuse)
        layers = None
        for i, k in enumerate(keys):
            if not reuse[i]:
                continue
            held = self.sessions[k][1]
            if layers is None:
                layers = [(torch.zeros((n, *kk.shape[1:2], width_c, kk.shape[3]), dtype=kk.dtype, device=kk.device),
                           torch.zeros((n, *vv.shape[1:2], width_c, vv.shape[3]), dtype=vv.dtype, device=vv.device)) for kk, vv in held]
            for (dk, dv), (kk, vv) in zip(layers, held):
                dk[i, :, width_c - reuse[i]:] = kk[0, :, : reuse[i]]
                dv[i, :, width_c - reuse[i]:] = vv[0, :, : reuse[i]]
        cache = _cache_from(layers)
        rest = [p[r:] for p, r in zip(prompts, reuse)]
        width = max(len(p) for p in rest)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, width_c + width), dtype=torch.long)
        for i, (p, r) in enumerate(zip(rest, reuse)):
            attn[i, width_c - r: width_c] = 1
            input_ids[i, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
            attn[i, width_c + width - len(p):] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)[:, width_c:]
        logits, cache = self._forward(input_ids=input_ids, attention_mask=attn, position_ids=pos, logits_to_keep=1, cache=cache)
        self.prefill_computed += sum(len(p) for p in rest)
        return logits, cache, attn

    def _decode(self, given: list[list[int]], logits: Tensor, cache: Any, attn: Tensor, max_new: int, temperature: float,
                top_p: float, stops: list[str], gen: torch.Generator, keys: list[Any] | None,
                choices: list[ActionChoice | None] | None = None) -> list[GenerationOutput]:
        b = len(given)
        states = [ChoiceState(c, self.choice_vocab(logits.shape[-1]), self.end_ids) if c else None for c in choices] \
            if choices is not None else [None] * b
        next_pos = attn.sum(-1, keepdim=True)  # (B, 1): each row's next position = its real length

        tokens: list[list[int]] = [[] for _ in range(b)]
        raw_lps: list[list[float]] = [[] for _ in range(b)]
        samp_lps: list[list[float]] = [[] for _ in range(b)]
        reasons = ["length"] * b
        done = [False] * b
        stop_bytes = max((len(s.encode()) for s in stops), default=0)
        for step in range(max_new):
            last = logits[:, -1, :].float()  # (B, V)
            raw = torch.log_softmax(last, dim=-1)  # (B, V): the raw model, what logprobs() recomputes
            last = self._mask_choices(last, states, done, max_new - step)  # constrained rows: -inf off their choices
            if temperature <= 0.0:
                tok = last.argmax(dim=-1)  # (B,)
                samp = torch.zeros(b, device=last.device)  # a point mass: log-prob 0
            else:
                scaled = last / temperature
                if top_p < 1.0:
                    scaled = _top_p_filter(scaled, top_p)
                samp_all = torch.log_softmax(scaled, dim=-1)
                tok = torch.multinomial(samp_all.exp(), 1, generator=gen).squeeze(-1)  # (B,)
                samp = samp_all.gather(-1, tok[:, None]).squeeze(-1)
            raw_tok = raw.gather(-1, tok[:, None]).squeeze(-1)
            tok_l, raw_l, samp_l = tok.tolist(), raw_tok.tolist(), samp.tolist()
            for i in range(b):
                if done[i]:
                    continue
                tokens[i].append(tok_l[i])
                raw_lps[i].append(raw_l[i])
                samp_lps[i].append(samp_l[i])
                if states[i] is not None:
                    states[i].advance(tok_l[i])
                if tok_l[i] in self.end_ids:
                    done[i], reasons[i] = True, "eos"
                elif stops:
                    # A stop string of n bytes lies within the last n + 1 tokens when it first appears.
                    tail = self.tokenizer.decode(tokens[i][-(stop_bytes + 1) :], skip_special_tokens=True)
                    if any(s in tail for s in stops):
                        done[i], reasons[i] = True, "stop"
            if all(done) or step == max_new - 1:
                break
            feed = torch.where(torch.tensor(done, device=tok.device), torch.full_like(tok, self.pad_id), tok)
            attn = torch.cat([attn, torch.ones((b, 1), dtype=attn.dtype, device=attn.device)], dim=1)
            logits, cache = self._forward(input_ids=feed[:, None], attention_mask=attn, position_ids=next_pos, cache=cache)
            next_pos = next_pos + 1

        if keys is not None:
            self._keep_sessions(keys, given, tokens, cache, attn)
        outs = []
        for i in range(b):
            text = self.tokenizer.decode(tokens[i], skip_special_tokens=True)
            if reasons[i] == "stop":
                text = text[: min(text.find(s) for s in stops if s in text)]
            outs.append(GenerationOutput(list(given[i]), tokens[i], text, raw_lps[i], samp_lps[i], reasons[i]))
        return outs

    def choice_vocab(self, width: int) -> ChoiceVocab:
        """The vocabulary as text for constrained decoding, built on first use (~1 s for a 49k vocabulary)."""
        if getattr(self, "_choice_vocab", None) is None:
            self._choice_vocab = ChoiceVocab(self.tokenizer, width)
        return self._choice_vocab

    @staticmethod
    def _mask_choices(last: Tensor, states: list["ChoiceState | None"], done: list[bool], budget: int) -> Tensor:
        """(B, V) logits with every token a constrained row may not write set to -inf (a copy; `last` stays)."""
        out = None
        for i, st in enumerate(states):
            if st is None or done[i]:
                continue
            allowed = st.allowed(budget)
            if allowed is None:
                continue
            if out is None:
                out = last.clone()
            keep = torch.as_tensor(allowed, dtype=torch.long, device=last.device)
            row = torch.full_like(last[i], float("-inf"))
            row[keep] = last[i, keep]
            out[i] = row
        return last if out is None else out

    def _keep_sessions(self, keys: list[Any], given: list[list[int]], tokens: list[list[int]], cache: Any, attn: Tensor) -> None:
        """Keep each row's cache: the prompt and the reply but its last token (never fed back), in order."""
        tensors = _cache_tensors(cache)
        for i, k in enumerate(keys):
            ids = list(given[i]) + tokens[i][:-1]
            cols = attn[i].nonzero().squeeze(-1)[: len(ids)]
            if len(cols) < len(ids):
                continue
            self.sessions.pop(k, None)
            self.sessions[k] = (ids, [(kk[i : i + 1, :, cols].clone(), vv[i : i + 1, :, cols].clone()) for kk, vv in tensors])
        while len(self.sessions) > MAX_SESSIONS:  # a caller that never drops: the oldest go first
            self.sessions.pop(next(iter(self.sessions)))

    # -- scoring and training

    def logprobs(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        grad: bool = False,
        batch_size: int | None = None,
    ) -> Tensor:
        """Per-token log-probs of given sequences: (N, T) float32, right-padded.

        out[i, t] = log p(seq_i[t] | seq_i[:t]) for 1 <= t < len(seq_i); 0 at t = 0 and on padding.
        Aligned with the token positions, so a loss mask (N, T) built over the same ids applies
        directly. With grad=True the result carries the graph (the learner's forward); otherwise it
        runs under no_grad in batches of `batch_size`.
        """
        if not sequences:
            return torch.zeros((0, 0))
        ids, attn = pad_right(sequences, self.pad_id)  # (N, T)
        if grad:
            return self._logprobs_batch(ids, attn, temperature)
        bs = batch_size or self.max_batch_size
        with torch.no_grad(), self.lock:
            parts = [self._logprobs_batch(ids[s : s + bs], attn[s : s + bs], temperature) for s in range(0, ids.shape[0], bs)]
        width = ids.shape[1]
        return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts], dim=0)

    def _logprobs_batch(self, ids: Tensor, attn: Tensor, temperature: float) -> Tensor:
        width = int(attn.sum(-1).max().item())
        ids, attn = ids[:, :width].to(self.device), attn[:, :width].to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # right padding: 0..len-1, pads repeat the last
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits  # (N, T, V)
        logits = logits[:, :-1].float() / temperature  # (N, T-1, V) predicts tokens 1..T-1
        tgt = ids[:, 1:]
        lp = logits.gather(-1, tgt[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (N, T-1)
        lp = lp * attn[:, 1:].to(lp.dtype)
        return torch.nn.functional.pad(lp, (1, 0))  # (N, T): position 0 has no prediction

    # -- weights

    def _named_targets(self) -> dict[str, Tensor]:
        """Parameters and persistent buffers under their plain HF names (peft prefixes stripped)."""
        out: dict[str, Tensor] = {}
        for n, t in self.model.state_dict(keep_vars=True).items():
            if "lora_" in n:
                continue
            out[n.removeprefix("base_model.model.").replace(".base_layer.", ".")] = t
        return out

    def load_weights(self, weights: Mapping[str, Tensor] | str | os.PathLike) -> None:
        """Copy full weights (HF names) into the model in place: a state dict, a model folder or a
        .safetensors file. Every name must be known; names missing from `weights` must be tied ones."""
        items = _read_weights(weights) if isinstance(weights, (str, os.PathLike)) else iter(weights.items())
        targets = self._named_targets()
        seen: set[str] = set()
        with torch.no_grad(), self.lock:
            for name, t in items:
                if name not in targets:
                    raise BackendError(f"Weight {name!r} does not belong to this model ({self.path}); were the weights saved from another architecture?")
                dst = targets[name]
                if dst.shape != t.shape:
                    raise BackendError(f"Weight {name!r} has shape {tuple(t.shape)} but the model expects {tuple(dst.shape)}.")
                dst.data.copy_(t.to(device=dst.device, dtype=dst.dtype))
                seen.add(name)
            self.sessions.clear()  # caches computed under the old weights
        tied = bool(getattr(self._base_model().config, "tie_word_embeddings", False))
        missing = [n for n in targets if n not in seen and not (tied and n == "lm_head.weight") and "rotary_emb" not in n]
        if missing:
            raise BackendError(f"{len(missing)} weights were not provided (first: {missing[0]!r}); pass a complete state dict.")

    sync_weights = load_weights

    def state_dict_for_sync(self) -> dict[str, Tensor]:
        """Full inference weights under plain HF names, LoRA merged in: what another engine loads."""
        if self.lora is None:
            return {n: p.detach() for n, p in self._named_targets().items()}
        with self.lock:
            self.model.merge_adapter()
            try:
                return {n: p.detach().clone() for n, p in self._named_targets().items()}
            finally:
                self.model.unmerge_adapter()

    def save(self, path: str | os.PathLike) -> Path:
        """Write a complete HF folder (config, merged weights, tokenizer) that any back end can load."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        base = self._base_model()
        if self.lora is None:
            base.save_pretrained(str(out))
        else:
            base.config.save_pretrained(str(out))
            base.generation_config.save_pretrained(str(out))
            _write_weights(self.state_dict_for_sync(), out / "model.safetensors")
        self.tokenizer.save_pretrained(str(out))
        return out


def _dynamic_cache() -> Any:
    try:
        from transformers import DynamicCache
    except ImportError:
        return None
    return DynamicCache


def _cache_repeatable() -> bool:
    return hasattr(_dynamic_cache(), "batch_repeat_interleave")


MAX_SESSIONS = 4096  # kept episode caches per back end


def _common_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def _cache_tensors(cache: Any) -> list[tuple[Tensor, Tensor]]:
    """Per-layer (keys, values), each (B, H, T, D), of a transformers cache (5.x layers, 4.x lists, legacy tuples)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    return [(k, v) for k, v in cache]


def _cache_from(layers: Sequence[tuple[Tensor, Tensor]]) -> Any:
    """A DynamicCache holding these per-layer (keys, values)."""
    dc = _dynamic_cache()
    try:
        return dc(ddp_cache_data=[(k, v) for k, v in layers])
    except TypeError:  # transformers 4.x before ddp_cache_data
        return dc.from_legacy_cache(tuple((k, v) for k, v in layers))


def _cache_roundtrips() -> bool:
    """Whether a cache can be taken apart and rebuilt here (episode sessions need it)."""
    if _dynamic_cache() is None:
        return False
    try:
        k = torch.zeros((1, 1, 2, 2))
        back = _cache_tensors(_cache_from([(k, k)]))
        return len(back) == 1 and tuple(back[0][0].shape) == (1, 1, 2, 2)
    except Exception:  # noqa: BLE001 - an unknown cache API: sessions are off, generation is unchanged
        return False


def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def _top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus filtering: keep the smallest set of tokens whose probability reaches top_p. (B, V) -> (B, V)."""
    sorted_logits, idx = logits.sort(dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens; the top token always stays
    sorted_logits = sorted_logits.masked_fill(before >= top_p, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)


# ---------------------------------------------------------------------------- vllm back end

def vllm_structured_kwargs(choice: ActionChoice | None) -> dict[str, Any]:
    """SamplingParams keyword arguments that constrain a reply to `choice`: `structured_outputs=
    StructuredOutputsParams(choice=[...] | regex=...)` (vLLM >= 0.10.2; the only form from 0.12), else the older
    `guided_decoding=GuidedDecodingParams(...)`. {} for a free reply."""
    if not choice:
        return {}
    spec = {"regex": choice.regex()} if choice.open_prefixes else {"choice": list(choice.actions)}
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams  # vLLM before 0.10.2

        return {"guided_decoding": GuidedDecodingParams(**spec)}
    return {"structured_outputs": StructuredOutputsParams(**spec)}


class VLLMWeightSyncExtension:
    """Mixed into vLLM's GPU workers (`worker_extension_cls`); its methods run inside each worker.

    Since vLLM's V1 engine the workers live in other processes, so weights travel as a safetensors
    file (in /dev/shm when it exists: RAM, no disk) and each worker loads them with the model's own
    `load_weights`, which handles vLLM's fused QKV / gate-up layouts.
    """

    def comprl_load_weights(self, path: str) -> int:
        model = self.model_runner.model  # type: ignore[attr-defined]
        loaded = model.load_weights(weights=_read_weights(path))
        return len(loaded) if loaded is not None else -1


class VLLMBackend:
    """vLLM's offline engine for rollouts on a GPU; weights synced after each learner update."""

    kind = "vllm"

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.45,
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        if not vllm_available():
            raise BackendError(f"The vllm back end needs vLLM, which is not installed: {GPU_EXTRA_HINT} (or use backend 'hf').")
        from vllm import LLM

        self.path = _check_model_folder(model_path)
        self.llm = LLM(
            model=str(self.path),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=enforce_eager,
            enable_prefix_caching=True,
            worker_extension_cls=f"{__name__}.VLLMWeightSyncExtension",
            **engine_kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()
        from transformers import GenerationConfig

        try:
            gen_cfg = GenerationConfig.from_pretrained(str(self.path))
        except OSError:
            gen_cfg = None
        self.end_ids = sorted(_end_token_ids(self.tokenizer, gen_cfg))
        self.dtype = dtype
        self._weights_dir = Path(tempfile.mkdtemp(prefix="comprl-vllm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))

    def describe(self) -> str:
        return f"vllm on cuda [{self.dtype}], model {self.path}"

    def apply_chat_template(self, messages: Messages, *, add_generation_prompt: bool = True, tokenize: bool = False) -> str | list[int]:
        res = self.tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=tokenize)
        return _as_chat_template_output(res, tokenize)

    def chat(self, conversations: Sequence[Messages], **generate_kwargs: Any) -> list[GenerationOutput]:
        return _chat_generate(self, conversations, **generate_kwargs)

    def _inputs(self, prompts: Prompts) -> list[Any]:
        from vllm.inputs import TokensPrompt

        return [p if isinstance(p, str) else TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]

    def generate(
        self,
        prompts: Prompts,
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        sessions: Sequence[Any] | None = None,  # accepted for the Roller's sake; vLLM's prefix cache does this itself
        choices: Sequence[ActionChoice | Sequence[str] | None] | None = None,
    ) -> list[GenerationOutput]:
        """`choices`: per prompt, the replies allowed (HFBackend.generate), through vLLM's structured outputs (a
        `choice` list, or a regex when an open prefix needs free text). Log-probs stay vLLM's raw ones (before the
        grammar's mask), as the hf back end's. Written against vLLM's documented API; not yet run on a GPU here."""
        del sessions
        from vllm import SamplingParams

        if choices is not None and len(choices) != len(prompts):
            raise ValueError(f"choices names {len(choices)} action sets for {len(prompts)} prompts")
        cons = [as_choice(c) for c in choices] if choices is not None else [None] * len(prompts)
        # One SamplingParams per prompt: with one shared seed, the K copies of a task's prompt in a
        # GRPO group would all sample the same completion.
        params = [
            SamplingParams(
                n=1,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                stop=list(stop) if stop else None,
                stop_token_ids=self.end_ids,
                seed=None if seed is None else int(seed) + i,
                logprobs=1,  # the sampled token's log-prob is always among those returned
                skip_special_tokens=True,
                **vllm_structured_kwargs(cons[i]),
            )
            for i in range(len(prompts))
        ]
        outs = self.llm.generate(self._inputs(prompts), params, use_tqdm=False)
        results = []
        for o in outs:
            c = o.outputs[0]
            ids = [int(t) for t in c.token_ids]
            lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])]
            if c.finish_reason == "length":
                reason = "length"
            else:
                reason = "stop" if isinstance(c.stop_reason, str) else "eos"
            results.append(GenerationOutput(list(o.prompt_token_ids or []), ids, c.text, lps, [], reason))
        return results

    def logprobs(self, sequences: Sequence[Sequence[int]], *, temperature: float = 1.0) -> Tensor:
        """(N, T) prompt log-probs from vLLM (raw model); same layout as HFBackend.logprobs."""
        if temperature != 1.0:
            raise BackendError("The vllm back end scores sequences at temperature 1 only; use the hf back end for tempered log-probs.")
        from vllm import SamplingParams

        if not sequences:
            return torch.zeros((0, 0))
        # prompt_logprobs=1: the actual prompt token is always among those returned, plus the top one.
        params = SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=1.0)
        outs = self.llm.generate(self._inputs(sequences), params, use_tqdm=False)
        width = max(len(s) for s in sequences)
        res = torch.zeros((len(sequences), width))
        for i, (seq, o) in enumerate(zip(sequences, outs)):
            for t, d in enumerate(o.prompt_logprobs or []):
                if t > 0 and d is not None:
                    res[i, t] = float(d[int(seq[t])].logprob)
        return res

    def load_weights(self, weights: Mapping[str, Tensor] | str | os.PathLike) -> None:
        """Load new weights into the running engine (every worker), then drop prefix-cached KV blocks,
        which were computed under the old weights."""
        if isinstance(weights, (str, os.PathLike)):
            path = str(weights)
        else:
            path = str(self._weights_dir / "sync.safetensors")
            _write_weights(weights, Path(path))
        self.llm.collective_rpc("comprl_load_weights", args=(path,))
        self.llm.reset_prefix_cache()

    sync_weights = load_weights


# ---------------------------------------------------------------------------- openai back end

class OpenAIBackend:
    """Any OpenAI-compatible HTTP endpoint (completions and chat), for inference only."""

    kind = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        tokenizer_path: str | os.PathLike | None = None,
        token_ids_from_server: bool = False,
        concurrency: int = 8,
        prompts_as_text: bool = False,
        want_logprobs: bool = True,
    ) -> None:
        import requests

        self._requests = requests
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model = model
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        # vLLM's server can name tokens "token_id:N" (return_tokens_as_token_ids); other servers reject it.
        self.token_ids_from_server = token_ids_from_server
        self.concurrency = max(1, int(concurrency))
        # Token-id prompts are sent as their text (decoded with special tokens kept) when the server takes no ids
        # (llama.cpp's Python server reads `prompt` as text) or when asked; the server tokenises them again.
        self.prompts_as_text = bool(prompts_as_text)
        self.want_logprobs = bool(want_logprobs)  # inference roles need none (llama.cpp computes them only on request)
        self.requests_sent = 0
        self.session = requests.Session()
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        if key:
            self.session.headers["Authorization"] = f"Bearer {key}"
        self.tokenizer = None
        if tokenizer_path is not None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(_check_model_folder(tokenizer_path)))

    def describe(self) -> str:
        return f"openai-compatible endpoint {self.base_url}, model {self.model}"

    def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with a timeout; retries connection errors, timeouts, 429 and 5xx with exponential backoff."""
        url = f"{self.base_url}/{route}"
        last = ""
        for attempt in range(self.max_retries + 1):
            self.requests_sent += 1
            try:
                r = self.session.post(url, json=body, timeout=self.timeout)
            except (self._requests.ConnectionError, self._requests.Timeout) as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if r.status_code == 200:
                    return r.json()
                last = f"HTTP {r.status_code}: {r.text[:300]}"
                if r.status_code != 429 and r.status_code < 500:
                    raise BackendError(f"The endpoint {url} refused the request ({last}); check the model name and parameters.")
            if attempt < self.max_retries:
                time.sleep(self.backoff_s * 2**attempt)
        raise BackendError(f"The endpoint {url} did not answer after {self.max_retries + 1} tries ({last}); check that the server is up.")

    def _token_ids(self, tokens: Sequence[str], text: str) -> list[int]:
        if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            return [int(t.split(":", 1)[1]) for t in tokens]
        if self.tokenizer is not None:
            # Re-tokenised text: may differ from the sampled ids at merge boundaries; inference only.
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return []

    def generate(
        self,
        prompts: Prompts,
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        sessions: Sequence[Any] | None = None,  # accepted for the Roller's sake; the server keeps its own prefix cache
        choices: Sequence[ActionChoice | Sequence[str] | None] | None = None,
    ) -> list[GenerationOutput]:
        """One /completions request per prompt, `concurrency` at a time (servers batch concurrent requests;
        llama.cpp's Python server takes one prompt per request). Sampling seed: `seed` + the prompt's index.

        `choices`: per prompt, the replies allowed (HFBackend.generate), sent as a GBNF `grammar` (ActionChoice.gbnf),
        the field llama.cpp's server reads; a server that ignores the field answers unconstrained."""
        del sessions
        prompt_list = [p if isinstance(p, str) else [int(t) for t in p] for p in prompts]
        if not prompt_list:
            return []
        if choices is not None and len(choices) != len(prompt_list):
            raise ValueError(f"choices names {len(choices)} action sets for {len(prompt_list)} prompts")
        cons = [as_choice(c) for c in choices] if choices is not None else [None] * len(prompt_list)
        if self.prompts_as_text and any(not isinstance(p, str) for p in prompt_list) and self.tokenizer is None:
            raise BackendError("prompts_as_text needs a local tokenizer (tokenizer_path) to turn token ids into text.")

        def one(i: int) -> GenerationOutput:
            p = prompt_list[i]
            sent: str | list[int] = p
            if self.prompts_as_text and not isinstance(p, str):
                sent = self.tokenizer.decode(p, skip_special_tokens=False)
            body: dict[str, Any] = {"model": self.model, "prompt": sent, "max_tokens": max_new_tokens,
                                    "temperature": temperature, "top_p": top_p}
            if self.want_logprobs:
                body["logprobs"] = 1
            if stop:
                body["stop"] = list(stop)
            if seed is not None:
                body["seed"] = (int(seed) + i) % (2**31)
            if self.token_ids_from_server:
                body["return_tokens_as_token_ids"] = True
            if cons[i]:
                body["grammar"] = cons[i].gbnf()
            data = self._post("completions", body)
            choices = data.get("choices") or []
            if len(choices) != 1:
                raise BackendError(f"The endpoint returned {len(choices)} completions for 1 prompt.")
            c = choices[0]
            lp = c.get("logprobs") or {}
            text = c.get("text", "")
            pids = p if isinstance(p, list) else (self.tokenizer(p, add_special_tokens=False)["input_ids"] if self.tokenizer is not None else [])
            reason = "length" if c.get("finish_reason") == "length" else "stop"
            return GenerationOutput(list(pids), self._token_ids(lp.get("tokens") or [], text), text,
                                    [float(x) for x in (lp.get("token_logprobs") or []) if x is not None], [], reason)

        if len(prompt_list) == 1:
            return [one(0)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompt_list))) as pool:
            return list(pool.map(one, range(len(prompt_list))))

    def chat(
        self,
        conversations: Sequence[Messages],
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> list[GenerationOutput]:
        """One /chat/completions request per conversation, `concurrency` at a time."""

        def one(i: int) -> GenerationOutput:
            body: dict[str, Any] = {
                "model": self.model,
                "messages": [dict(m) for m in conversations[i]],
                "max_tokens": max_new_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "logprobs": True,
            }
            if stop:
                body["stop"] = list(stop)
            if seed is not None:
                body["seed"] = int(seed) + i
            data = self._post("chat/completions", body)
            c = data["choices"][0]
            text = c["message"].get("content") or ""
            content = (c.get("logprobs") or {}).get("content") or []
            lps = [float(t["logprob"]) for t in content]
            reason = "length" if c.get("finish_reason") == "length" else "stop"
            return GenerationOutput([], self._token_ids([t.get("token", "") for t in content], text), text, lps, [], reason)

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(one, range(len(conversations))))

    def apply_chat_template(self, messages: Messages, *, add_generation_prompt: bool = True, tokenize: bool = False) -> str | list[int]:
        if self.tokenizer is None:
            raise BackendError("The openai back end has no local tokenizer: pass tokenizer_path, or send conversations with chat().")
        res = self.tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=tokenize)
        return _as_chat_template_output(res, tokenize)

    def logprobs(self, sequences: Sequence[Sequence[int]], *, temperature: float = 1.0) -> Tensor:
        raise BackendError("The openai back end serves inference only and cannot score sequences for training; use the hf or vllm back end.")

    def load_weights(self, weights: Mapping[str, Tensor] | str | os.PathLike) -> None:
        raise BackendError("The openai back end cannot receive weights (the server owns them); use the hf or vllm back end for a trained model.")

    sync_weights = load_weights


# ---------------------------------------------------------------------------- choosing a back end

def load_backend(
    kind: str = "auto",
    model_path: str | os.PathLike | None = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    lora: LoraSettings | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    quiet: bool = False,
    **kwargs: Any,
) -> ModelBackend:
    """Build a back end: "auto" picks vllm when it is importable and CUDA is present, else hf.

    kind "openai" needs `base_url`; `model_path` is then the served model's name (and, when it is a
    local folder, its tokenizer), unless `served_model` names it. Extra keyword arguments go to the
    back end's constructor.
    Prints which back end and device it uses (unless quiet), so a run's log says so.
    """
    if kind not in ("auto", "hf", "vllm", "openai"):
        raise BackendError(f"Unknown model back end {kind!r}: choose auto, hf, vllm or openai.")
    if kind == "openai":
        if not base_url:
            raise BackendError("The openai back end needs base_url (e.g. http://127.0.0.1:8000/v1).")
        if model_path is None:
            raise BackendError("The openai back end needs the served model's name as model_path.")
        folder = Path(str(model_path)).expanduser()
        local = folder.joinpath("config.json").is_file() or folder.joinpath("tokenizer_config.json").is_file()
        served = kwargs.pop("served_model", None) or str(model_path)
        backend: ModelBackend = OpenAIBackend(base_url, served, api_key=api_key, tokenizer_path=folder if local else None, **kwargs)
    else:
        if model_path is None:
            raise BackendError(f"The {kind} back end needs model_path, a Hugging Face model folder.")
        if kind == "auto":
            kind = "vllm" if vllm_available() and torch.cuda.is_available() and lora is None else "hf"
        if kind == "vllm":
            if lora is not None:
                raise BackendError("The vllm back end here loads merged weights; set lora only on the hf (learner) back end.")
            backend = VLLMBackend(model_path, **({"dtype": dtype} if dtype != "auto" else {}), **kwargs)
        else:
            backend = HFBackend(model_path, device=device, dtype=dtype, lora=lora, **kwargs)
    if not quiet:
        print(f"[comprl] model back end: {backend.describe()}", flush=True)
    return backend


def inference_backend(model_cfg: Any, path: str | os.PathLike, *, num_threads: int | None = None, quiet: bool = False) -> ModelBackend:
    """What an inference role generates with (evaluation, A/B arms, the demo, a frozen actor or extractor),
    from a config's model section (trainers/config.py ModelSection): an OpenAI-compatible endpoint when
    `backend: openai` (the folder at `path` gives the tokenizer and chat template; prompts go as text), vLLM
    when `backend: vllm`, else transformers."""
    if model_cfg.backend == "openai":
        return load_backend("openai", path, base_url=model_cfg.base_url, served_model=model_cfg.served_model or Path(str(path)).name,
                            timeout=model_cfg.timeout_s, max_retries=model_cfg.max_retries, prompts_as_text=True,
                            want_logprobs=False, quiet=quiet)
    if model_cfg.backend == "vllm":
        return load_backend("vllm", path, quiet=quiet)
    return load_backend("hf", path, device=model_cfg.device, num_threads=num_threads, quiet=quiet)


# ---------------------------------------------------------------------------- tiny default models

# Qwen2's pre-tokenisation pattern (what transformers applies when it loads a Qwen2 folder's tokenizer).
QWEN2_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def build_tokenizer(texts: Iterable[str], vocab_size: int = 2048, *, min_frequency: int = 2, model_max_length: int = 4096) -> Any:
    """A byte-level BPE tokenizer trained on `texts`, with ChatML special tokens and template.

    Special tokens: <|endoftext|>, <|im_start|>, <|im_end|> (the EOS: it ends every assistant
    turn) and <|pad|> (a pad distinct from EOS, so masks never confuse the two). Byte-level means
    any text encodes, including characters never seen in training.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # The folder is saved as a Qwen2 model, and transformers loads a Qwen2 folder's tokenizer with
    # Qwen2's own normaliser and pre-tokeniser whatever tokenizer.json says. Train with exactly those,
    # so the tokenizer a run loads splits text as the one the warm start trained with. (With GPT-2's
    # ByteLevel regex, " 4" was one token in training and " ", "4" after loading: every number an
    # actor read, ALFWorld's "drawer 3" or an entry's "2 south", was a sequence it had never seen.)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        model_max_length=model_max_length,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_qwen2(
    tokenizer: Any,
    hidden: int = 256,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    mlp: int | None = None,
    max_pos: int = 4096,
    *,
    seed: int = 0,
) -> Any:
    """A randomly initialised Qwen2 causal LM sized to `tokenizer`, tied embeddings (a few M params).

    `mlp` defaults to 4 × hidden. Initialisation uses its own RNG seeded by `seed` (the global RNG
    is left alone), so the same arguments give the same model.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}) and heads by kv_heads ({kv_heads})")
    end_ids = sorted(_end_token_ids(tokenizer))
    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=mlp or 4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_pos,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = end_ids
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_model_folder(model: Any, tokenizer: Any, path: str | os.PathLike) -> Path:
    """save_pretrained both into one folder: what `load_backend("hf", path)` reads."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "comprl_model.json").write_text(json.dumps({"built_by": "comprl", "params": sum(p.numel() for p in model.parameters())}))
    return out

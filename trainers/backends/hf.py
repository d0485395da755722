"""The hf back end: transformers on CPU or CUDA with our own batched sampling loop (KV cache, left padding,
explicit position ids, shared-prefix and identical-prompt prefill, episode sessions, constrained rows), scoring
given sequences (the computation, shared with the learners, is logprobs.py) and in-place weight loading. Plus the
transformers cache helpers it needs."""
from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from trainers.backends.choices import ActionChoice, ChoiceState, ChoiceVocab, as_choice
from trainers.backends.common import (
    PREFIX_CACHE_MIN,
    BackendError,
    GenerationOutput,
    LoraSettings,
    Messages,
    Prompts,
    chat_generate,
    chat_template,
    check_model_folder,
    end_token_ids,
    pad_right,
    read_weights,
    write_weights,
)
from trainers.backends.logprobs import forward_switches, row_logprobs


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

        self.path = check_model_folder(model_path)
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
        self.end_ids = end_token_ids(self.tokenizer, getattr(self._base_model(), "generation_config", None))
        sw = forward_switches(self._base_model())  # what this model's forward and this transformers allow
        self.cache_kw = sw["cache_kw"]  # `cache` in transformers 5, `past_key_values` before
        # the learner projects only reply positions onto the vocabulary when the model allows it
        self.supports_logits_to_keep = sw["logits_to_keep"]
        # generate runs the prompts' shared prefix once (a cache repeated over the rows) where the cache can be repeated
        self.prefix_cache = sw["prefix_cache"]
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
        return chat_template(self.tokenizer, messages, add_generation_prompt=add_generation_prompt, tokenize=tokenize)

    def chat(self, conversations: Sequence[Messages], **generate_kwargs: Any) -> list[GenerationOutput]:
        return chat_generate(self, conversations, **generate_kwargs)

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
        directly. With grad=True the result carries the graph; otherwise it runs under no_grad in
        batches of `batch_size`. trainers/backends/logprobs.py computes them (the learners call it with their loss mask).
        """
        if not sequences:
            return torch.zeros((0, 0))
        ids, attn = pad_right(sequences, self.pad_id)  # (N, T)
        if grad:
            return row_logprobs(self, ids, attn, temperature=temperature)[0]
        bs = batch_size or self.max_batch_size
        width = ids.shape[1]
        parts = []
        with torch.no_grad(), self.lock:
            for s in range(0, ids.shape[0], bs):
                w = int(attn[s : s + bs].sum(-1).max())  # this batch's longest row: no all-padding columns
                lp = row_logprobs(self, ids[s : s + bs, :w], attn[s : s + bs, :w], temperature=temperature)[0]
                parts.append(torch.nn.functional.pad(lp, (0, width - w)))
        return torch.cat(parts, dim=0)

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
        items = read_weights(weights) if isinstance(weights, (str, os.PathLike)) else iter(weights.items())
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
            write_weights(self.state_dict_for_sync(), out / "model.safetensors")
        self.tokenizer.save_pretrained(str(out))
        return out


def _dynamic_cache() -> Any:
    try:
        from transformers import DynamicCache
    except ImportError:
        return None
    return DynamicCache


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


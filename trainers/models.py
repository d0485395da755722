"""Model back ends: the only module that knows which inference engine runs (DESIGN.md habit 6).

Rollouts and learners talk to a `ModelBackend`:

    backend = load_backend("auto", "path/to/hf-folder")        # prints which back end and device
    outs = backend.generate(prompt_ids, max_new_tokens=32, temperature=1.0, top_p=1.0,
                            stop=["\\n"], seed=derive_seed(run_seed, step, i))  # trainers/rollout.py
    outs[0].token_ids, outs[0].text, outs[0].logprobs        # sampled ids, text, (len,) log-probs
    lp = backend.logprobs([prompt + reply for ...])            # (N, T), aligned with the ids
    backend.sync_weights(learner.state_dict_for_sync())        # after each update

Three back ends, one module each under trainers/backends/ (what they share in `common.py`):
- `hf` (hf.py): transformers on CPU or CUDA, our own batched sampling loop with a KV cache (left padding,
  explicit position ids), bf16 on GPU, optional LoRA through peft. It also trains: `logprobs(...,
  grad=True)` and `trainable_parameters()`.
- `vllm` (vllm.py): rollouts on a GPU through vLLM's offline `LLM`, weights synced after each update through a
  worker extension (`collective_rpc`). Needs the `[gpu]` extra.
- `openai` (openai.py): any OpenAI-compatible HTTP endpoint (a vLLM server, a hosted model), inference only.

Which log-probs come back: `GenerationOutput.logprobs` are under the *raw* model (temperature 1, no
top-p) — exactly what `logprobs()` recomputes, so they serve as `logp_old` in the PPO/CISPO ratios
(vLLM's default "raw" log-probs are the same quantity). `sample_logprobs` are under the distribution
actually sampled from (after temperature and top-p); the hf back end fills them, for importance
corrections and entropy diagnostics.

Constrained replies (`generate(..., choices=[ActionChoice | admissible list | None, ...])`, trainers/backends/choices.py):
each back end keeps a reply on its row's allowed strings, the hf back end with a logits mask in its sampling loop, vLLM
through its structured outputs, an OpenAI-compatible llama.cpp server through a GBNF grammar. The log-probs rule above
holds: `logprobs` are the unmasked model's (see HFBackend.generate for why).

This module chooses a back end (`load_backend`, `inference_backend`) and is where callers import every back-end name
from; the tiny embedded default models are built in trainers/tiny.py (`build_tokenizer`, `build_tiny_qwen2`), whose
names are re-exported here too.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from trainers.backends.choices import ActionChoice, ChoiceState, ChoiceVocab, as_choice
from trainers.backends.common import BackendError, GenerationOutput, LoraSettings, ModelBackend, pad_right
from trainers.backends.hf import PREFIX_CACHE_MIN, HFBackend
from trainers.backends.openai import OpenAIBackend
from trainers.backends.vllm import VLLMBackend, VLLMWeightSyncExtension, vllm_available, vllm_structured_kwargs
from trainers.tiny import CHATML_TEMPLATE, SPECIAL_TOKENS, build_tiny_qwen2, build_tokenizer, save_model_folder

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
    "ChoiceState",
    "ChoiceVocab",
    "as_choice",
    "vllm_available",
    "vllm_structured_kwargs",
    "build_tokenizer",
    "build_tiny_qwen2",
    "save_model_folder",
    "pad_right",
    "PREFIX_CACHE_MIN",
    "CHATML_TEMPLATE",
    "SPECIAL_TOKENS",
]


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

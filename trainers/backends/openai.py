"""The openai back end: any OpenAI-compatible HTTP endpoint (a vLLM server, llama.cpp's server, a hosted model),
for inference only."""
from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from torch import Tensor

from trainers.backends.choices import ActionChoice, as_choice
from trainers.backends.common import BackendError, GenerationOutput, Messages, Prompts, chat_template, check_model_folder

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

            self.tokenizer = AutoTokenizer.from_pretrained(str(check_model_folder(tokenizer_path)))

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
                # each server reads its own field and ignores the other: llama.cpp a GBNF `grammar`, vLLM
                # `structured_outputs` (a choice list, or a regex where an open prefix leaves text free)
                body["grammar"] = cons[i].gbnf()
                body["structured_outputs"] = {"regex": cons[i].regex()} if cons[i].open_prefixes else {"choice": list(cons[i].actions)}
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
        return chat_template(self.tokenizer, messages, add_generation_prompt=add_generation_prompt, tokenize=tokenize)

    def logprobs(self, sequences: Sequence[Sequence[int]], *, temperature: float = 1.0) -> Tensor:
        raise BackendError("The openai back end serves inference only and cannot score sequences for training; use the hf or vllm back end.")

    def load_weights(self, weights: Mapping[str, Tensor] | str | os.PathLike) -> None:
        raise BackendError("The openai back end cannot receive weights (the server owns them); use the hf or vllm back end for a trained model.")

    sync_weights = load_weights

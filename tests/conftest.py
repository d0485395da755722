"""Shared fixtures: real parts only (the packaged MiniLM embedder, SQLite on disk)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def embedder():
    from core.embedding import Embedder

    return Embedder()


@pytest.fixture()
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'workbench.db'}"


@pytest.fixture()
def store(db_url: str):
    from core.store import ExperienceStore

    s = ExperienceStore(db_url)
    yield s
    s.close()

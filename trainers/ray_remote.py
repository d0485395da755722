"""The ExperienceManager and the rollout engine as Ray actors, with the driver-side handles that stand in for them
(`RemoteManager`, `RemoteEngine`); trainers/ray_exec.py places them on the cluster beside the env actors.

- The manager actor dies: Ray restarts it, its constructor rebuilds the index from the store (everything written
  went through the store first, so nothing is lost), and the caller's call is retried. A retried write skips the
  operations the store shows as already applied, so an interrupted write is not applied twice.
- The engine actor holds the hf or the vllm back end: it generates and loads the learner's weights through the object
  store.
"""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any, Sequence

from core.config import ConfigError, LibraryConfig
from core.embedding import Embedder
from core.manager import ExperienceManager, OpContext
from core.store import ExperienceStore
from core.types import Operation, OpResult, Status

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage reporting (set before Ray is imported)

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayError
except ImportError:  # RunConfig refuses executor ray without it; this names the fix for direct users
    raise ConfigError("run.executor ray needs Ray: pip install -e '.[ray]'") from None

ACTOR_START_TIMEOUT_S = 180.0  # actors not placed by then: the cluster lacks the CPUs they reserve


def check_store_url(url: str) -> None:
    """Actors open the store themselves: an in-memory SQLite database exists only in its own process."""
    if url.startswith("sqlite") and (url in ("sqlite://", "sqlite:///:memory:") or ":memory:" in url):
        raise ConfigError("run.executor ray needs a store every process can open: a SQLite file (the default) or a "
                          "Postgres URL, not an in-memory SQLite database")


# -- the ExperienceManager ----------------------------------------------------------------------------------

# the manager's plain methods a caller may reach through the actor (run in a thread, off the actor's event loop)
_SYNC_METHODS = frozenset({"entry_texts", "active_count", "sync", "latency_percentiles", "training_stats", "record_trained",
                           "record_outcomes", "validate", "state_dict", "load_state_dict"})


class ManagerActor:
    """The ExperienceManager in its own process. An async actor: concurrent callers' searches wait together on the
    manager's micro-batcher, so queries from every rollout worker meet in the same batches."""

    def __init__(self, db_url: str, library: LibraryConfig, seed: int, run_id: int | None = None) -> None:
        # start() rebuilds the index from the store: the same on a first start and after a restart
        self.m = ExperienceManager(ExperienceStore(db_url), Embedder(library.embedding), library.manager, library.index,
                                   seed=seed, run_id=run_id)
        self.incarnation = uuid.uuid4().hex

    async def search(self, queries: list[str], k: int | None, task: Any, scope: Any, step: int | None = None) -> list[list[Any]]:
        return await self.m.search(queries, k=k, task=task, scope=scope, step=step)

    async def apply_operations(self, ops: list[Operation], ctx: Any, retried: bool) -> list[OpResult]:
        return await asyncio.to_thread(self._apply, ops, ctx, retried)

    async def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        if name not in _SYNC_METHODS:
            raise AttributeError(f"the manager actor does not serve {name!r}")
        return await asyncio.to_thread(getattr(self.m, name), *args, **kwargs)

    async def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "incarnation": self.incarnation,
                "size": self.m.active_count(), "version": self.m.version, "stats": dict(self.m.stats)}

    async def close(self) -> None:
        await asyncio.to_thread(self.m.close)

    def _apply(self, ops: list[Operation], ctx: Any, retried: bool) -> list[OpResult]:
        if not retried:
            return self.m.apply_operations(ops, ctx)
        # A retry after the actor died mid-write: each operation commits on its own, so some may be in the store.
        done = {i: r for i, op in enumerate(ops) if (r := self._already_applied(op, ctx)) is not None}
        rest = self.m.apply_operations([op for i, op in enumerate(ops) if i not in done], ctx) if len(done) < len(ops) else []
        it = iter(rest)
        return [done[i] if i in done else next(it) for i in range(len(ops))]

    def _already_applied(self, op: Operation, ctx: Any) -> OpResult | None:
        store = self.m.store
        if op.kind == "discard":
            found = store.get_many(op.ids)
            gone = len(found) == len(op.ids) and all(e.status is not Status.ACTIVE for e in found.values())
            return OpResult(op, True, archived=[]) if gone else None
        if op.kind not in ("add", "update"):
            return None
        recent = store.list_entries(env=ctx.env or None, task=ctx.task or None, status=None, sort="id", descending=True,
                                    limit=200).entries
        for e in recent:
            if (e.text == op.text and e.run_id == ctx.run_id and e.created_step == ctx.step
                    and e.source_episode_id == ctx.episode_id and (op.kind == "add" or set(op.ids) <= set(e.parent_ids))):
                return OpResult(op, True, new_id=e.id, archived=list(op.ids) if op.kind == "update" else [])
        return None


class RemoteManager:
    """ExperienceManager's interface over the actor handle, for the Roller, the distillation consumer and the
    loop: plain values in and out. A call that finds the actor dead, or that gets no answer within
    `call_timeout_s` (the actor is then killed, so Ray restarts it), is sent again until Ray has restarted it;
    after `restart_timeout_s` of that the caller gets a RuntimeError that names the actor."""

    def __init__(self, handle: Any, *, call_timeout_s: float, restart_timeout_s: float) -> None:
        self.actor = handle
        self.call_timeout_s = call_timeout_s
        self.restart_timeout_s = restart_timeout_s
        self.retried_calls = 0
        self._closed = False

    @classmethod
    def start(cls, db_url: str, library: LibraryConfig, *, seed: int, run_id: int | None = None, cpus: float = 0.5,
              call_timeout_s: float = 120.0, restart_timeout_s: float = 300.0, node_id: str | None = None) -> "RemoteManager":
        check_store_url(db_url)
        opts: dict[str, Any] = dict(max_restarts=-1, max_task_retries=0, num_cpus=cpus, max_concurrency=1000)
        if node_id is not None:  # a SQLite file lives on the driver's disk: the manager must run beside it
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        handle = ray.remote(ManagerActor).options(**opts).remote(db_url, library, seed, run_id)
        rm = cls(handle, call_timeout_s=call_timeout_s, restart_timeout_s=restart_timeout_s)
        try:
            rm.info(timeout=ACTOR_START_TIMEOUT_S)
        except GetTimeoutError:
            ray.kill(handle, no_restart=True)
            raise RuntimeError(f"the ExperienceManager actor did not start within {ACTOR_START_TIMEOUT_S:g} s: it reserves "
                               f"ray.manager_cpus={cpus:g} CPUs; check `ray status`") from None
        return rm

    # -- the calls ---------------------------------------------------------------------------------------

    def _call(self, submit, what: str) -> Any:  # noqa: ANN001 - submit(attempt) -> ObjectRef
        # A call to an actor that Ray is restarting fails at once (ActorUnavailableError), and a restart loads the
        # embedder again (seconds; a minute on a loaded machine): retry on a short period until restart_timeout_s.
        deadline: float | None = None
        attempt = 0
        while True:
            try:
                return ray.get(submit(attempt), timeout=self.call_timeout_s)
            except RayActorError as e:
                last: Exception = e
            except GetTimeoutError as e:
                last = e
                ray.kill(self.actor, no_restart=False)  # hung: Ray restarts it; the call is retried
            deadline = deadline or time.monotonic() + self.restart_timeout_s
            if time.monotonic() > deadline:
                raise RuntimeError(f"the ExperienceManager actor did not answer {what} within ray.restart_timeout_s="
                                   f"{self.restart_timeout_s:g} s of retries ({type(last).__name__}); check the actor's log "
                                   "(ray logs) or raise ray.restart_timeout_s") from last
            attempt += 1
            self.retried_calls += 1
            time.sleep(min(0.25 * 2 ** attempt, 2.0))

    def search_sync(self, queries: Sequence[str], k: int | None = None, task: Any = None, timeout: float | None = None,
                    scope: Sequence[str | None] | None = None, step: int | None = None) -> list[list[Any]]:
        args = (list(queries), k, list(task) if isinstance(task, (list, tuple)) else task,
                list(scope) if scope is not None else None, step)
        return self._call(lambda _: self.actor.search.remote(*args), "search")

    async def search(self, queries: Sequence[str], k: int | None = None, task: Any = None,
                     scope: Sequence[str | None] | None = None, step: int | None = None) -> list[list[Any]]:
        return await asyncio.to_thread(self.search_sync, queries, k, task, None, scope, step)

    def apply_operations(self, ops: Sequence[Operation], ctx: Any = None) -> list[OpResult]:
        ops, ctx = list(ops), ctx or OpContext()
        return self._call(lambda attempt: self.actor.apply_operations.remote(ops, ctx, attempt > 0), "apply_operations")

    def _plain(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._call(lambda _: self.actor.call.remote(name, args, kwargs), name)

    def entry_texts(self, ids: Sequence[int]) -> dict[int, str]:
        return self._plain("entry_texts", list(ids))

    def active_count(self) -> int:
        return self._plain("active_count")

    def sync(self, full: bool = False) -> int:
        return self._plain("sync", full)

    def latency_percentiles(self, since: int = 0) -> tuple[dict[str, float], int]:
        lat, count = self._plain("latency_percentiles", since)
        return lat, count

    def training_stats(self, entry_ids: Sequence[int]) -> dict[int, tuple[int, int | None]]:
        return self._plain("training_stats", list(entry_ids))

    def record_trained(self, entry_ids: Sequence[int], step: int, **kw: Any) -> None:
        self._plain("record_trained", list(entry_ids), step, **kw)

    def record_outcomes(self, usages: Sequence[tuple[int, bool, float]], **kw: Any) -> None:
        self._plain("record_outcomes", list(usages), **kw)

    def validate(self, op: Operation) -> str:
        return self._plain("validate", op)

    def state_dict(self) -> dict[str, Any]:
        return self._plain("state_dict")

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self._plain("load_state_dict", st)

    def info(self, timeout: float | None = None) -> dict[str, Any]:
        """pid, node, incarnation, library size and version of the actor."""
        return ray.get(self.actor.info.remote(), timeout=timeout or self.call_timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            ray.get(self.actor.close.remote(), timeout=30)  # the retrieval counters still queued reach the store
        except RayError:
            pass
        ray.kill(self.actor, no_restart=True)


# -- the rollout engine ---------------------------------------------------------------------------------------


class EngineActor:
    """The rollout engine (the hf or the vllm back end) in its own Ray worker: generates, and loads the learner's
    weights."""

    def __init__(self, path: str, threads: int | None, backend: str = "hf") -> None:
        # the models (and torch) are imported here, not at the top: every env and manager actor imports this module
        from trainers.models import HFBackend, load_backend

        self.b = load_backend("vllm", path, quiet=True) if backend == "vllm" else HFBackend(path, device="cpu", num_threads=threads)
        self.incarnation = uuid.uuid4().hex  # a new value each time Ray (re)starts the actor (with the folder's weights)

    def generate(self, prompts: list[list[int]], kwargs: dict[str, Any]) -> tuple[list[Any], int, str]:
        return self.b.generate(prompts, **kwargs), self.b.prefill_computed, self.incarnation

    def sync_weights(self, weights: dict[str, Any]) -> str:
        self.b.load_weights(weights)
        return self.incarnation

    def drop_sessions(self, keys: list[Any] | None) -> None:
        if hasattr(self.b, "drop_sessions"):  # vLLM keeps no sessions: its prefix cache does that work
            self.b.drop_sessions(keys)

    def describe(self) -> str:
        return self.b.describe()

    def pid(self) -> int:
        return os.getpid()


class RemoteEngine:
    """The rollout back end's interface (apply_chat_template, generate, sync_weights, drop_sessions, describe) over an
    engine actor. Prompts are built here with the model's own tokenizer; generation runs in the actor. Weights go
    through Ray's object store; the last ones are kept there, so an engine that Ray restarted (with the folder's
    initial weights) is given them again before the call is retried: a rollout never samples from a stale policy."""

    def __init__(self, path: str, *, threads: int | None = None, cpus: float = 1.0,
                 restart_timeout_s: float = 300.0, backend: str = "hf") -> None:
        import torch
        from transformers import AutoTokenizer

        self.path = path
        self.kind = backend
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = torch.device("cpu")
        self.restart_timeout_s = restart_timeout_s
        self.actor = ray.remote(EngineActor).options(max_restarts=-1, max_task_retries=0, num_cpus=cpus).remote(path, threads, backend)
        self._weights: Any = None  # ObjectRef of the weights last synced
        self._synced: str | None = None  # the actor incarnation that holds them
        self.prefill_computed = 0
        self.retried_calls = 0
        self._described = ray.get(self.actor.describe.remote(), timeout=ACTOR_START_TIMEOUT_S)

    def describe(self) -> str:
        return f"ray actor: {self._described}"

    def apply_chat_template(self, messages: Any, *, add_generation_prompt: bool = True, tokenize: bool = False) -> Any:
        from trainers.backends.common import chat_template

        return chat_template(self.tokenizer, messages, add_generation_prompt=add_generation_prompt, tokenize=tokenize)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _call(self, submit) -> Any:  # noqa: ANN001
        deadline = time.monotonic() + self.restart_timeout_s
        while True:
            try:
                return ray.get(submit())
            except RayActorError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the rollout engine actor did not come back within ray.restart_timeout_s="
                                       f"{self.restart_timeout_s:g} s") from None
                self.retried_calls += 1
                time.sleep(1.0)

    def generate(self, prompts: Sequence[Sequence[int]], **kwargs: Any) -> list[Any]:
        prompts = [list(p) for p in prompts]
        while True:
            outs, computed, incarnation = self._call(lambda: self.actor.generate.remote(prompts, kwargs))
            if self._weights is None or incarnation == self._synced:
                self.prefill_computed = computed
                return outs
            # answered by an engine Ray restarted (the folder's weights): give it the learner's, generate again
            self._synced = self._call(lambda: self.actor.sync_weights.remote(self._weights))

    def sync_weights(self, weights: Any) -> None:
        self._weights = ray.put({k: v.detach().cpu() for k, v in weights.items()})
        self._synced = self._call(lambda: self.actor.sync_weights.remote(self._weights))

    load_weights = sync_weights

    def drop_sessions(self, keys: Any = None) -> None:
        self._call(lambda: self.actor.drop_sessions.remote(None if keys is None else list(keys)))

    def close(self) -> None:
        ray.kill(self.actor, no_restart=True)

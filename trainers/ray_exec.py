"""Past one machine: a run's env workers and its ExperienceManager as Ray actors (`run.executor: ray`).

    cluster = RayCluster(cfg)                       # ray.init: a local cluster, or the one at ray.address
    pool = cluster.env_pool(factories)              # EnvPool's interface over ray.env_actors env actors
    manager = cluster.manager(db_url, cfg)          # ExperienceManager's interface over one async actor
    ...                                             # the same train() as local (trainers/cotrain.py)
    cluster.close()

The driver keeps the loop and the learners; the rollout engine too unless `ray.rollout_engine` puts it in an actor
(`cluster.rollout_engine(learner)`, weights synced through the object store). The store stays the meeting point (a SQLite
file on one machine, Postgres for several), so the workbench watches a Ray run like any other.

Faults, with Ray's own restarts (`max_restarts=-1`), no scheduler of our own:
- An env actor that dies or hangs past `ray.step_timeout_s` mid-episode: the episodes of its slots end as
  failures (`info["error"]` says why), exactly as a dead worker process of the local EnvPool; Ray restarts the
  actor, whose envs are rebuilt on the next reset, and the step completes with the other actors' episodes.
- The manager actor dies: Ray restarts it, its constructor rebuilds the index from the store (everything
  written went through the store first, so nothing is lost), and the caller's call is retried. A retried write
  skips the operations the store shows as already applied, so an interrupted write is not applied twice.
"""
from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from typing import Any, Sequence

from core.config import ConfigError, LibraryConfig
from core.embedding import Embedder
from core.manager import ExperienceManager, OpContext
from core.store import ExperienceStore
from core.types import Operation, OpResult, Status
from envs.pool import EnvSpec, SlotPoolAPI, SlotResult, _failure, _Replayable, close_envs, serve_command

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage reporting (set before Ray is imported)

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayError
except ImportError:  # RunConfig refuses executor ray without it; this names the fix for direct users
    raise ConfigError("run.executor ray needs Ray: pip install -e '.[ray]'") from None

LOCAL_OBJECT_STORE_BYTES = 256 * 1024**2  # a local cluster's object store: the run moves episodes and hits, not tensors
ACTOR_START_TIMEOUT_S = 180.0  # actors not placed by then: the cluster lacks the CPUs they reserve


# -- the cluster ------------------------------------------------------------------------------------------


class RayCluster:
    """The run's connection to Ray: starts a local cluster (ray.address empty) or joins one, and makes the
    actors. A cluster this object started is shut down by close(); a joined one is only left."""

    def __init__(self, cfg) -> None:  # noqa: ANN001 - trainers.config.RunConfig
        self.cfg = cfg
        rc = cfg.ray
        self.started = False
        if not ray.is_initialized():
            common = dict(include_dashboard=False, log_to_driver=True, ignore_reinit_error=True)
            if rc.address:
                if rc.address != "auto" and check_reachable(rc.address) in ("127.0.0.1", "localhost"):
                    loopback_only()  # else Ray rewrites the address to this machine's interface and waits for ever
                ray.init(address=rc.address, **common)
            else:
                # loopback only; a small object store (the default takes 30% of the machine's memory)
                loopback_only()
                ray.init(num_cpus=rc.num_cpus or None, _node_ip_address="127.0.0.1",
                         object_store_memory=LOCAL_OBJECT_STORE_BYTES, **common)
            self.started = True
        self.node_id = ray.get_runtime_context().get_node_id()
        self._actors: list[Any] = []

    def describe(self) -> str:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        cpus = ray.cluster_resources().get("CPU", 0)
        where = "a local cluster started by this run" if self.started and not self.cfg.ray.address else \
            f"the cluster at {self.cfg.ray.address or 'this process’s ray.init'}"
        return f"executor ray: {where}, {len(nodes)} node(s), {cpus:g} CPUs"

    def placement(self, pool: "RayEnvPool", manager: "RemoteManager | None") -> str:
        """Where the actors run, for the run's log: `4 env actors on 2 node(s); the manager beside the driver`."""
        nodes = {i["node_id"] for i in pool.actor_info()}
        out = f"{len(pool.actors)} env actor(s) on {len(nodes)} node(s)"
        if manager is not None:
            out += f"; the manager on {'the driver’s node' if manager.info()['node_id'] == self.node_id else 'another node'}"
        return out

    def env_pool(self, envs: Sequence[EnvSpec]) -> "RayEnvPool":
        rc = self.cfg.ray
        return RayEnvPool(envs, num_actors=rc.env_actors or self.cfg.run.threads or 2, step_timeout_s=rc.step_timeout_s,
                          actor_cpus=rc.env_actor_cpus)

    def manager(self, db_url: str, cfg=None, run_id: int | None = None) -> "RemoteManager":  # noqa: ANN001
        cfg = cfg or self.cfg
        return RemoteManager.start(db_url, cfg.library, seed=cfg.run.seed, run_id=run_id, cpus=cfg.ray.manager_cpus,
                                   call_timeout_s=cfg.ray.call_timeout_s, restart_timeout_s=cfg.ray.restart_timeout_s,
                                   node_id=self.node_id if db_url.startswith("sqlite") else None)

    def rollout_engine(self, learner) -> "RemoteEngine":  # noqa: ANN001 - trainers.models.HFBackend
        """The rollout engine as an actor, given the learner's weights at once (the folder may be an older policy)."""
        rc = self.cfg.ray
        engine = RemoteEngine(str(learner.path), threads=self.cfg.run.threads or None, cpus=rc.engine_cpus,
                              restart_timeout_s=rc.restart_timeout_s)
        engine.sync_weights(learner.state_dict_for_sync())
        return engine

    def close(self) -> None:
        if self.started and ray.is_initialized():
            ray.shutdown()


def check_reachable(address: str, timeout_s: float = 10.0) -> str:
    """The host of `ray.address` once something answers on its port: `ray.init` itself waits for minutes on a wrong
    one without a word."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"ray.address must be 'auto' or HOST:PORT (the head's port, 6379 by default), not {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(f"ray.address {address}: nothing answers there ({e.strerror or e}); start the head with "
                          f"`ray start --head --port={port}` or correct the address") from None
    return host


def loopback_only() -> None:
    """Make Ray take 127.0.0.1 as this machine's address. Without this, a cluster started with
    `_node_ip_address="127.0.0.1"` still has its workers report (and reach each other on) the machine's network
    interface, and an address of 127.0.0.1 given to join a cluster is rewritten to it. Ray reads the switch at call
    time in this process and from the environment in the processes it starts. Only for one machine: a worker node
    on another machine could not reach a head node that lives on loopback."""
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"


def check_store_url(url: str) -> None:
    """Actors open the store themselves: an in-memory SQLite database exists only in its own process."""
    if url.startswith("sqlite") and (url in ("sqlite://", "sqlite:///:memory:") or ":memory:" in url):
        raise ConfigError("run.executor ray needs a store every process can open: a SQLite file (the default) or a "
                          "Postgres URL, not an in-memory SQLite database")


# -- env workers ------------------------------------------------------------------------------------------


class EnvActor:
    """A share of the env slots in one Ray worker process, served as the local pool's worker serves them."""

    def __init__(self, specs: dict[int, EnvSpec]) -> None:
        self.specs = specs
        self.envs: dict[int, Any] = {}
        self.incarnation = uuid.uuid4().hex  # a new value each time Ray (re)starts the actor
        self._done: list[SlotResult] = []  # the answers of the call in flight so far (progress() reads them)

    def run(self, commands: list[tuple[str, int, Any]]) -> tuple[str, list[SlotResult]]:
        self._done = done = []
        for cmd, slot, arg in commands:
            done.append(serve_command(self.envs, self.specs, cmd, slot, arg))
        return self.incarnation, done

    def progress(self) -> tuple[str, list[SlotResult]]:
        """The answers the call in flight has so far (the actor serves this from a second thread while `run` is stuck
        in a hung env): the command after them is the one that hung."""
        return self.incarnation, list(self._done)

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "incarnation": self.incarnation,
                "ip": ray.util.get_node_ip_address()}

    def close(self) -> None:
        close_envs(self.envs)


class RayEnvPool(SlotPoolAPI):
    """EnvPool's interface (reset_many, step_many, expert_many, restarts, close) over Ray actors: slot i lives in
    actor i % num_actors, whose slots are stepped one after the other in one call per step. A dead or silent actor
    fails its unanswered commands and every running episode it held, and Ray restarts it."""

    def __init__(self, envs: Sequence[EnvSpec], num_actors: int | None = None, *, step_timeout_s: float = 30.0,
                 reset_timeout_s: float | None = None, actor_cpus: float = 0.5) -> None:
        if not envs:
            raise ValueError("RayEnvPool needs at least one env (a registry name or a factory)")
        self.specs = list(envs)
        self.num_workers = max(1, min(num_actors or len(self.specs), len(self.specs)))
        self.step_timeout_s = float(step_timeout_s)
        self._cpus = actor_cpus
        self.reset_timeout_s = float(reset_timeout_s if reset_timeout_s is not None else max(60.0, step_timeout_s))
        # SPREAD: the actors go to different nodes where there are several; max_task_retries=0: a step is never
        # replayed on a fresh env (its episode is lost with the actor; the driver records the failure)
        # max_concurrency 2: progress() answers while run() is stuck in a hung env (it only reads the answers so far)
        cls = ray.remote(EnvActor).options(max_restarts=-1, max_task_retries=0, num_cpus=actor_cpus,
                                           scheduling_strategy="SPREAD", max_concurrency=2)
        self.actors = [cls.remote({s: self.specs[s] for s in range(len(self.specs)) if s % self.num_workers == w})
                       for w in range(self.num_workers)]
        self._incarnation: list[str | None] = [None] * self.num_workers
        self._restarts = 0
        self._live: dict[int, str] = {}  # slot -> the incarnation of its actor that holds its running episode
        self._episodes: dict[int, _Replayable] = {}  # live slot -> how to replay its episode in a restarted actor
        self.replays = 0  # episodes rebuilt in a restarted actor after a neighbour's env hung
        try:
            infos = ray.get([a.info.remote() for a in self.actors], timeout=ACTOR_START_TIMEOUT_S)
        except GetTimeoutError:
            self.close()
            raise RuntimeError(f"the {self.num_workers} env actors did not start within {ACTOR_START_TIMEOUT_S:g} s: each "
                               f"reserves ray.env_actor_cpus={actor_cpus:g} CPUs; check `ray status` for free CPUs or "
                               "lower ray.env_actors / ray.env_actor_cpus") from None
        self._incarnation = [i["incarnation"] for i in infos]

    def restarts(self) -> int:
        return self._restarts

    def actor_info(self) -> list[dict[str, Any]]:
        """pid, node and incarnation of each actor (tests kill one by its pid; the run describes placement)."""
        return ray.get([a.info.remote() for a in self.actors], timeout=ACTOR_START_TIMEOUT_S)

    def close(self) -> None:
        for a in self.actors:
            try:
                ray.get(a.close.remote(), timeout=10)
            except RayError:
                pass
            ray.kill(a, no_restart=True)
        self.actors = []

    def __enter__(self) -> "RayEnvPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internals

    def _run(self, commands: list[tuple[str, int, Any]], timeout_s: float) -> list[SlotResult]:
        for _, slot, _ in commands:
            if not 0 <= slot < len(self.specs):
                raise IndexError(f"slot {slot} out of range: the pool has {len(self.specs)} slots")
        results: dict[int, SlotResult] = {}
        by_actor: dict[int, list[int]] = {}
        for i, (cmd, slot, _) in enumerate(commands):
            if cmd != "reset" and slot not in self._live:
                results[i] = _failure(slot, "no running episode in this slot (its env actor was restarted, "
                                            "or reset was never called): call reset_many first")
                continue
            by_actor.setdefault(slot % self.num_workers, []).append(i)
        # resets are safe to send again (they rebuild the env): a reset that meets an actor Ray is still
        # restarting is retried until the reset timeout; a step is never replayed
        deadline = time.monotonic() + timeout_s
        todo = by_actor
        while todo:
            retry, again = self._gather(todo, commands, results, timeout_s)
            if again:  # a neighbour hung; its actor was restarted and these slots' episodes replayed: a fresh clock
                deadline = time.monotonic() + timeout_s
                for w, idx in again.items():
                    retry.setdefault(w, []).extend(idx)
                todo = retry
                continue
            if retry and time.monotonic() > deadline:
                # e.g. its node was lost and no other node has the CPUs it reserves: the run stops here with this
                # message (its last checkpoint is kept; `comprl train --resume ID` once the cluster has room)
                raise RuntimeError(f"env actor(s) {sorted(retry)} could not be restarted within {timeout_s:g} s (a lost node, "
                                   f"and no free {self._cpus:g} CPUs elsewhere? see `ray status`)")
            if not retry:
                break
            time.sleep(0.5)
            todo = retry
        return [results[i] for i in range(len(commands))]

    def _gather(self, by_actor: dict[int, list[int]], commands: list[tuple[str, int, Any]], results: dict[int, SlotResult],
                timeout_s: float) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """One call per actor, answers gathered as they come; returns (the resets to send again after an actor died,
        the commands to send again after a hung neighbour's actor was restarted and their episodes replayed)."""
        t0 = time.monotonic()
        refs = {self.actors[w].run.remote([commands[i] for i in idx]): w for w, idx in by_actor.items()}
        # an actor steps its slots one after the other: its budget is the per-command timeout times their number
        deadline = {w: t0 + timeout_s * len(idx) for w, idx in by_actor.items()}
        retry: dict[int, list[int]] = {}
        again: dict[int, list[int]] = {}
        while refs:
            wait_s = max(0.0, min(deadline[w] for w in refs.values()) - time.monotonic())
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=wait_s)
            for ref in ready:
                w = refs.pop(ref)
                idx = by_actor[w]
                try:
                    incarnation, outs = ray.get(ref)
                except RayActorError as e:
                    if all(commands[i][0] == "reset" for i in idx):
                        self._mark_dead(w)
                        retry[w] = idx
                    else:
                        self._fail(w, idx, commands, results, f"env actor died ({type(e).__name__}); Ray restarts it")
                    continue
                except RayError as e:
                    self._fail(w, idx, commands, results, f"env actor call failed: {type(e).__name__}: {e}")
                    continue
                self._seen(w, incarnation)
                for i, out in zip(idx, outs):
                    self._take(commands[i], out, incarnation, results, i)
            now = time.monotonic()
            for ref, w in [(r, w) for r, w in refs.items() if deadline[w] <= now]:
                del refs[ref]
                again_w = self._hung(w, by_actor[w], commands, results, timeout_s)
                if again_w:
                    again[w] = again_w
        return retry, again

    def _take(self, command: tuple[str, int, Any], out: SlotResult, incarnation: str, results: dict[int, SlotResult],
              i: int) -> None:
        """Keep one answer: the result, whether the slot's episode runs on, and what replaying it would need."""
        cmd, slot, arg = command
        if cmd != "reset" and self._live.get(slot) != incarnation and out.error:
            out = _failure(slot, "its env actor was restarted since this episode's reset: the episode is lost")
        results[i] = out
        if cmd == "reset" and not out.error:
            self._live[slot] = incarnation
            self._episodes[slot] = _Replayable(arg[0], arg[1], out.obs)
        elif cmd == "step" and slot in self._episodes and not out.error:
            self._episodes[slot].steps.append((arg, out.obs))
        if out.error or out.done:
            self._live.pop(slot, None)
            self._episodes.pop(slot, None)

    def _hung(self, w: int, idx: list[int], commands: list[tuple[str, int, Any]], results: dict[int, SlotResult],
              timeout_s: float) -> list[int]:
        """Actor w did not answer in time. Its answers so far stand (progress()); the command after them hung: that
        episode fails. The actor is restarted and every other episode it held replayed there (reset with the same
        seed and options, then the same actions, each observation checked); returns the commands to send again (those
        of replayed slots, and resets). As the process pool does (envs/pool.py)."""
        done: list[SlotResult] = []
        incarnation = self._incarnation[w]
        try:
            incarnation, done = ray.get(self.actors[w].progress.remote(), timeout=10)
        except (RayError, GetTimeoutError):
            done = []  # it cannot say: every unanswered command of it is treated as the culprit's neighbour
        for i, out in zip(idx, done):
            self._take(commands[i], out, incarnation, results, i)
        rest = idx[len(done):]
        ray.kill(self.actors[w], no_restart=False)  # Ray restarts it with fresh envs
        self._restarts += 1
        self._incarnation[w] = "dead"  # counted here; the new incarnation's first answer is not a second restart
        # ray.kill is asynchronous, and the old process still serves calls from its second thread: wait for the new one
        t_end = time.monotonic() + ACTOR_START_TIMEOUT_S
        while time.monotonic() < t_end:
            try:
                if ray.get(self.actors[w].info.remote(), timeout=max(1.0, t_end - time.monotonic()))["incarnation"] != incarnation:
                    break
            except (RayError, GetTimeoutError):
                pass
            time.sleep(0.1)
        reason = f"no answer within {timeout_s:g} s per command (env hung); the env actor was restarted"
        if not rest:
            held_out = None
        else:
            held_out = commands[rest[0]][1]
            results[rest[0]] = _failure(held_out, reason)
        self._live.pop(held_out, None)
        self._episodes.pop(held_out, None)
        held = sorted(s for s in self._live if s % self.num_workers == w)
        lost: dict[int, str] = {}
        for slot in held:
            why = self._replay(w, slot, self._episodes.pop(slot), timeout_s)
            if why is not None:
                lost[slot] = why
                self._live.pop(slot, None)
        send = []
        for i in rest[1:]:
            cmd, slot, _ = commands[i]
            if cmd == "reset" or slot in self._live:
                send.append(i)
            else:
                results[i] = _failure(slot, f"env actor restarted because slot {held_out} hung: {reason}; this episode "
                                            f"was lost: {lost.get(slot, 'it held no running episode')}")
        return send

    def _replay(self, w: int, slot: int, ep: _Replayable, timeout_s: float) -> str | None:
        """Rebuild one episode in the restarted actor w. None when it came back the same, else why not."""
        batch = [("reset", slot, (ep.seed, ep.options))] + [("step", slot, a) for a, _ in ep.steps]
        deadline = time.monotonic() + max(self.reset_timeout_s, ACTOR_START_TIMEOUT_S) + timeout_s * len(ep.steps)
        while True:
            try:
                incarnation, outs = ray.get(self.actors[w].run.remote(batch),
                                            timeout=max(1.0, deadline - time.monotonic()))
                break
            except RayActorError:  # still restarting
                if time.monotonic() > deadline:
                    return "its env actor did not come back in time to replay it"
                time.sleep(0.5)
            except (GetTimeoutError, RayError) as e:  # the replay hung too: restart the actor again
                ray.kill(self.actors[w], no_restart=False)
                self._restarts += 1
                self._incarnation[w] = "dead"
                return f"its replay did not answer in time ({type(e).__name__})"
        self._incarnation[w] = incarnation
        want = [ep.reset_obs] + [o for _, o in ep.steps]
        if any(o.error for o in outs):
            return f"its replay failed: {next(o.error for o in outs if o.error).splitlines()[0]}"
        if [o.obs for o in outs] != want or any(o.done for o in outs):
            return "its replay came out different (the env is not deterministic given its seed and actions)"
        self._live[slot] = incarnation
        self._episodes[slot] = ep
        self.replays += 1
        return None

    def _seen(self, w: int, incarnation: str) -> None:
        if self._incarnation[w] not in (None, "dead") and self._incarnation[w] != incarnation:
            self._restarts += 1  # restarted between calls (killed from outside)
            self._drop_live(w)
        self._incarnation[w] = incarnation

    def _mark_dead(self, w: int) -> None:
        if self._incarnation[w] != "dead":
            self._restarts += 1
        self._incarnation[w] = "dead"
        self._drop_live(w)

    def _drop_live(self, w: int) -> None:
        for slot in [s for s in self._live if s % self.num_workers == w]:
            del self._live[slot]
            self._episodes.pop(slot, None)

    def _fail(self, w: int, unanswered: list[int], commands: list[tuple[str, int, Any]], results: dict[int, SlotResult],
              reason: str) -> None:
        self._mark_dead(w)
        first = commands[unanswered[0]][1] if unanswered else None
        for i in unanswered:
            slot = commands[i][1]
            results[i] = _failure(slot, reason if slot == first else f"env actor restarted because slot {first} failed: {reason}")


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
    """The rollout engine (the hf back end) in its own Ray worker: generates, and loads the learner's weights."""

    def __init__(self, path: str, threads: int | None) -> None:
        # the models (and torch) are imported here, not at the top: every env and manager actor imports this module
        from trainers.models import HFBackend

        self.b = HFBackend(path, device="cpu", num_threads=threads)
        self.incarnation = uuid.uuid4().hex  # a new value each time Ray (re)starts the actor (with the folder's weights)

    def generate(self, prompts: list[list[int]], kwargs: dict[str, Any]) -> tuple[list[Any], int, str]:
        return self.b.generate(prompts, **kwargs), self.b.prefill_computed, self.incarnation

    def sync_weights(self, weights: dict[str, Any]) -> str:
        self.b.load_weights(weights)
        return self.incarnation

    def drop_sessions(self, keys: list[Any] | None) -> None:
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

    kind = "hf"

    def __init__(self, path: str, *, threads: int | None = None, cpus: float = 1.0,
                 restart_timeout_s: float = 300.0) -> None:
        import torch
        from transformers import AutoTokenizer

        self.path = path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = torch.device("cpu")
        self.restart_timeout_s = restart_timeout_s
        self.actor = ray.remote(EngineActor).options(max_restarts=-1, max_task_retries=0, num_cpus=cpus).remote(path, threads)
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

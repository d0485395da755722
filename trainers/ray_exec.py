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
- The manager actor dies: Ray restarts it and the call is retried (trainers/ray_remote.py, with the engine actor).
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any, Sequence

from core.config import ConfigError
from envs.pool import EnvSpec, SlotPoolAPI, SlotResult, _failure, _Replayable, close_envs, serve_command
from trainers.ray_remote import ACTOR_START_TIMEOUT_S, RemoteEngine, RemoteManager

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage reporting (set before Ray is imported)

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayError
except ImportError:  # RunConfig refuses executor ray without it; this names the fix for direct users
    raise ConfigError("run.executor ray needs Ray: pip install -e '.[ray]'") from None

LOCAL_OBJECT_STORE_BYTES = 256 * 1024**2  # a local cluster's object store: the run moves episodes and hits, not tensors


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
                              restart_timeout_s=rc.restart_timeout_s, backend="vllm" if self.cfg.actor.backend == "vllm" else "hf")
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

"""Many text envs stepped in worker processes, so one slow, hung or crashing env stalls no one else.

    with EnvPool(["minihack/Room-5x5"] * 8, num_workers=4, step_timeout_s=10) as pool:
        starts = pool.reset_many([(slot, seed, None) for slot, seed in enumerate(range(8))])
        results = pool.step_many([(0, "east"), (1, "south")])

Slots are env instances; slot i lives in worker i % num_workers, so slots that share a worker are
stepped one after the other. When one of them hangs past `step_timeout_s` or kills its process, that
episode ends as a failure (`terminated=True`, `info["success"] = False`, `info["error"]` says why) and
the worker is restarted; the other episodes it held are rebuilt in the new worker by replaying them
(the same reset seed and options, then their actions so far, each observation checked against the one
recorded) and their commands are sent again. An episode that does not replay the same way (reset
without a seed, an env that is not deterministic) ends as a failure saying so. So with one worker
(`run.threads: 1`) a hung episode costs the others time, not their episodes. A Python exception in an
env ends only that slot's episode; its env is rebuilt on the next reset. An env whose steps may
legitimately outlast `step_timeout_s` (a SWE-bench harness run) gives its own limit in its reset info
(`info["step_budget_s"]`), which the pool then allows that slot's steps.

A factory must be picklable by reference (a module-level function or class in an importable
module, not in `__main__`). Workers start with multiprocessing's "forkserver" method: NetHack keeps global state in its
shared library, so a process must never be forked after an env is built; the fork server forks
from a clean process that has only imported the env modules.
"""
from __future__ import annotations

import multiprocessing as mp
import random
import time
import traceback
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

from envs.base import TextEnv, keeps_intro
from envs.experts import expert_action
from envs.registry import make_env

EnvSpec = str | Callable[[], TextEnv]


@dataclass
class SlotResult:
    """What one reset or step of one slot produced. Reset results also carry the env's texts."""

    slot: int
    obs: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    task: str = ""
    action_format: str = ""
    max_turns: int = 0
    name: str = ""
    keep_intro: bool = False  # the env asks to keep its first observation in the prompt (envs/base.py)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def error(self) -> str | None:
        return self.info.get("error")


def _failure(slot: int, error: str) -> SlotResult:
    return SlotResult(slot, obs=f"The environment failed: {error}", terminated=True,
                      info={"success": False, "error": error})


def _build(spec: EnvSpec) -> TextEnv:
    if isinstance(spec, str):
        return make_env(spec)
    return spec()


def serve_command(envs: dict[int, TextEnv], specs: dict[int, EnvSpec], cmd: str, slot: int, arg: Any) -> SlotResult:
    """One reset / step / expert command on one slot of a worker's envs (built lazily). An env's exception ends
    only that slot's episode: its env is closed and rebuilt on the next reset. The process pool's workers and
    the Ray env actors (trainers/ray_exec.py) both serve commands through this."""
    try:
        if cmd == "reset":
            if slot not in envs:
                envs[slot] = _build(specs[slot])
            env = envs[slot]
            seed, options = arg
            obs, info = env.reset(seed=seed, options=options)
            return SlotResult(slot, obs, info=info, task=env.task, action_format=env.action_format,
                              max_turns=env.max_turns, name=env.name, keep_intro=keeps_intro(env))
        if cmd == "step":
            if slot not in envs:
                raise RuntimeError("step before reset")
            obs, reward, terminated, truncated, info = envs[slot].step(arg)
            return SlotResult(slot, obs, float(reward), bool(terminated), bool(truncated), info)
        if cmd == "expert":
            return SlotResult(slot, expert_action(envs[slot]))
        raise ValueError(f"unknown pool command {cmd!r}")
    except Exception as exc:  # an env bug ends that episode, not the worker
        env = envs.pop(slot, None)
        if env is not None:
            try:
                env.close()
            except Exception:
                pass
        return _failure(slot, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")


def close_envs(envs: dict[int, TextEnv]) -> None:
    for env in envs.values():
        try:
            env.close()
        except Exception:
            pass
    envs.clear()


def _worker(conn: Connection, specs: dict[int, EnvSpec]) -> None:
    """Serve one worker's slots: one message answers each command."""
    envs: dict[int, TextEnv] = {}
    while True:
        try:
            cmd, slot, arg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if cmd == "close":
            break
        conn.send(serve_command(envs, specs, cmd, slot, arg))
    close_envs(envs)
    conn.close()


class SlotPoolAPI:
    """The slot interface the Roller uses, over `_run(commands, timeout_s)`: shared by the process pool (EnvPool)
    and the Ray actors' pool (trainers/ray_exec.py RayEnvPool)."""

    specs: list[EnvSpec]
    reset_timeout_s: float
    step_timeout_s: float

    def _run(self, commands: list[tuple[str, int, Any]], timeout_s: float) -> list[SlotResult]:
        raise NotImplementedError

    @property
    def num_slots(self) -> int:
        return len(self.specs)

    def reset_many(self, requests: Sequence[tuple[int, int | None, dict[str, Any] | None]]) -> list[SlotResult]:
        """Start an episode in each (slot, seed, options); results come back in request order."""
        return self._run([("reset", slot, (seed, options)) for slot, seed, options in requests], self.reset_timeout_s)

    def step_many(self, requests: Sequence[tuple[int, str]]) -> list[SlotResult]:
        """Play one action in each (slot, action); results come back in request order."""
        return self._run([("step", slot, action) for slot, action in requests], self.step_timeout_s)

    def expert_many(self, slots: Sequence[int]) -> list[str | None]:
        """The scripted expert's next action for each slot (None where it failed)."""
        return [None if r.error else r.obs for r in self._run([("expert", s, None) for s in slots], self.step_timeout_s)]


class LocalPool(SlotPoolAPI):
    """The same slot interface over envs in this process, stepped one after the other, with no timeout: for
    callers that need the env objects themselves (the warm start's teachers read the level beside the agent) or
    play one episode (the workbench's demo). `envs[slot]` is the slot's env once it has been reset."""

    def __init__(self, envs: Sequence[EnvSpec]) -> None:
        if not envs:
            raise ValueError("LocalPool needs at least one env (a registry name or a factory)")
        self.specs: list[EnvSpec] = list(envs)
        self.step_timeout_s = self.reset_timeout_s = float("inf")
        self.envs: dict[int, TextEnv] = {}

    def _run(self, commands: list[tuple[str, int, Any]], timeout_s: float) -> list[SlotResult]:
        specs = dict(enumerate(self.specs))
        return [serve_command(self.envs, specs, cmd, slot, arg) for cmd, slot, arg in commands]

    def restarts(self) -> int:
        return 0

    def close(self) -> None:
        close_envs(self.envs)

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Replayable:
    """What it takes to rebuild a slot's running episode in a new worker."""

    seed: int | None
    options: dict[str, Any] | None
    reset_obs: str
    steps: list[tuple[str, str]] = field(default_factory=list)  # (action, observation)


@dataclass
class _Worker:
    slots: list[int]
    process: Any = None
    conn: Connection | None = None
    restarts: int = 0


class EnvPool(SlotPoolAPI):
    """A fixed set of env slots served by worker processes, with a per-step timeout."""

    def __init__(self, envs: Sequence[EnvSpec], num_workers: int | None = None, *, step_timeout_s: float = 30.0,
                 reset_timeout_s: float | None = None, start_method: str = "forkserver") -> None:
        if not envs:
            raise ValueError("EnvPool needs at least one env (a registry name or a factory)")
        self.specs: list[EnvSpec] = list(envs)
        self.num_workers = max(1, min(num_workers or len(self.specs), len(self.specs)))
        self.step_timeout_s = float(step_timeout_s)
        # Building an env (TextWorld compiling a game, NetHack copying its library) is slower than a step.
        self.reset_timeout_s = float(reset_timeout_s if reset_timeout_s is not None else max(60.0, step_timeout_s))
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(self._preload_modules())
        self._workers = [_Worker([s for s in range(len(self.specs)) if s % self.num_workers == w])
                         for w in range(self.num_workers)]
        self._live: set[int] = set()  # slots whose env holds a running episode in its worker
        self._episodes: dict[int, _Replayable] = {}  # live slot -> how to replay its episode
        self._budget: dict[int, float] = {}  # slot -> the step limit its env asked for, when above the pool's
        self.replays = 0  # episodes rebuilt in a new worker after another episode hung or killed theirs
        for w in self._workers:
            self._start(w)
        self._finalizer = weakref.finalize(self, EnvPool._shutdown, list(self._workers))

    # ---------------------------------------------------------------- public API

    def restarts(self) -> int:
        return sum(w.restarts for w in self._workers)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internals

    def _preload_modules(self) -> list[str]:
        mods = ["envs.base", "envs.registry"]
        if any(isinstance(s, str) and s.startswith("minihack/") for s in self.specs):
            mods.append("envs.minihack")
        return mods

    def _start(self, w: _Worker) -> None:
        parent, child = self._ctx.Pipe()
        w.process = self._ctx.Process(target=_worker, args=(child, {s: self.specs[s] for s in w.slots}), daemon=True)
        w.process.start()
        child.close()
        w.conn = parent

    def _restart(self, w: _Worker) -> None:
        EnvPool._stop(w, grace_s=0.0)
        w.restarts += 1
        self._live -= set(w.slots)
        self._start(w)

    def _run(self, commands: list[tuple[str, int, Any]], timeout_s: float) -> list[SlotResult]:
        """Send every command to its worker at once, then gather replies; a worker that is silent
        for `timeout_s` or dies is restarted and its unanswered commands become failures."""
        for _, slot, _ in commands:
            if not 0 <= slot < len(self.specs):
                raise IndexError(f"slot {slot} out of range: the pool has {len(self.specs)} slots")
        results: dict[int, SlotResult] = {}
        pending: dict[int, list[int]] = {}  # worker index -> command indices, in send order
        for i, (cmd, slot, arg) in enumerate(commands):
            if cmd != "reset" and slot not in self._live:
                results[i] = _failure(slot, "no running episode in this slot (its worker was restarted, "
                                            "or reset was never called): call reset_many first")
                continue
            wi = slot % self.num_workers
            pending.setdefault(wi, []).append(i)
        deadline: dict[int, float] = {}

        def limit(wi: int) -> float:
            return max([timeout_s] + [self._budget.get(commands[i][1], 0.0) for i in pending[wi]
                                      if commands[i][0] == "step"])

        def send(wi: int) -> None:
            """Send worker wi its pending commands. One found dead (killed from outside between calls) is restarted,
            every episode it held replayed (none of them is to blame), and the commands sent to the new one."""
            for attempt in range(2):
                w = self._workers[wi]
                try:
                    if not w.process.is_alive():
                        raise BrokenPipeError
                    for i in pending[wi]:
                        w.conn.send(commands[i])
                    deadline[wi] = time.monotonic() + limit(wi)
                    return
                except (BrokenPipeError, OSError):
                    pending[wi] = self._fail_worker(wi, pending[wi], commands, results,
                                                    f"worker process died (exit code {w.process.exitcode})",
                                                    culprit=False)
                    if not pending[wi]:
                        break
            for i in pending.pop(wi):
                results[i] = _failure(commands[i][1], "its worker died again as soon as it was restarted")
            deadline.pop(wi, None)

        def failed(wi: int, reason: str) -> None:
            """Worker wi hung or died on its first unanswered command: that episode fails; the others it held are
            replayed in a new worker and their commands sent again."""
            t0 = time.monotonic()
            pending[wi] = self._fail_worker(wi, pending[wi], commands, results, reason, culprit=True)
            deadline.pop(wi, None)
            for other in deadline:  # the replay held this loop up: the other workers' clocks wait too
                deadline[other] += time.monotonic() - t0
            if pending[wi]:
                send(wi)
            else:
                del pending[wi]

        for wi in list(pending):
            send(wi)
        while pending:
            conn_to_worker = {self._workers[wi].conn: wi for wi in pending}
            wait_s = max(0.0, min(deadline.values()) - time.monotonic())
            for conn in wait(list(conn_to_worker), timeout=wait_s):
                wi = conn_to_worker[conn]
                if wi not in pending:
                    continue
                try:
                    out: SlotResult = conn.recv()
                except (EOFError, OSError):
                    failed(wi, f"worker process died (exit code {self._workers[wi].process.exitcode})")
                    continue
                i = pending[wi].pop(0)
                results[i] = out
                self._record(commands[i], out)
                if pending[wi]:
                    deadline[wi] = time.monotonic() + limit(wi)
                else:
                    del pending[wi], deadline[wi]
            now = time.monotonic()
            for wi in [wi for wi, d in deadline.items() if d <= now]:
                if wi in deadline and deadline[wi] <= time.monotonic():  # (another's replay may have moved it)
                    failed(wi, f"no answer within {limit(wi):g} s (env hung)")
        return [results[i] for i in range(len(commands))]

    def _record(self, command: tuple[str, int, Any], out: SlotResult) -> None:
        """Keep what replaying the slot's episode needs; forget it when the episode ends."""
        cmd, slot, arg = command
        if cmd == "reset" and not out.error:
            self._live.add(slot)
            self._episodes[slot] = _Replayable(arg[0], arg[1], out.obs)
            budget = out.info.get("step_budget_s") if isinstance(out.info, dict) else None
            self._budget[slot] = float(budget) if isinstance(budget, (int, float)) else 0.0
        elif cmd == "step" and slot in self._episodes and not out.error:
            self._episodes[slot].steps.append((arg, out.obs))
        if out.error or out.done:
            self._live.discard(slot)
            self._episodes.pop(slot, None)

    def _fail_worker(self, wi: int, unanswered: list[int], commands: list[tuple[str, int, Any]],
                     results: dict[int, SlotResult], reason: str, *, culprit: bool) -> list[int]:
        """Restart worker wi. With `culprit`, its first unanswered command hung or killed it: that slot's episode
        fails with `reason`. Every other episode the worker held is replayed in the new worker. Returns the
        unanswered commands to send again (resets, and those of replayed slots); the rest fail, saying why."""
        w = self._workers[wi]
        first = commands[unanswered[0]][1] if unanswered and culprit else None
        held = [s for s in w.slots if s in self._live and s != first]
        self._restart(w)  # forgets which of its slots were live
        self._episodes.pop(first, None)
        lost: dict[int, str] = {}
        for n, slot in enumerate(held):
            why = self._replay(w, slot, self._episodes.pop(slot))
            if why is None:
                continue
            lost[slot] = why
            if "did not answer" in why:  # the replay itself hung or died: the worker was restarted again
                lost |= {s: f"its worker was restarted again while replaying slot {slot}" for s in held[n + 1:]}
                for s in held[:n]:
                    self._live.discard(s)
                    self._episodes.pop(s, None)
                    lost[s] = f"its worker was restarted again while replaying slot {slot}"
                break
        again = []
        blame = f"slot {first} failed: {reason}" if first is not None else reason
        for i in unanswered:
            cmd, slot, _ = commands[i]
            if slot == first:
                results[i] = _failure(slot, reason)
            elif cmd == "reset" or slot in self._live:
                again.append(i)
            else:
                why = lost.get(slot, "it held no running episode")
                results[i] = _failure(slot, f"worker restarted because {blame}; this episode was lost: {why}")
        return again

    def _replay(self, w: _Worker, slot: int, ep: _Replayable) -> str | None:
        """Rebuild one episode in worker w (just restarted): its reset and actions again, each observation
        compared with the one recorded. None when it came back the same, else why not (the slot is then not live)."""
        out = self._call(w, ("reset", slot, (ep.seed, ep.options)), self.reset_timeout_s)
        if out is not None and not out.error and out.obs == ep.reset_obs:
            for n, (action, want) in enumerate(ep.steps, 1):
                out = self._call(w, ("step", slot, action), max(self.step_timeout_s, self._budget.get(slot, 0.0)))
                if out is None or out.error or out.done or out.obs != want:
                    break
            else:
                self._live.add(slot)
                self._episodes[slot] = ep
                self.replays += 1
                return None
        if out is None:
            self._restart(w)
            return "its replay did not answer in time"
        if out.error:
            return f"its replay failed: {out.error.splitlines()[0]}"
        return "its replay came out different (the env is not deterministic given its seed and actions)"

    def _call(self, w: _Worker, command: tuple[str, int, Any], timeout_s: float) -> SlotResult | None:
        """One command to one worker, waited for; None if it is silent past `timeout_s` or dies."""
        try:
            w.conn.send(command)
            if w.conn.poll(timeout_s):
                return w.conn.recv()
        except (EOFError, OSError):
            pass
        return None

    @staticmethod
    def _stop(w: _Worker, grace_s: float = 2.0) -> None:
        if w.conn is not None:
            if grace_s > 0:
                try:
                    w.conn.send(("close", -1, None))
                except (OSError, ValueError):
                    pass
            w.conn.close()
            w.conn = None
        p = w.process
        if p is not None:
            p.join(grace_s)
            if p.is_alive():
                p.kill()
                p.join(5.0)
            p.close()
            w.process = None

    @staticmethod
    def _shutdown(workers: list[_Worker]) -> None:
        for w in workers:
            EnvPool._stop(w)


class TaskMixture:
    """Samples env names by weight for multi-task training; the same seed gives the same sequence."""

    def __init__(self, weights: dict[str, float], seed: int = 0) -> None:
        bad = {k: v for k, v in weights.items() if not v >= 0}
        if not weights or bad or sum(weights.values()) <= 0:
            raise ValueError(f"TaskMixture weights must be non-negative with a positive sum, got {weights!r}")
        self.names = [k for k, v in weights.items() if v > 0]
        total = sum(weights[k] for k in self.names)
        self.probs = {k: weights[k] / total for k in self.names}
        self._rng = random.Random(seed)

    def sample(self) -> str:
        return self._rng.choices(self.names, weights=[self.probs[k] for k in self.names])[0]

    def sample_many(self, n: int) -> list[str]:
        return self._rng.choices(self.names, weights=[self.probs[k] for k in self.names], k=n)

    def getstate(self) -> Any:
        """Where the sequence stands (a checkpoint keeps it, so a resumed run draws what it would have drawn)."""
        return self._rng.getstate()

    def setstate(self, state: Any) -> None:
        self._rng.setstate(state)

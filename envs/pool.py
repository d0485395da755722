"""Many text envs stepped in worker processes, so one slow, hung or crashing env stalls no one else.

    with EnvPool(["minihack/Room-5x5"] * 8, num_workers=4, step_timeout_s=10) as pool:
        starts = pool.reset_many([(slot, seed, None) for slot, seed in enumerate(range(8))])
        results = pool.step_many([(0, "east"), (1, "south")])

Slots are env instances; slot i lives in worker i % num_workers, so slots that share a worker are
stepped one after the other and share its fate: when one of them hangs past `step_timeout_s` or
kills its process, the worker is restarted and every episode in it ends as a failure
(`terminated=True`, `info["success"] = False`, `info["error"]` says why). A Python exception in
an env ends only that slot's episode; its env is rebuilt on the next reset. One worker per slot
(the default) isolates every env.

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
        from envs.registry import make_env

        return make_env(spec)
    return spec()


def _worker(conn: Connection, specs: dict[int, EnvSpec]) -> None:
    """Serve one worker's slots: build envs lazily, answer each command with one message."""
    envs: dict[int, TextEnv] = {}
    while True:
        try:
            cmd, slot, arg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if cmd == "close":
            break
        try:
            if cmd == "reset":
                if slot not in envs:
                    envs[slot] = _build(specs[slot])
                env = envs[slot]
                seed, options = arg
                obs, info = env.reset(seed=seed, options=options)
                out = SlotResult(slot, obs, info=info, task=env.task, action_format=env.action_format,
                                 max_turns=env.max_turns, name=env.name,
                                 keep_intro=keeps_intro(env))
            elif cmd == "step":
                if slot not in envs:
                    raise RuntimeError("step before reset")
                obs, reward, terminated, truncated, info = envs[slot].step(arg)
                out = SlotResult(slot, obs, float(reward), bool(terminated), bool(truncated), info)
            elif cmd == "expert":
                from envs.experts import expert_action

                out = SlotResult(slot, expert_action(envs[slot]))
            else:
                raise ValueError(f"unknown pool command {cmd!r}")
        except Exception as exc:  # an env bug ends that episode, not the worker
            env = envs.pop(slot, None)
            if env is not None:
                try:
                    env.close()
                except Exception:
                    pass
            out = _failure(slot, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")
        conn.send(out)
    for env in envs.values():
        try:
            env.close()
        except Exception:
            pass
    conn.close()


@dataclass
class _Worker:
    slots: list[int]
    process: Any = None
    conn: Connection | None = None
    restarts: int = 0


class EnvPool:
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
        for w in self._workers:
            self._start(w)
        self._finalizer = weakref.finalize(self, EnvPool._shutdown, list(self._workers))

    # ---------------------------------------------------------------- public API

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
        for wi in list(pending):
            w = self._workers[wi]
            try:
                if not w.process.is_alive():
                    raise BrokenPipeError
                for i in pending[wi]:
                    w.conn.send(commands[i])
            except (BrokenPipeError, OSError):
                # Died between calls (e.g. killed from outside): its episodes are already lost.
                self._fail_worker(wi, pending.pop(wi), commands, results,
                                  f"worker process died (exit code {w.process.exitcode})")
        deadline = {wi: time.monotonic() + timeout_s for wi in pending}
        while pending:
            conn_to_worker = {self._workers[wi].conn: wi for wi in pending}
            wait_s = max(0.0, min(deadline.values()) - time.monotonic())
            for conn in wait(list(conn_to_worker), timeout=wait_s):
                wi = conn_to_worker[conn]
                try:
                    out: SlotResult = conn.recv()
                except (EOFError, OSError):
                    code = self._workers[wi].process.exitcode
                    self._fail_worker(wi, pending.pop(wi), commands, results,
                                      f"worker process died (exit code {code})")
                    del deadline[wi]
                    continue
                i = pending[wi].pop(0)
                results[i] = out
                cmd, slot, _ = commands[i]
                if cmd == "reset" and not out.error:
                    self._live.add(slot)
                if out.error or out.done:
                    self._live.discard(slot)
                deadline[wi] = time.monotonic() + timeout_s
                if not pending[wi]:
                    del pending[wi], deadline[wi]
            now = time.monotonic()
            for wi in [wi for wi, d in deadline.items() if d <= now]:
                self._fail_worker(wi, pending.pop(wi), commands, results,
                                  f"no answer within {timeout_s:g} s (env hung)")
                del deadline[wi]
        return [results[i] for i in range(len(commands))]

    def _fail_worker(self, wi: int, unanswered: list[int], commands: list[tuple[str, int, Any]],
                     results: dict[int, SlotResult], reason: str) -> None:
        first = commands[unanswered[0]][1] if unanswered else None
        for i in unanswered:
            slot = commands[i][1]
            why = reason if slot == first else f"worker restarted because slot {first} failed: {reason}"
            results[i] = _failure(slot, why)
        self._restart(self._workers[wi])

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

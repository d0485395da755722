"""EnvPool survives envs that crash, die or hang, and the other slots carry on."""
from __future__ import annotations

import os
import time

import pytest

from envs.pool import EnvPool, TaskMixture


class _BrokenEnv:
    """A deliberately faulty env (only for these tests): `step` fails in the way `mode` says."""

    action_format = "Say anything."
    max_turns = 5
    task = "Survive."

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.name = f"broken/{mode}"

    def reset(self, *, seed=None, options=None):
        return "ready", {}

    def step(self, action):
        if self.mode == "raise":
            raise ValueError("env bug")
        if self.mode == "die":
            os._exit(3)  # a hard crash: no exception, the process is gone
        if self.mode == "hang":
            time.sleep(3600)
        return "ok", 0.0, False, False, {}

    def close(self):
        pass


def raising_env():
    return _BrokenEnv("raise")


def dying_env():
    return _BrokenEnv("die")


def hanging_env():
    return _BrokenEnv("hang")


@pytest.mark.slow
def test_pool_survives_crashing_dying_and_hanging_envs():
    specs = ["minihack/Room-5x5", raising_env, dying_env, hanging_env, "minihack/Room-5x5"]
    with EnvPool(specs, num_workers=len(specs), step_timeout_s=2.0) as pool:
        starts = pool.reset_many([(slot, slot, None) for slot in range(len(specs))])
        assert [r.error for r in starts] == [None] * 5
        assert starts[0].task.startswith("Reach the staircase") and starts[0].max_turns == 50

        t0 = time.monotonic()
        out = pool.step_many([(slot, "southeast") for slot in range(len(specs))])
        assert time.monotonic() - t0 < 10, "one hung env must not stall the batch past its timeout"
        good = [out[0], out[4]]
        assert all(r.error is None and not r.done for r in good)
        for r, why in ((out[1], "ValueError: env bug"), (out[2], "died"), (out[3], "no answer within")):
            assert r.terminated and r.info["success"] is False and why in r.error
        assert pool.restarts() == 2  # the dead and the hung worker; an exception keeps its worker

        # The healthy slots continue their episodes to the goal.
        for _ in range(3):
            out = pool.step_many([(0, "southeast"), (4, "southeast")])
        assert all(r.terminated and r.info["success"] for r in out)

        # The failed slots can start new episodes on the same pool.
        again = pool.reset_many([(slot, 0, None) for slot in range(len(specs))])
        assert [r.error for r in again] == [None] * 5


class _CountingEnv:
    """Deterministic given its seed (only for these tests); the action `hang` hangs, `slow` takes 2 s; a `noisy`
    env starts from a random state, so it cannot be replayed."""

    action_format = "Say a word."
    max_turns = 50
    task = "Count."

    def __init__(self, noisy: bool = False, budget: float | None = None) -> None:
        self.name, self.noisy, self.budget, self.n = "counting", noisy, budget, 0

    def reset(self, *, seed=None, options=None):
        import random

        self.n = random.randrange(10**9) if self.noisy else (seed or 0) * 1000
        return f"start at {self.n}", ({"step_budget_s": self.budget} if self.budget else {})

    def step(self, action):
        if action == "hang":
            time.sleep(3600)
        if action == "slow":
            time.sleep(2)
        self.n += 1
        return f"{action} -> {self.n}", 0.0, False, False, {}

    def close(self):
        pass


def counting_env():
    return _CountingEnv()


def noisy_env():
    return _CountingEnv(noisy=True)


def patient_env():
    return _CountingEnv(budget=5.0)


def test_one_worker_a_hung_episode_fails_alone_and_the_others_are_replayed():
    """run.threads: 1 gives the pool one worker: a hung episode must not take its neighbours' episodes with it."""
    with EnvPool([counting_env] * 4, num_workers=1, step_timeout_s=1.0) as pool:
        pool.reset_many([(s, s, None) for s in range(4)])
        for t in range(3):
            pool.step_many([(s, f"a{t}") for s in range(4)])
        out = pool.step_many([(0, "b"), (1, "hang"), (2, "b"), (3, "b")])
        assert "no answer within 1 s" in out[1].error and out[1].terminated
        assert [r.obs for r in (out[0], out[2], out[3])] == ["b -> 4", "b -> 2004", "b -> 3004"]  # as if nothing hung
        assert all(r.error is None and not r.done for r in (out[0], out[2], out[3]))
        assert pool.replays == 3 and pool.restarts() == 1
        again = pool.step_many([(0, "c"), (2, "c")])  # the replayed episodes go on in the new worker
        assert [r.obs for r in again] == ["c -> 5", "c -> 2005"]
        lost = pool.step_many([(1, "c")])[0]
        assert lost.terminated and "call reset_many" in lost.error
        assert pool.reset_many([(1, 1, None)])[0].error is None


def test_a_neighbour_that_does_not_replay_the_same_is_reported_lost():
    with EnvPool(["minihack/Room-5x5", hanging_env, noisy_env], num_workers=1, step_timeout_s=1.0) as pool:
        pool.reset_many([(0, 0, None), (1, 0, None), (2, 0, None)])
        pool.step_many([(0, "east"), (2, "x")])
        out = pool.step_many([(1, "wait"), (0, "east"), (2, "y")])
        assert "no answer" in out[0].error
        assert out[1].error is None and not out[1].done  # real MiniHack replays the same from its seed
        assert "worker restarted because slot 1" in out[2].error and "came out different" in out[2].error


@pytest.mark.slow
def test_an_env_may_ask_for_a_longer_step():
    with EnvPool([patient_env, counting_env], num_workers=2, step_timeout_s=1.0) as pool:
        pool.reset_many([(0, 0, None), (1, 1, None)])
        out = pool.step_many([(0, "slow"), (1, "slow")])
        assert out[0].error is None and out[0].obs == "slow -> 1"  # its reset info asked for 5 s
        assert "no answer within 1 s" in out[1].error


def test_a_worker_killed_between_calls_loses_no_episode():
    with EnvPool([counting_env] * 2, num_workers=1, step_timeout_s=5.0) as pool:
        pool.reset_many([(0, 0, None), (1, 1, None)])
        pool.step_many([(0, "a"), (1, "a")])
        pool._workers[0].process.kill()  # e.g. the OOM killer
        pool._workers[0].process.join()
        out = pool.step_many([(0, "b"), (1, "b")])
        assert [r.obs for r in out] == ["b -> 2", "b -> 1002"] and pool.replays == 2


def test_close_leaves_no_processes():
    pool = EnvPool(["minihack/Room-5x5"] * 3, num_workers=3)
    pool.reset_many([(s, s, None) for s in range(3)])
    procs = [w.process for w in pool._workers]
    pids = [p.pid for p in procs]
    pool.close()
    for pid in pids:
        with pytest.raises(OSError):
            os.kill(pid, 0)  # reaped: neither running nor a zombie
    pool.close()  # idempotent


def test_pool_results_follow_request_order_and_expert_runs_in_workers():
    with EnvPool(["minihack/Room-5x5"] * 4, num_workers=2) as pool:
        pool.reset_many([(s, 0, None) for s in (3, 1, 0, 2)])
        assert pool.expert_many([2, 0]) == ["southeast", "southeast"]
        out = pool.step_many([(2, "east"), (0, "south"), (3, "bogus")])
        assert [r.slot for r in out] == [2, 0, 3]
        assert out[2].info["invalid_action"] is True
        with pytest.raises(IndexError):
            pool.step_many([(9, "east")])


def test_task_mixture_is_seeded_and_weighted():
    weights = {"minihack/Room-5x5": 3.0, "minihack/KeyRoom-S5": 1.0, "webshop": 0.0}
    a = TaskMixture(weights, seed=5).sample_many(4000)
    assert a == TaskMixture(weights, seed=5).sample_many(4000)
    assert "webshop" not in a
    assert 0.70 < a.count("minihack/Room-5x5") / len(a) < 0.80
    with pytest.raises(ValueError):
        TaskMixture({"x": -1.0})
    m = TaskMixture(weights, seed=5)
    m.sample_many(7)
    state = m.getstate()  # what a checkpoint keeps: a resumed run draws what the first would have drawn
    ahead = m.sample_many(50)
    resumed = TaskMixture(weights, seed=99)
    resumed.setstate(state)
    assert resumed.sample_many(50) == ahead

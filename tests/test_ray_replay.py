"""Hang replay inside Ray env actors (issue 40 item 6), as the process pool does it (tests/test_pool.py): with one env
actor, one hung episode fails alone; the actor is restarted and its other episodes are replayed there and go on."""
from __future__ import annotations

import os
import sys
import time

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (make setup installs it)")

from trainers.ray_exec import RayEnvPool  # noqa: E402


class _CountingEnv:
    """Deterministic given its seed; the action `hang` hangs; a `noisy` one starts anywhere (it cannot be replayed)."""

    action_format = "Say a word."
    max_turns = 50
    task = "Count."

    def __init__(self, noisy: bool = False) -> None:
        self.name, self.noisy, self.n = "counting", noisy, 0

    def reset(self, *, seed=None, options=None):
        import random

        self.n = random.randrange(10**9) if self.noisy else (seed or 0) * 1000
        return f"start at {self.n}", {}

    def step(self, action):
        if action == "hang":
            time.sleep(3600)
        self.n += 1
        return f"{action} -> {self.n}", 0.0, False, False, {}

    def close(self):
        pass


def counting_env():
    return _CountingEnv()


def noisy_env():
    return _CountingEnv(noisy=True)


@pytest.fixture(scope="module")
def cluster():
    from trainers.ray_exec import loopback_only

    # the env factories above travel by value: Ray's workers need not import this test module
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if ray.is_initialized():
        ray.shutdown()
    loopback_only()
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", object_store_memory=128 * 1024**2,
             log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_one_env_actor_a_hung_episode_fails_alone_and_the_others_are_replayed(cluster):
    with RayEnvPool([counting_env] * 4 + [noisy_env], num_actors=1, step_timeout_s=2.0) as pool:
        assert not any(r.error for r in pool.reset_many([(s, s, None) for s in range(5)]))
        for t in range(3):
            pool.step_many([(s, f"a{t}") for s in range(5)])
        first_pid = pool.actor_info()[0]["pid"]
        out = pool.step_many([(0, "b"), (1, "hang"), (2, "b"), (3, "b"), (4, "b")])
        assert "no answer within 2 s" in out[1].error and out[1].terminated
        # slot 0 answered before the hang; 2 and 3 replayed in the restarted actor, then stepped: as if nothing hung
        assert [r.obs for r in (out[0], out[2], out[3])] == ["b -> 4", "b -> 2004", "b -> 3004"], [r.obs for r in out]
        assert all(r.error is None and not r.done for r in (out[0], out[2], out[3]))
        assert out[4].terminated and "not deterministic" in out[4].error  # the noisy one cannot come back the same
        assert pool.replays == 3 and pool.restarts() == 1
        assert pool.actor_info()[0]["pid"] != first_pid
        again = pool.step_many([(0, "c"), (2, "c"), (3, "c")])  # the replayed episodes go on in the new actor
        assert [r.obs for r in again] == ["c -> 5", "c -> 2005", "c -> 3005"]
        lost = pool.step_many([(1, "c")])[0]
        assert lost.terminated and "reset_many" in lost.error
        assert pool.reset_many([(1, 1, None)])[0].error is None
        assert pool.restarts() == 1

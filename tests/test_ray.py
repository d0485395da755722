"""run.executor ray on a real local Ray cluster (2 CPUs, loopback, no dashboard, no usage reporting): env actors
and the ExperienceManager actor, their faults, and a deterministic run that logs what the local executor logs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (make setup installs it)")

from core.config import IndexConfig, LibraryConfig, ManagerConfig  # noqa: E402
from core.manager import OpContext  # noqa: E402
from core.store import ExperienceStore  # noqa: E402
from core.types import Operation, format_entry_text  # noqa: E402
from trainers.ray_exec import RayEnvPool  # noqa: E402
from trainers.ray_remote import RemoteManager  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = "minihack/Room-5x5"
APPLE = format_entry_text("Apples", "where apples are", "Apples are usually on a countertop or in the fridge.")
STAIRS = format_entry_text("Stairs", "MiniHack rooms", "Walk diagonally towards the > to reach it in fewer moves.")


@pytest.fixture(scope="module")
def cluster():
    from trainers.ray_exec import loopback_only

    if ray.is_initialized():
        ray.shutdown()
    loopback_only()
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", object_store_memory=128 * 1024**2,
             log_to_driver=False)
    yield
    ray.shutdown()


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_env_actor_killed_mid_episode_fails_its_episodes_and_is_restarted(cluster):
    with RayEnvPool([ENV] * 4, num_actors=2, step_timeout_s=60) as pool:
        starts = pool.reset_many([(s, s, None) for s in range(4)])
        assert not any(r.error for r in starts) and all(r.task for r in starts)
        first = pool.actor_info()
        assert {i["ip"] for i in first} == {"127.0.0.1"}  # loopback only
        kill(first[0]["pid"])  # actor 0 holds slots 0 and 2; their episodes are running
        out = pool.step_many([(s, "north") for s in range(4)])
        assert out[0].error and out[2].error and out[0].terminated and out[0].info["success"] is False
        assert not out[1].error and not out[3].error
        assert pool.restarts() == 1
        # the step after: slots 0 and 2 have no episode any more; 1 and 3 go on
        out = pool.step_many([(s, "south") for s in range(4)])
        assert "reset_many first" in out[0].error and not out[1].error
        # Ray restarted the actor: new episodes start on every slot
        starts = pool.reset_many([(s, 10 + s, None) for s in range(4)])
        assert not any(r.error for r in starts)
        again = pool.actor_info()
        assert again[0]["pid"] != first[0]["pid"] and again[1]["pid"] == first[1]["pid"]
        assert all(not r.error for r in pool.step_many([(s, "east") for s in range(4)]))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trainers import prompts as P
    from trainers.models import HFBackend, build_tiny_qwen2, build_tokenizer, save_model_folder

    d = tmp_path_factory.mktemp("tiny")
    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, "north east south west southeast"] * 30, vocab_size=400)
    save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1), tok, d)
    return HFBackend(d, device="cpu")


@pytest.mark.slow
def test_a_step_completes_when_an_env_actor_dies_during_it(cluster, tiny):
    """The Roller's collect over Ray env actors, one killed between two turns: its episodes end as failures with the
    reason, the others play on, and collect returns every episode."""
    from trainers.config import ModelSection, RolloutSection
    from trainers.rollout import EpisodeSpec, Roller

    with RayEnvPool([ENV] * 4, num_actors=2, step_timeout_s=60) as pool:
        real_step, calls = pool.step_many, []

        def step_many(requests):
            calls.append(len(requests))
            if len(calls) == 2:
                kill(pool.actor_info()[1]["pid"])  # slots 1 and 3, mid-episode
            return real_step(requests)

        pool.step_many = step_many
        roller = Roller(tiny, pool, None, rollout_cfg=RolloutSection(), actor_cfg=ModelSection(max_new_tokens=4), max_turns=4,
                        seed=1)
        metrics: dict[str, float] = {}
        eps = roller.collect([EpisodeSpec(ENV, s, False, 0) for s in range(4)], step=1, metrics=metrics)
        assert len(eps) == 4 and len(calls) >= 2
        # slots 1 and 3 (unless an episode had already ended at the first turn) failed with the reason
        assert any("env actor" in eps[s].error for s in (1, 3)), [e.error for e in eps]
        assert all("env actor" in eps[s].error or eps[s].traj.num_actions == 1 for s in (1, 3))
        assert not eps[0].error and not eps[2].error
        assert metrics["rollout/env_restarts"] == 1.0
        # the restarted actor serves the next step
        eps = roller.collect([EpisodeSpec(ENV, s, False, 0) for s in range(4)], step=2)
        assert len(eps) == 4 and all(not e.error for e in eps)


@pytest.fixture()
def lib_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'lib.db'}"
    store = ExperienceStore(url)
    yield url, store
    store.close()


def library() -> LibraryConfig:
    return LibraryConfig(manager=ManagerConfig(random_demote=False, sync_interval_s=0.2), index=IndexConfig(use_gpu="never"))


@pytest.mark.slow
def test_manager_actor_killed_restarts_rebuilds_from_the_store_and_callers_retry(cluster, lib_store):
    url, store = lib_store
    m = RemoteManager.start(url, library(), seed=0, cpus=0.5, call_timeout_s=120, restart_timeout_s=120)
    try:
        ctx = OpContext(env="alfworld", task="put an apple in the fridge", run_id=None, step=1)
        r = m.apply_operations([Operation("add", text=APPLE)], ctx)[0]
        assert r.ok, r.error
        s = m.apply_operations([Operation("add", text=STAIRS)], OpContext(env=ENV, task="reach the stairs", step=1))[0]
        before = m.info()
        assert before["size"] == 2
        kill(before["pid"])
        # the caller's next call meets a dead actor: it is retried once Ray has restarted it
        hits = m.search_sync(["put an apple in the fridge", "reach the stairs"], task=["alfworld", ENV])
        assert [h[0].entry_id for h in hits] == [r.new_id, s.new_id]
        after = m.info()
        assert after["pid"] != before["pid"] and after["incarnation"] != before["incarnation"]
        assert after["size"] == 2 and m.retried_calls >= 1  # rebuilt from the store: nothing written was lost
        assert m.entry_texts([r.new_id]) == {r.new_id: APPLE}
        # the retrieval latencies through the proxy: the restarted actor's window, which a cursor from before the
        # restart (past its count) reads from the start; a read resets nothing
        lat, n = m.latency_percentiles(since=10**6)
        assert n >= 2 and lat["retrieval/latency_p99_ms"] >= lat["retrieval/latency_p50_ms"] > 0
        assert m.latency_percentiles(since=n) == ({}, n) and m.latency_percentiles() == (lat, n)
    finally:
        m.close()


@pytest.mark.slow
def test_a_retried_write_is_not_applied_twice(cluster, lib_store):
    """The actor died after committing some of a call's operations: the retry skips what the store already holds."""
    url, store = lib_store
    m = RemoteManager.start(url, library(), seed=0, cpus=0.5)
    try:
        ctx = OpContext(env="alfworld", task="put an apple in the fridge", run_id=None, step=3, episode_id=None)
        first = m.apply_operations([Operation("add", text=APPLE)], ctx)
        ops = [Operation("add", text=APPLE), Operation("add", text=STAIRS), Operation("discard", ids=[first[0].new_id])]
        # what the caller sends when it retries: the first add is in the store already (the interrupted call's)
        again = ray.get(m.actor.apply_operations.remote(ops, ctx, True))
        assert [x.ok for x in again] == [True, True, True]
        assert again[0].new_id == first[0].new_id  # found, not written again
        texts = [e.text for e in store.list_entries(status=None, limit=100).entries]
        assert texts.count(APPLE) == 1 and texts.count(STAIRS) == 1
        # and the same retried call once more changes nothing
        ray.get(m.actor.apply_operations.remote(ops, ctx, True))
        assert store.count(status=None) == 2 and store.count() == 1
    finally:
        m.close()


@pytest.mark.slow
def test_in_memory_sqlite_is_refused_with_the_fix(cluster):
    from core.config import ConfigError

    with pytest.raises(ConfigError, match="SQLite file"):
        RemoteManager.start("sqlite://", library(), seed=0)


def test_bad_executor_and_ray_fields_are_refused_by_name():
    from core.config import ConfigError
    from trainers.config import load_run_config

    with pytest.raises(ConfigError, match="run.executor must be local or ray"):
        load_run_config({"run": {"executor": "slurm"}})
    with pytest.raises(ConfigError, match="ray.num_cpus and ray.env_actors"):
        load_run_config({"run": {"executor": "ray"}, "ray": {"env_actors": -1}})
    assert load_run_config({"run": {"executor": "ray"}, "ray": {"address": "auto"}}).ray.address == "auto"


def test_an_address_where_nothing_answers_is_refused_at_once():
    from core.config import ConfigError
    from trainers.ray_exec import check_reachable

    with pytest.raises(ConfigError, match="nothing answers there"):
        check_reachable("127.0.0.1:1", timeout_s=2)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        check_reachable("head-node")


@pytest.mark.slow
def test_a_restarted_rollout_engine_gets_the_learners_weights_back(cluster, tiny):
    """Weights reach the engine actor through the object store; an engine Ray restarted (the folder's weights) is
    given the last synced ones before the call is retried."""
    import torch

    from trainers.ray_remote import RemoteEngine

    engine = RemoteEngine(str(tiny.path), threads=1, cpus=0.5, restart_timeout_s=120)
    try:
        prompt = [tiny.encode("north east south west")]
        greedy = dict(max_new_tokens=6, temperature=0.0)
        first = engine.generate(prompt, **greedy)
        assert [o.token_ids for o in first] == [o.token_ids for o in tiny.generate(prompt, **greedy)]
        changed = {k: (v + 0.5 * torch.randn_like(v) if v.is_floating_point() else v) for k, v in tiny.state_dict_for_sync().items()}
        engine.sync_weights(changed)
        after = engine.generate(prompt, **greedy)
        assert [o.logprobs for o in after] != [o.logprobs for o in first]  # the synced weights are in use
        kill(ray.get(engine.actor.pid.remote()))
        again = engine.generate(prompt, **greedy)  # retried once Ray restarted it, with `changed` loaded again
        assert engine.retried_calls >= 1
        assert [o.token_ids for o in again] == [o.token_ids for o in after]
        assert [o.logprobs for o in again] == [o.logprobs for o in after]
    finally:
        engine.close()


@pytest.mark.slow
def test_vllm_rollout_engine_in_a_ray_actor_follows_the_learners_weights(cluster, tmp_path):
    """ray.rollout_engine with actor.backend vllm: vLLM's engine in a Ray actor. Its greedy tokens and log-probs equal
    the hf learner's on the folder's weights and again after the learner's weights changed and were synced through
    the object store (and differ from before the sync)."""
    from conftest import require_vllm

    require_vllm()
    import torch

    from trainers import prompts as P
    from trainers.config import load_run_config
    from trainers.models import HFBackend, build_tiny_qwen2, build_tokenizer, save_model_folder
    from trainers.ray_remote import RemoteEngine

    assert load_run_config("run: {executor: ray}\nactor: {backend: vllm}\nray: {rollout_engine: true}\n").ray.rollout_engine
    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, "north east south west southeast"] * 30, vocab_size=400)
    model = build_tiny_qwen2(tok, hidden=128, layers=1, heads=4, kv_heads=2, seed=0)  # head size 32: vLLM's CPU minimum
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)  # sharp logits: greedy choices are not near-ties
    save_model_folder(model, tok, tmp_path)
    learner = HFBackend(tmp_path, device="cpu", num_threads=1)
    engine = RemoteEngine(str(tmp_path), threads=1, cpus=0.5, restart_timeout_s=300, backend="vllm")
    try:
        assert engine.describe().startswith("ray actor: vllm ") and engine.kind == "vllm"
        prompt = [learner.encode("north east south west")]
        greedy = dict(max_new_tokens=6, temperature=0.0)

        def same(a, b):
            assert [o.token_ids for o in a] == [o.token_ids for o in b]
            assert torch.allclose(torch.tensor(a[0].logprobs), torch.tensor(b[0].logprobs), atol=1e-3)

        first = engine.generate(prompt, **greedy)
        same(first, learner.generate(prompt, **greedy))
        with torch.no_grad():
            for p in learner.model.parameters():
                p.add_(0.3 * torch.randn_like(p))
        engine.sync_weights(learner.state_dict_for_sync())
        after = engine.generate(prompt, **greedy)
        same(after, learner.generate(prompt, **greedy))
        assert [o.logprobs for o in after] != [o.logprobs for o in first]
    finally:
        engine.close()

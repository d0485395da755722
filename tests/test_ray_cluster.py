"""`comprl train --set run.executor=ray` end to end: a deterministic run logs what the local executor logs, a run joins
a two-node cluster (ray.cluster_utils.Cluster, both nodes on loopback) with its env actors spread over both, and a lost
node stops a reset with a clear message until the cluster has room again."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (make setup installs it)")

from core.library_io import import_library  # noqa: E402
from core.store import ExperienceStore  # noqa: E402
from core.types import format_entry_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = "minihack/Room-5x5"
# measured per run, never equal between two runs: timings, rates and latencies
TIMED = ("time/", "latency", "_per_s", "rollout/seconds", "rollout/retrieval_s")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """Tiny random-weight policy and extractor folders (as tests/test_engine.py)."""
    from trainers import prompts as P
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder

    d = tmp_path_factory.mktemp("models")
    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, P.EXTRACTOR_USER, "north east south west"] * 30, vocab_size=400)
    for name in ("policy", "extractor"):
        save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=1), tok, d / name)
    return d


def write_config(path: Path, models: Path, steps: int = 2) -> Path:
    path.write_text(f"""
run: {{name: ray-vs-local, variant: complementary, max_steps: {steps}, eval_episodes: 2, checkpoint_every: 1, threads: 1,
      deterministic: true}}
env: {{names: {{{ENV}: 1.0}}, max_turns: 3}}
actor: {{path: {models / 'policy'}, max_new_tokens: 4}}
rollout: {{tasks_per_step: 1, group_size: 4, with_experience: 2}}
extractor: {{model: {{path: {models / 'extractor'}, max_new_tokens: 24}}, buffer_size: 4, merge_every: 2}}
""")
    return path


def seed_library(data: Path, url: str) -> None:
    """A few entries, so that retrieval, Eq. 6's counters and the extractor's credit all run through the manager."""
    data.mkdir(parents=True, exist_ok=True)
    lines = [{"text": format_entry_text(f"Tip {i}", "MiniHack rooms", f"Move {d} first, then look for the > sign."),
              "env": ENV, "task": f"Reach the stairs in room {i}."} for i, d in enumerate(["north", "east", "south", "west"])]
    f = data / "lib.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    store = ExperienceStore(url)
    import_library(store, f)
    store.close()


def sqlite(data: Path) -> str:
    return f"sqlite:///{data / 'workbench.db'}"


def train(cfg: Path, data: Path, url: str, *sets: str, timeout: float = 600) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    args = [a for s in sets for a in ("--set", s)]
    p = subprocess.run([sys.executable, "-m", "app.cli", "train", str(cfg), *args, "--data-dir", str(data), "--db", url],
                       cwd=ROOT, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-4000:]
    return p.stdout


def logged(url: str) -> tuple[dict, dict, list]:
    store = ExperienceStore(url)
    run = store.list_runs()[0]
    metrics = {(k, s): v for _, k, s, v, _ in store.metrics_since(run["id"]) if not any(t in k for t in TIMED)}
    entries = [(e.id, e.text, e.status.value, e.retrieved_count, e.successes, e.failures)
               for e in store.list_entries(status=None, limit=1000).entries]
    store.close()
    return run, metrics, entries


@pytest.mark.slow
@pytest.mark.both_backends
def test_a_deterministic_ray_run_logs_what_the_local_run_logs(tmp_path, models, new_db_url, db_backend):
    """On SQLite (the manager actor pinned beside the file) and on Postgres (placed by Ray)."""
    cfg = write_config(tmp_path / "c.yaml", models)
    urls = {name: new_db_url() for name in ("local", "ray")}
    for name in ("local", "ray"):
        seed_library(tmp_path / name, urls[name])
    train(cfg, tmp_path / "local", urls["local"])
    out = train(cfg, tmp_path / "ray", urls["ray"], "run.executor=ray", "ray.num_cpus=2", "ray.env_actors=2",
                "ray.rollout_engine=true")
    assert "executor ray: a local cluster started by this run" in out and "2 env actor(s) on 1 node(s)" in out
    assert "rollout engine ray actor: hf (transformers)" in out  # generation in an actor, synced after each update
    run_l, local, lib_l = logged(urls["local"])
    run_r, remote, lib_r = logged(urls["ray"])
    assert run_l["status"] == run_r["status"] == "finished" and run_r["step"] == 2
    assert ("retrieval/hit_rate", 2) in local and local[("retrieval/hit_rate", 2)] > 0  # the library was searched
    assert ("eval/success_with_exp", 2) in local
    assert remote == local  # every step's success, loss, library and eval figure
    assert lib_r == lib_l  # the same entries, retrieved as often, credited the same


@pytest.fixture(scope="module")
def two_nodes():
    """A head node and a worker node of one CPU each, on loopback."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    # both nodes on loopback; the runs the tests start inherit the switch through the environment
    from ray._private import ray_constants

    from trainers.ray_exec import loopback_only

    old = ray_constants.ENABLE_RAY_CLUSTER
    loopback_only()
    node = dict(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=100 * 1024**2)
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    worker = c.add_node(**node)
    c.wait_for_nodes()
    yield c, worker, node
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()
    ray_constants.ENABLE_RAY_CLUSTER = old
    os.environ.pop(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, None)


@pytest.mark.slow
def test_a_run_joins_a_two_node_cluster_and_spreads_its_env_actors(tmp_path, models, two_nodes):
    c, _, _ = two_nodes
    cfg = write_config(tmp_path / "c.yaml", models, steps=1)
    seed_library(tmp_path / "data", sqlite(tmp_path / "data"))
    out = train(cfg, tmp_path / "data", sqlite(tmp_path / "data"), "run.executor=ray", f"ray.address={c.address}",
                "ray.env_actors=2")
    assert "executor ray: the cluster at 127.0.0.1:" in out and "2 node(s)" in out, out[-3000:]
    assert "2 env actor(s) on 2 node(s); the manager on the driver’s node" in out
    run, metrics, _ = logged(sqlite(tmp_path / "data"))
    assert run["status"] == "finished" and ("policy/success_with_exp", 1) in metrics


@pytest.mark.slow
def test_a_lost_node_stops_resets_with_a_clear_message_until_there_is_room(two_nodes):
    from trainers.ray_exec import RayEnvPool

    c, worker, node = two_nodes
    ray.init(address=c.address, log_to_driver=False)
    # one CPU per actor: one actor on each node, and no room for a second on the head
    pool = RayEnvPool([ENV] * 2, num_actors=2, step_timeout_s=30, reset_timeout_s=20, actor_cpus=1)
    try:
        infos = pool.actor_info()
        assert len({i["node_id"] for i in infos}) == 2
        lost = [w for w, i in enumerate(infos) if i["node_id"] == worker.node_id]
        assert lost and not any(r.error for r in pool.reset_many([(0, 0, None), (1, 1, None)]))
        c.remove_node(worker)
        out = pool.step_many([(0, "north"), (1, "north")])
        assert out[lost[0]].error and not out[1 - lost[0]].error  # the episode on the lost node failed, the other went on
        with pytest.raises(RuntimeError, match="could not be restarted"):
            pool.reset_many([(0, 2, None), (1, 3, None)])
        c.add_node(**node)  # room again: Ray restarts the actor on the new node
        c.wait_for_nodes()
        assert not any(r.error for r in pool.reset_many([(0, 4, None), (1, 5, None)]))
    finally:
        pool.close()

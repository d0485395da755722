"""`comprl train` end to end as a separate process: a short run, SIGKILL and resume, a bad config.

Every test that takes `db_url` runs twice: on a SQLite file and on a real Postgres server (tests/conftest.py; skipped
with how to enable it where none is reachable). The trainer gets the URL by COMPRL_DB, as a user's would; the test
opens its store first, so the trainer never races it to create the tables."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.store import ExperienceStore

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.both_backends


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """Tiny random-weight policy and extractor folders (the warm start is tested elsewhere)."""
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder
    from trainers import prompts as P

    d = tmp_path_factory.mktemp("models")
    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, P.EXTRACTOR_USER, "north east south west"] * 30, vocab_size=400)
    for name in ("policy", "extractor"):
        save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=1), tok, d / name)
    return d


def write_config(path: Path, models: Path, *, variant: str = "complementary", steps: int = 2, extra: str = "",
                 deterministic: bool = False) -> Path:
    path.write_text(f"""
run: {{name: test-{variant}, variant: {variant}, max_steps: {steps}, eval_episodes: 2, checkpoint_every: 1, threads: 1,
      deterministic: {str(deterministic).lower()}}}
env: {{names: {{minihack/Room-5x5: 1.0}}, max_turns: 3}}
actor: {{path: {models / 'policy'}, max_new_tokens: 4}}
rollout: {{tasks_per_step: 1, group_size: 4, with_experience: {0 if variant == "grpo" else 2}}}
extractor: {{model: {{path: {models / 'extractor'}, max_new_tokens: 24}}, buffer_size: 4, merge_every: 2}}
{extra}
""")
    return path


def comprl(*args: str, data: Path, db: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COMPRL_DB": db}
    return subprocess.Popen([sys.executable, "-m", "app.cli", *args, "--data-dir", str(data)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("deterministic", [False, True], ids=["overlapped", "deterministic"])
def test_two_step_run_end_to_end(tmp_path, db_url, models, deterministic):
    cfg = write_config(tmp_path / "c.yaml", models, deterministic=deterministic)
    p = comprl("train", str(cfg), data=tmp_path / "data", db=db_url)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out
    store = ExperienceStore(db_url)
    run = store.list_runs()[0]
    assert run["status"] == "finished" and run["step"] == 2 and "hf (transformers)" in run["backend"]
    m = store.latest_metrics(run["id"])
    for key in ("policy/success_with_exp", "policy/success_without_exp", "policy/actions_with_exp", "policy/frac_nonzero_adv",
                "rollout/episodes_per_s", "rollout/tokens_per_s", "retrieval/latency_p50_ms", "extractor/parse_failures",
                "library/size", "eval/success_without_exp", "eval/success_with_exp"):
        assert key in m, key
    assert store.metrics_since(run["id"], ["policy/success_without_exp"])[-1][2] == 2  # one point per step
    staleness = [v for _, _, s, v, _ in store.metrics_since(run["id"], ["rollout/staleness"])]
    assert staleness == ([0.0, 0.0] if deterministic else [0.0, 1.0])  # step 2 was collected while step 1 learned
    assert len(store.list_trajectories(run_id=run["id"])) > 0
    ck = Path(run["checkpoint_dir"])
    latest = ck / (ck / "latest").read_text().strip()
    assert (latest / "policy" / "config.json").exists() and (latest / "extractor" / "config.json").exists()
    assert (latest / "state.pt").exists()
    # a fork is a new run that starts from the parent's checkpoint
    f = comprl("train", "--fork", str(run["id"]), "--max-steps", "3", data=tmp_path / "data", db=db_url)
    out, _ = f.communicate(timeout=600)
    assert f.returncode == 0, out
    assert "forked from step 2" in out
    child = store.list_runs()[0]
    assert child["id"] != run["id"] and child["parent_run_id"] == run["id"] and child["step"] == 3
    assert store.get_run(run["id"])["step"] == 2  # the parent is untouched


@pytest.mark.slow
def test_the_last_step_is_evaluated_once(tmp_path, db_url, models):
    """eval_every dividing max_steps: the periodic evaluation at the last step is the final one (not played twice)."""
    cfg = write_config(tmp_path / "c.yaml", models, variant="grpo")
    p = comprl("train", str(cfg), "--set", "run.eval_every=1", "--set", "run.eval_at_start=true", data=tmp_path / "data", db=db_url)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out
    store = ExperienceStore(db_url)
    rows = store.metrics_since(store.list_runs()[0]["id"], ["eval/success_without_exp"])
    assert [s for _, _, s, _, _ in rows] == [0, 1, 2]


@pytest.mark.slow
def test_bad_config_stops_before_any_work(tmp_path, db_url, models):
    bad = write_config(tmp_path / "bad.yaml", models, extra="loss: {ratio_level: per-word}")
    p = comprl("train", str(bad), data=tmp_path / "data", db=db_url)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 2
    assert "loss.ratio_level" in out and "Traceback" not in out
    assert not ExperienceStore(db_url).list_runs()


@pytest.mark.slow
def test_sigkill_then_resume_loses_nothing(tmp_path, db_url, models):
    data = tmp_path / "data"
    cfg = write_config(tmp_path / "c.yaml", models, variant="grpo", steps=5)
    store = ExperienceStore(db_url)
    p = comprl("train", str(cfg), data=data, db=db_url, start_new_session=True)
    deadline = time.time() + 400
    while time.time() < deadline:
        time.sleep(0.5)
        runs = store.list_runs()
        if runs and runs[0]["step"] >= 2 and (data / "runs" / str(runs[0]["id"]) / "checkpoints" / "latest").exists():
            break
    else:
        p.kill()
        pytest.fail("the run never reached step 2")
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    run_id = store.list_runs()[0]["id"]
    killed_at = store.get_run(run_id)["step"]
    store.add_entry("a person's entry written while the run was dead", env="minihack/Room-5x5", actor="human")
    entries_before = store.count(status=None)
    r = comprl("train", "--resume", str(run_id), data=data, db=db_url)
    out, _ = r.communicate(timeout=600)
    assert r.returncode == 0, out
    assert "resumed from" in out
    run = store.get_run(run_id)
    assert run["status"] == "finished" and run["step"] == 5
    steps = sorted({s for _, _, s, _, _ in store.metrics_since(run_id, ["policy/success_without_exp"])})
    assert steps == [1, 2, 3, 4, 5] and killed_at >= 2
    assert store.count(status=None) >= entries_before  # no experience entry lost


@pytest.mark.slow
def test_pause_resume_stop_commands(tmp_path, db_url, models):
    data = tmp_path / "data"
    cfg = write_config(tmp_path / "c.yaml", models, variant="grpo", steps=50)
    store = ExperienceStore(db_url)
    p = comprl("train", str(cfg), data=data, db=db_url)
    deadline = time.time() + 300
    while time.time() < deadline:
        time.sleep(0.5)
        runs = store.list_runs()
        if runs and runs[0]["step"] >= 1:
            break
    run_id = store.list_runs()[0]["id"]
    store.send_command(run_id, "pause")
    t0 = time.time()
    while store.get_run(run_id)["status"] != "paused" and time.time() - t0 < 120:
        time.sleep(0.3)
    assert store.get_run(run_id)["status"] == "paused"
    step = store.get_run(run_id)["step"]
    time.sleep(2)
    assert store.get_run(run_id)["step"] == step  # nothing happens while paused
    store.send_command(run_id, "resume")
    store.send_command(run_id, "stop")
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out
    run = store.get_run(run_id)
    assert run["status"] == "stopped" and run["step"] < 50
    assert (Path(run["checkpoint_dir"]) / "latest").exists()  # a graceful stop writes a checkpoint


@pytest.mark.slow
def test_eval_command_logs_checkpoints_at_their_step_and_never_a_foreign_model(tmp_path, db_url, models):
    """`comprl eval RUN_ID` logs greedy and sampled eval/* metrics at the checkpoint's step; evaluating
    another model folder (the starting policy) prints its table and leaves the run's curves alone."""
    cfg = write_config(tmp_path / "c.yaml", models, variant="grpo", steps=1, deterministic=True)
    p = comprl("train", str(cfg), data=tmp_path / "data", db=db_url)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out
    store = ExperienceStore(db_url)
    rid = store.list_runs()[0]["id"]
    keys = ["eval/success_without_exp", "eval/success_without_exp_sampled"]
    before = store.metrics_since(rid, keys)
    e = comprl("eval", str(rid), "--episodes", "3", data=tmp_path / "data", db=db_url)
    out, _ = e.communicate(timeout=600)
    assert e.returncode == 0, out
    assert "without_exp_sampled | 3 |" in out and f"logged as eval/* metrics of run {rid} at step 1" in out
    after = store.metrics_since(rid, keys)
    # The run's own final evaluation was at step 1 too: the new one supersedes it (one value per step and key).
    assert {(k, s) for _, k, s, _, _ in before} == {(k, 1) for k in keys}
    assert sorted((k, s) for _, k, s, _, _ in after) == sorted((k, 1) for k in keys)
    assert max(t for *_, t in after) > max(t for *_, t in before)  # the stored values are the new evaluation's
    e = comprl("eval", str(rid), "--episodes", "3", "--checkpoint", str(models / "policy"), data=tmp_path / "data", db=db_url)
    out, _ = e.communicate(timeout=600)
    assert e.returncode == 0, out
    assert "not logged" in out and len(store.metrics_since(rid, keys)) == len(after)
    e = comprl("eval", str(rid), "--episodes", "3", "--no-log", data=tmp_path / "data", db=db_url)
    out, _ = e.communicate(timeout=600)
    assert e.returncode == 0, out
    assert "not logged: --no-log" in out and len(store.metrics_since(rid, keys)) == len(after)


@pytest.mark.slow
def test_a_missing_model_folder_is_refused_before_any_running_row(tmp_path, db_url, models):
    cfg = write_config(tmp_path / "c.yaml", models, variant="grpo")
    cfg.write_text(cfg.read_text().replace(str(models / "policy"), str(tmp_path / "no-such-model")))
    p = comprl("train", str(cfg), data=tmp_path / "data", db=db_url)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 2 and "Traceback" not in out, out
    assert out.strip().splitlines()[-1].startswith("comprl: error: actor.path:") and "does not exist" in out
    store = ExperienceStore(db_url)
    assert store.list_runs() == []
    # a row the workbench made before starting the trainer is marked failed, with the reason
    rid = store.create_run("from the workbench", status="created")
    p = comprl("train", str(cfg), "--run-id", str(rid), data=tmp_path / "data", db=db_url)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 2, out
    row = store.get_run(rid)
    assert row["status"] == "failed" and row["error"].startswith("actor.path:")


def test_partial_checkpoints_are_cleaned_and_a_moved_aside_step_is_restored(tmp_path):
    from trainers.engine import clean_partial_checkpoints, latest_checkpoint

    root = tmp_path / "checkpoints"
    for name in ("step_000001", ".tmp_step_000002_123", ".old_step_000003_77", ".old_step_000001_5"):
        (root / name).mkdir(parents=True)
        (root / name / "state.pt").write_bytes(b"x")
    (root / ".latest.tmp").write_text("step_000002")
    (root / "latest").write_text("step_000003")
    clean_partial_checkpoints(root)
    # the half-written step 2 is gone; step 3, moved aside by a re-save killed before the new copy arrived,
    # is back under its name; a moved-aside copy of a step that is complete is deleted
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001", "step_000003"]
    assert latest_checkpoint(root) == root / "step_000003"


@pytest.mark.slow
def test_random_sigkills_every_resume_finishes_nothing_lost_nothing_doubled(tmp_path, db_url, models):
    """The reliability figure: a short complementary run SIGKILLed at N random moments (rollouts, learner,
    extractor, merge, checkpoint writes), each time found dead and resumed. Then: it finishes, every step's
    metrics and episodes are stored exactly once, no entry seen before a kill is gone, no temp folder is left."""
    import random

    rng = random.Random(26)
    n_kills, steps = 5, 24  # a step of this tiny run takes well under a second: kills are placed by step, below
    data = tmp_path / "data"
    cfg = write_config(tmp_path / "c.yaml", models, steps=steps)
    store, run_id, kills, entries_seen, closing = ExperienceStore(db_url), None, 0, set(), False

    def start(*args: str) -> subprocess.Popen:
        log = (tmp_path / f"attempt{kills}.log").open("w")  # a file, not a pipe nobody reads while we wait
        return subprocess.Popen([sys.executable, "-m", "app.cli", "train", *args, "--data-dir", str(data)], cwd=ROOT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "COMPRL_DB": db_url}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    killed_at = []  # (step the row showed, newest checkpoint) at each kill
    p = start(str(cfg))
    for _ in range(n_kills):
        deadline = time.time() + 300
        log = tmp_path / f"attempt{kills}.log"
        # Odd attempts die while starting (models loaded; embedder, envs, first rollouts coming up), even ones
        # 1-3 steps after they resumed, at a random moment of rollouts, learner, extractor, merge or a save.
        starting = bool(kills % 2)
        ahead = rng.randint(1, 3)
        first_step = None
        while p.poll() is None and time.time() < deadline:
            time.sleep(0.05)
            if "actor back end" not in log.read_text(errors="replace"):
                continue
            runs = store.list_runs()
            if not runs or runs[0]["pid"] != p.pid or runs[0]["status"] != "running":
                continue
            run_id = runs[0]["id"]
            first_step = runs[0]["step"] if first_step is None else first_step
            if starting or runs[0]["step"] >= first_step + ahead:
                break
        time.sleep(rng.uniform(0.0, 1.0 if starting else 0.4))
        if p.poll() is not None:
            break  # the run finished before this kill
        # the tiny random extractor rarely writes a parseable entry: a person's edit made while the run is live
        # stands in for "an entry written before the kill", which no resume may drop
        store.add_entry(f"written while attempt {kills} ran", env="minihack/Room-5x5", task="t", actor="human")
        entries_seen |= {e.id for e in store.list_entries(status=None, limit=10**6).entries}
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
        if store.get_run(run_id)["status"] == "finished":
            closing = True  # it had written "finished" and was closing down: nothing left to resume
            break
        kills += 1
        ck = Path(store.get_run(run_id)["checkpoint_dir"]) / "latest"
        killed_at.append((store.get_run(run_id)["step"], ck.read_text() if ck.exists() else None))
        assert store.get_run(run_id)["status"] == "running"  # what a killed trainer leaves behind ...
        assert store.reap_dead_runs() == [run_id]  # ... until someone looks
        assert store.get_run(run_id)["error"].startswith(f"died: process {p.pid}")
        p = start("--resume", str(run_id))
    assert p.wait(timeout=900) == (-signal.SIGKILL if closing else 0), (tmp_path / f"attempt{kills}.log").read_text()[-3000:]
    run = store.get_run(run_id)
    assert run["status"] == "finished" and run["step"] == steps
    points = [(k, s) for _, k, s, _, _ in store.metrics_since(run_id)]
    duplicated = len(points) - len(set(points))
    episodes = store.list_trajectories(run_id=run_id, limit=10**6)
    per_step = {s: sum(t["step"] == s for t in episodes) for s in range(1, steps + 1)}
    lost = entries_seen - {e.id for e in store.list_entries(status=None, limit=10**6).entries}
    temp = [q.name for q in Path(run["checkpoint_dir"]).iterdir() if q.name.startswith(".")]
    # entry outcomes (entry_usage) credited by this run: one per (entry, stored episode), none from a dropped one
    usage = [(i, u["episode_id"], u["step"]) for i in entries_seen for u in store.usage(i, limit=10**6)
             if u["run_id"] == run_id]
    kept = {t["id"] for t in episodes}
    orphan_outcomes = [u for u in usage if u[1] not in kept]
    doubled_outcomes = len(usage) - len({(i, e) for i, e, _ in usage})
    print(f"\nkills survived/tried {kills}/{kills}; duplicated metric points {duplicated}; "
          f"episodes per step {per_step}; entries lost {len(lost)} of {len(entries_seen)}; temp folders {temp}; "
          f"entry outcomes {len(usage)} (of dropped episodes {len(orphan_outcomes)}, doubled {doubled_outcomes}); "
          f"killed at (step, checkpoint) {killed_at}")
    assert kills == n_kills and len({s for s, _ in killed_at}) >= 3  # every kill landed, at different points of the run
    assert duplicated == 0 and not lost and temp == []
    assert usage and not orphan_outcomes and doubled_outcomes == 0
    assert per_step == {s: 4 for s in range(1, steps + 1)}  # tasks_per_step 1 x group_size 4, each stored once
    assert {s for k, s in points if k == "policy/success_without_exp"} == set(range(1, steps + 1))


@pytest.mark.slow
def test_sigterm_stops_after_the_step_and_a_second_one_at_once(tmp_path, db_url, models):
    """SIGTERM is honoured in every phase: the first ends the run after the step in flight, with a checkpoint; a second
    (a step can take minutes on a CPU) ends it at once. Either way the row says stopped, never running."""
    data = tmp_path / "data"
    cfg = write_config(tmp_path / "c.yaml", models, variant="grpo", steps=200)
    # Steps long enough (128 episodes of up to 30 turns) that the second signal lands inside one, not after a
    # graceful stop that the first already completed.
    text = cfg.read_text().replace("tasks_per_step: 1, group_size: 4", "tasks_per_step: 16, group_size: 8")
    cfg.write_text(text.replace("max_turns: 3}", "max_turns: 30}"))
    store = ExperienceStore(db_url)
    p = comprl("train", str(cfg), data=data, db=db_url, start_new_session=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline:  # the condition: the loop is running (a first step logged)
            time.sleep(0.5)
            runs = store.list_runs()
            if runs and runs[0]["step"] >= 1:
                break
            assert p.poll() is None, p.stdout.read()
        else:
            pytest.fail("the run never logged a step")
        import threading

        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True)
        reader.start()
        p.send_signal(signal.SIGTERM)
        # The second signal only once the first has been handled: two signals that arrive before Python runs its
        # handler are delivered as one (under load the main thread can sit in a torch call for a while).
        deadline = time.time() + 300
        while not any("send the signal again" in ln for ln in list(lines)) and time.time() < deadline and p.poll() is None:
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=120)
        reader.join(timeout=30)
        out = "".join(lines)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 128 + signal.SIGTERM, out
    assert "send the signal again" in out
    run = store.list_runs()[0]
    assert run["status"] == "stopped" and "second signal" in run["error"] and run["pid"] is None


# -- reproducibility and the variants' semantics ---------------------------------------------------------------------

# Wall-clock measurements, never equal between two runs; every other metric of a deterministic run is a function of
# its seed (tests/test_ray_cluster.py excludes the same kind of keys by pattern).
TIMING = frozenset({"time/step_s", "time/merge_s", "rollout/seconds", "rollout/retrieval_s", "rollout/episodes_per_s",
                    "rollout/tokens_per_s", "retrieval/latency_p50_ms", "retrieval/latency_p99_ms",
                    "search_and_ask/latency_ms", "critic/latency_ms"})
# A 2-step run in which both learners have something to learn from: a library whose entries the extractor wrote
# (below); actions constrained to the admissible ones and 60 turns, so that the random policy reaches the stairs in
# about a third of its 8 episodes a step (with 8 turns it never did: every entry's reward was -1, CISPO's advantages
# all zero and the extractor's weights unchanged); CISPO after 4 samples; no evaluation.
LEARNING = ("rollout.constrain_actions=true", "env.max_turns=60", "rollout.tasks_per_step=2", "extractor.buffer_size=4",
            "run.eval_episodes=0")


def seed_extracted_library(db_url: str, models: Path, n: int = 8) -> None:
    """n entries as the extractor writes them: each keeps a real generation of the extractor model (prompt and
    response ids, log-probs), so that when one is retrieved its episodes' outcomes become a CISPO sample. The tiny
    random extractor writes nothing that parses, so without these the extractor's update never runs."""
    import json

    from core.library_io import import_library
    from core.types import format_entry_text
    from trainers import prompts as P
    from trainers.models import HFBackend

    backend = HFBackend(models / "extractor", device="cpu", num_threads=1)
    tasks = [f"Reach the stairs in room {i}." for i in range(n)]
    prompts = [list(backend.apply_chat_template([{"role": "system", "content": P.EXTRACTOR_SYSTEM},
                                                 {"role": "user", "content": t}], add_generation_prompt=True, tokenize=True))
               for t in tasks]
    outs = backend.generate(prompts, max_new_tokens=8, temperature=1.0, seed=0)
    lines = [{"text": format_entry_text(f"Tip {i}", "MiniHack rooms", f"Move {d} first, then look for the > sign."),
              "env": "minihack/Room-5x5", "task": t, "source": "extracted",
              "generation": {"prompt": t, "response": o.text, "prompt_ids": p, "response_ids": list(o.token_ids),
                             "response_logprobs": list(o.logprobs)}}
             for i, (d, t, p, o) in enumerate(zip(["north", "east", "south", "west"] * n, tasks, prompts, outs))]
    store = ExperienceStore(db_url)
    report = import_library(store, lines=[json.dumps(x) for x in lines])
    assert report.imported == n, report
    store.close()


def learning_run(tmp_path: Path, models: Path, variant: str) -> tuple[dict, Path]:
    """A deterministic 2-step run of `variant` on its own SQLite file: (its run row, its last checkpoint)."""
    db = f"sqlite:///{tmp_path / 'workbench.db'}"
    seed_extracted_library(db, models)
    cfg = write_config(tmp_path / "c.yaml", models, variant=variant, deterministic=True)
    p = comprl("train", str(cfg), *(a for s in LEARNING for a in ("--set", s)), data=tmp_path / "data", db=db)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out[-4000:]
    store = ExperienceStore(db)
    run = store.list_runs()[0]
    store.close()
    assert run["status"] == "finished" and run["step"] == 2
    ck = Path(run["checkpoint_dir"])
    return run, ck / (ck / "latest").read_text().strip()


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def same_weights(a: Path, b: Path) -> bool:
    import torch

    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    return all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_two_deterministic_runs_log_the_same_metrics_and_weights(tmp_path, models):
    """The same seed, twice: every metric of every step (all but TIMING), the library and both models' weights."""
    logged = {}
    for name in ("a", "b"):
        run, latest = learning_run(tmp_path / name, models, "complementary")
        store = ExperienceStore(f"sqlite:///{tmp_path / name / 'workbench.db'}")
        rows = store.metrics_since(run["id"])
        entries = [(e.id, e.text, e.status.value, e.retrieved_count, e.successes, e.failures)
                   for e in store.list_entries(status=None, limit=1000).entries]
        store.close()
        keys = {k for _, k, _, _, _ in rows}
        metrics = {(k, s): v for _, k, s, v, _ in rows if k not in TIMING}
        logged[name] = (keys, metrics, entries, latest)
    (keys_a, a, lib_a, ck_a), (keys_b, b, lib_b, ck_b) = logged["a"], logged["b"]
    # the comparison covers both learners: the actor stepped and CISPO ran on the extractor
    assert {("policy/loss", 2), ("extractor/updates", 2)} <= a.keys() and a[("extractor/updates", 2)] >= 1, sorted(a)
    assert keys_a == keys_b  # the timing keys too: only their values may differ
    assert a == b
    assert lib_a == lib_b
    assert same_weights(ck_a / "policy", ck_b / "policy") and same_weights(ck_a / "extractor", ck_b / "extractor")


@pytest.mark.slow
@pytest.mark.parametrize("variant, frozen, learner", [("static", "extractor", "policy"), ("exp_only", "policy", "extractor")])
def test_a_variant_leaves_its_frozen_model_unchanged(tmp_path, models, variant, frozen, learner):
    """docs/method.md's variants: static learns the actor with a frozen extractor, exp_only the extractor with a frozen
    actor. The same config for both, in which each model does learn when its variant trains it."""
    run, latest = learning_run(tmp_path, models, variant)
    assert same_weights(models / frozen, latest / frozen)
    assert not same_weights(models / learner, latest / learner)
    store = ExperienceStore(f"sqlite:///{tmp_path / 'workbench.db'}")
    m = store.latest_metrics(run["id"])
    store.close()
    if variant == "static":
        assert m["extractor/updates"] == 0.0 and "policy/loss" in m
    else:
        assert m["extractor/updates"] >= 1 and "policy/loss" not in m


def counters_of(db: str) -> dict:
    """What the algorithm reads of a finished run's store, in an order that does not depend on entry ids (a resumed run's
    replayed entries have new ids; the ones it took back stay, archived, in the history): each entry's text, status and
    counters (Eq. 6: retrievals; Eq. 7: trainings, last update; outcomes), each step's episodes and the entries they were
    shown, every metric but TIMING, and Eq. 7's weights at the end."""
    from core.advantages import weights_for_entries
    from trainers.config import ExtractorSection

    store = ExperienceStore(db)
    run = store.list_runs()[0]
    entries = [e for e in store.list_entries(status=None, limit=10**6).entries
               if store.history(e.id)[-1].action != "rollback" or e.status.value == "active"]
    text = {e.id: e.text for e in entries}
    metrics = {(k, s): v for _, k, s, v, _ in store.metrics_since(run["id"]) if k not in TIMING}
    episodes = sorted((t["step"], t["seed"], t["task"], t["success"], tuple(text[i] for i in store.get_trajectory(t["id"])["experience_ids"]))
                      for t in store.list_trajectories(run_id=run["id"], limit=10**6))
    xc = ExtractorSection()
    ids = [e.id for e in entries]
    eq7 = weights_for_entries(ids, {e.id: e.trained_count for e in entries}, {e.id: e.last_trained_step for e in entries},
                              int(metrics[("extractor/updates", run["step"])]), alpha=xc.alpha, cooldown=xc.cooldown)
    out = {"entries": [(e.text, e.task, e.created_step, e.source.value, e.status.value, e.retrieved_count, e.trained_count,
                        e.last_trained_step, e.successes, e.failures) for e in entries],
           "eq7": [float(w) for w in eq7], "episodes": episodes, "metrics": metrics, "run": (run["status"], run["step"])}
    store.close()
    return out


@pytest.mark.slow
def test_resume_counters_a_run_killed_past_its_checkpoint_and_resumed_reads_the_counters_of_a_run_never_killed(tmp_path, models):
    """Issue 40 item 5. Four deterministic steps straight, against four steps whose first attempt checkpoints at step 2
    and is SIGKILLed once step 3 is logged, then resumed: the replayed step 3 must not count twice. Every counter Eq. 6
    and Eq. 7 read (entry retrieval and training counts, last update, outcomes), the entries and which ones each
    episode was shown, every metric and both models' weights are equal. (last_retrieved_at is a wall-clock time, equal
    to the checkpoint's after the resume but never between two runs; Eq. 6's recency compares it with the clock. The
    random tiny extractor writes no entry that parses, so the undoing of a run's library writes is tested in
    tests/test_store.py.)"""
    # CISPO every 2 samples: an extractor update in every step, the replayed step 3's included
    sets = [a for s in (*LEARNING, "run.checkpoint_every=2", "extractor.buffer_size=2") for a in ("--set", s)]
    dbs = {}
    for name in ("straight", "killed"):
        (tmp_path / name).mkdir()
        dbs[name] = f"sqlite:///{tmp_path / name / 'workbench.db'}"
        seed_extracted_library(dbs[name], models)
    cfg = write_config(tmp_path / "c.yaml", models, steps=4, deterministic=True)
    p = comprl("train", str(cfg), *sets, data=tmp_path / "straight" / "data", db=dbs["straight"])
    out, _ = p.communicate(timeout=900)
    assert p.returncode == 0, out[-4000:]

    data, store = tmp_path / "killed" / "data", ExperienceStore(dbs["killed"])
    log = (tmp_path / "killed.log").open("w")
    p = subprocess.Popen([sys.executable, "-m", "app.cli", "train", str(cfg), *sets, "--max-steps", "8", "--data-dir",
                          str(data)], cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", "COMPRL_DB": dbs["killed"]},
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 900
    while p.poll() is None and time.time() < deadline and not (store.list_runs() and store.list_runs()[0]["step"] >= 3):
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)  # in step 4, before its checkpoint: step 3 is done but saved nowhere
    p.wait(timeout=60)
    run = store.list_runs()[0]
    assert run["step"] == 3 and (Path(run["checkpoint_dir"]) / "latest").read_text() == "step_000002", \
        (tmp_path / "killed.log").read_text()[-3000:]
    r = comprl("train", "--resume", str(run["id"]), "--max-steps", "4", data=data, db=dbs["killed"])
    out, _ = r.communicate(timeout=900)
    assert r.returncode == 0 and "resumed from step 2" in out, out[-4000:]
    took = next(line for line in out.splitlines() if "took back what the interrupted attempt wrote past step 2" in line)
    assert " 0 retrievals" not in took and " 0 training marks" not in took, took  # step 3 retrieved and trained
    store.close()

    a, b = counters_of(dbs["straight"]), counters_of(dbs["killed"])
    assert a["run"] == b["run"] == ("finished", 4)
    assert any(e[6] for e in a["entries"]) and any(e[5] for e in a["entries"])  # entries were trained on and retrieved
    assert a["entries"] == b["entries"]
    assert a["eq7"] == b["eq7"]
    assert a["episodes"] == b["episodes"]
    assert a["metrics"] == b["metrics"]
    ck = {n: Path(ExperienceStore(dbs[n]).list_runs()[0]["checkpoint_dir"]) / "step_000004" for n in dbs}
    assert same_weights(ck["straight"] / "policy", ck["killed"] / "policy")
    assert same_weights(ck["straight"] / "extractor", ck["killed"] / "extractor")

"""The store against a real SQLite file: CRUD, versions, diff, revert, stale writes, two processes."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from core.store import ExperienceStore, NewEntry, NotFoundError, StaleWriteError, StoreError
from core.types import Generation, Source, Status

ROOT = Path(__file__).resolve().parents[1]
# Every test that takes a database runs on SQLite and on Postgres (tests/conftest.py).
pytestmark = pytest.mark.both_backends


def test_add_get_and_fields(store):
    gen = Generation(prompt="p", response="r", prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-0.5], model_version=2)
    eid = store.add_entries([NewEntry(text="## Title: a", env="minihack/Room-5x5", task="reach >", query="reach >",
                                      generation=gen, created_step=4, run_id=None, query_embedding=np.ones(4, np.float32))])[0]
    e = store.get(eid)
    assert (e.text, e.env, e.task, e.version, e.status, e.source) == ("## Title: a", "minihack/Room-5x5", "reach >", 1, Status.ACTIVE, Source.EXTRACTED)
    assert e.generation == gen and e.created_step == 4
    assert store.embeddings([eid])[eid].tolist() == [1, 1, 1, 1]
    with pytest.raises(NotFoundError):
        store.get(999)
    with pytest.raises(StoreError):
        store.add_entries([NewEntry(text="  ")])


def test_library_version_moves_on_every_content_write_only(store):
    v0 = store.library_version()
    a = store.add_entry("one")
    v1 = store.library_version()
    store.update_text(a, "one!", expected_version=1)
    v2 = store.library_version()
    store.archive([a])
    v3 = store.library_version()
    store.restore([a])
    v4 = store.library_version()
    assert v0 < v1 < v2 < v3 < v4
    store.record_retrievals([a, a])  # statistics, not content
    store.record_trained([a], step=3)
    assert store.library_version() == v4
    assert store.get(a).retrieved_count == 2 and store.training_stats([a]) == {a: (1, 3)}
    cur, changed = store.changes_since(v2)
    assert cur == v4 and [e.id for e in changed] == [a]


def test_update_history_diff_revert(store):
    a = store.add_entry("line one\nline two")
    store.update_text(a, "line one\nline 2", expected_version=1, actor="alice")
    store.update_text(a, "line one\nline 2\nline three", expected_version=2, actor="bob")
    h = store.history(a)
    assert [(v.version, v.action, v.actor) for v in h] == [(1, "create", "extractor"), (2, "edit", "alice"), (3, "edit", "bob")]
    d = store.diff(a, 1, 3)
    assert "-line two" in d and "+line 2" in d and "+line three" in d
    e = store.revert(a, 1, expected_version=3)
    assert e.text == "line one\nline two" and e.version == 4
    assert store.history(a)[-1].note == "revert to v1"


def test_stale_write_is_refused_and_nothing_is_lost(store):
    a = store.add_entry("original")
    store.update_text(a, "alice's edit", expected_version=1)
    with pytest.raises(StaleWriteError) as err:
        store.update_text(a, "bob's edit from v1", expected_version=1)
    assert "version 1" in str(err.value) and "version 2" in str(err.value)
    assert store.get(a).text == "alice's edit" and store.get(a).version == 2
    assert [v.text for v in store.history(a)] == ["original", "alice's edit"]


def test_archive_restore_and_filters(store):
    ids = store.add_entries([NewEntry(text=f"entry {i} {'apple' if i % 2 else 'key'}", env="e1" if i < 6 else "e2",
                                      task=f"t{i % 3}", source=Source.MANUAL if i == 0 else Source.EXTRACTED) for i in range(10)])
    store.record_retrievals([ids[3]] * 5 + [ids[7]] * 2)
    store.archive([ids[1], ids[2]])
    assert store.count() == 8 and store.count(status=None) == 10
    assert store.list_entries(env="e2").total == 4
    assert store.list_entries(text="APPLE").total == 4  # odd i: 1,3,5,7,9, minus archived 1
    assert store.list_entries(source="manual").total == 1
    assert store.list_entries(task="t0").total == 4
    top = store.list_entries(sort="retrieved_count", descending=True, limit=2).entries
    assert [e.id for e in top] == [ids[3], ids[7]]
    page = store.list_entries(offset=3, limit=3)
    assert page.total == 8 and len(page.entries) == 3
    assert store.list_entries(status="archived").total == 2
    store.restore([ids[1]])
    assert store.get(ids[1]).status is Status.ACTIVE
    with pytest.raises(StoreError):
        store.list_entries(sort="text; drop table entries")


def test_replace_and_undo_keep_lineage(store):
    a, b = store.add_entry("a", env="e", task="t"), store.add_entry("b", env="e", task="t")
    c = store.replace_entries([a, b], NewEntry(text="a+b", source=Source.MERGED), actor="merge", action="merge")
    ec = store.get(c)
    assert ec.parent_ids == [a, b] and ec.env == "e" and ec.source is Source.MERGED
    assert store.get(a).status is Status.ARCHIVED and store.children(a) == [c]
    with pytest.raises(StoreError):
        store.replace_entries([a], NewEntry(text="x"), actor="m", action="merge")  # archived parent
    assert store.undo_replace(c) == [a, b]
    assert store.get(c).status is Status.ARCHIVED and store.get(a).status is Status.ACTIVE


def test_snapshot_at_past_version(store):
    a = store.add_entry("first")
    v = store.library_version()
    store.update_text(a, "second", expected_version=1)
    b = store.add_entry("other")
    snap = store.snapshot_at(v)
    assert [(s.entry_id, s.text) for s in snap] == [(a, "first")]
    assert {s.entry_id for s in store.snapshot_at(store.library_version())} == {a, b}


def test_runs_metrics_commands_trajectories_ab(store):
    r = store.create_run("demo", variant="grpo", env="minihack/Room-5x5")
    store.update_run(r, status="running", step=3)
    store.log_metrics(r, 1, {"policy/loss": 0.5, "policy/reward_with_exp": 0.1})
    store.log_metrics(r, 2, {"policy/loss": 0.4, "bad": float("nan")})
    rows = store.metrics_since(r, ["policy/loss"])
    assert [(k, s, v) for _, k, s, v, _ in rows] == [("policy/loss", 1, 0.5), ("policy/loss", 2, 0.4)]
    assert store.metrics_since(r, ["policy/loss"], after_id=rows[0][0])[0][3] == 0.4
    assert store.latest_metrics(r) == {"policy/loss": 0.4, "policy/reward_with_exp": 0.1}
    store.send_command(r, "pause")
    store.send_command(r, "stop")
    assert store.take_commands(r) == ["pause", "stop"] and store.take_commands(r) == []
    with pytest.raises(StoreError):
        store.send_command(r, "explode")
    t = store.add_trajectories([{"run_id": r, "env": "x", "task": "t", "seed": 1, "success": True, "num_actions": 2,
                                 "steps": [{"observation": "o", "action": "a"}], "experience_ids": [1]}])[0]
    assert store.get_trajectory(t)["steps"][0]["action"] == "a"
    ab = store.create_ab_test("a vs b", {"arms": 2})
    store.update_ab_test(ab, status="done", results={"p": 0.5})
    assert store.get_ab_test(ab)["results"] == {"p": 0.5}
    assert store.get_run(r)["status"] == "running"


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from core.store import ExperienceStore, StaleWriteError
    s = ExperienceStore({url!r})
    role, n = sys.argv[1], int(sys.argv[2])
    if role == "trainer":
        for i in range(n):
            s.add_entry(f"trainer entry {{i}}", env="e", actor="extractor")
    else:
        ids = [int(x) for x in sys.argv[3].split(",")]
        for r in range(n):
            for i in ids:
                while True:
                    e = s.get(i)
                    try:
                        s.update_text(i, e.text + f" +edit{{r}}", expected_version=e.version, actor="human")
                        break
                    except StaleWriteError:
                        continue
""")


@pytest.mark.slow
def test_two_processes_writing_at_once_lose_nothing(db_url, tmp_path):
    s = ExperienceStore(db_url)
    targets = [s.add_entry(f"human target {i}") for i in range(3)]
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(ROOT), url=db_url))
    procs = [
        subprocess.Popen([sys.executable, str(script), "trainer", "60"]),
        subprocess.Popen([sys.executable, str(script), "human", "15", ",".join(map(str, targets))]),
        subprocess.Popen([sys.executable, str(script), "trainer", "60"]),
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert s.list_entries(text="trainer entry").total == 120
    for t in targets:
        e = s.get(t)
        assert e.version == 16 and e.text.count("+edit") == 15
        assert len(s.history(t)) == 16
    # Every write bumped the version exactly once: 3 adds + 120 adds + 45 edits.
    assert s.library_version() == 3 + 120 + 45


def test_in_memory_store_is_one_database(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = ExperienceStore("sqlite://")
    a = s.add_entry("kept in memory")
    assert s.get(a).text == "kept in memory" and s.count() == 1
    assert list(tmp_path.iterdir()) == []  # nothing written to disk


# -- one validation layer: SQLite and Postgres accept exactly the same inputs --------------------------------

BAD_INPUTS = {
    # what a caller passes -> a word the StoreError must contain (the field, or the value, to fix)
    "NUL in an entry's text": (lambda s, r: s.add_entry("a\x00b"), "NUL"),
    "NUL in an edit": (lambda s, r: s.update_text(s.add_entry("ok"), "x\x00", expected_version=1), "NUL"),
    "NUL in a search": (lambda s, r: s.list_entries(text="a\x00"), "NUL"),
    "env name of 129 characters": (lambda s, r: s.add_entry("x", env="e" * 129), "entry env is 129 characters"),
    "run name of 257 characters": (lambda s, r: s.create_run("n" * 257), "run name is 257 characters"),
    "run env of 257 characters": (lambda s, r: s.update_run(r, env="e" * 257), "run env"),
    "metric key of 129 characters": (lambda s, r: s.log_metrics(r, 1, {"k" * 129: 1.0}), "metric key"),
    "created step 2**31": (lambda s, r: s.add_entry("x", created_step=2**31), "created step 2147483648"),
    "run step 2**40": (lambda s, r: s.update_run(r, step=2**40), "run step"),
    "metric step 2**31": (lambda s, r: s.log_metrics(r, 2**31, {"k": 1.0}), "metric step"),
    "episode seed 2**33": (lambda s, r: s.add_trajectories([{"run_id": r, "env": "e", "task": "t", "seed": 2**33}]), "seed"),
    "entry id 2**31 (a read)": (lambda s, r: s.get(2**31), "out of range"),
    "entry id 2**63 (a read)": (lambda s, r: s.get(2**63), "out of range"),
    "entry id 2**64 (an archive)": (lambda s, r: s.archive([2**64]), "out of range"),
    "expected version 2**63": (lambda s, r: s.update_text(s.add_entry("ok"), "y", expected_version=2**63), "out of range"),
    "run id -2**63": (lambda s, r: s.get_run(-(2**63)), "out of range"),
    "NaN reward": (lambda s, r: s.record_outcomes([(s.add_entry("ok"), True, float("nan"))]), "NaN"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_same_inputs_refused_on_every_backend_with_nothing_written(store, case):
    do, says = BAD_INPUTS[case]
    run = store.create_run("r", env="e")
    before = (store.library_version(), store.count(status=None), len(store.list_runs()),
              store.metric_keys(run), store.list_trajectories(run_id=run), store.get_run(run)["step"])
    with pytest.raises(StoreError) as err:
        do(store, run)
    assert says in str(err.value) and "\n" not in str(err.value)
    # Refused before anything was written: the transaction held nothing (an entry the case added as a
    # target of its edit is the only change allowed, and it bumped the version once).
    after = (store.library_version(), store.count(status=None), len(store.list_runs()),
             store.metric_keys(run), store.list_trajectories(run_id=run), store.get_run(run)["step"])
    extra = after[1] - before[1]
    assert extra in (0, 1) and after[0] == before[0] + extra and after[2:] == before[2:]


def test_values_at_the_limits_are_stored_on_every_backend(store):
    run = store.create_run("n" * 256, env="e" * 256)
    eid = store.add_entry("ünïcödé \u2028 \u0085 text", env="e" * 128, created_step=2**31 - 1)
    store.log_metrics(run, 2**31 - 1, {"k" * 128: -1.5})
    store.add_trajectories([{"run_id": run, "env": "e", "task": "t", "seed": 2**31 - 1}])
    assert store.get(eid).created_step == 2**31 - 1 and store.get(eid).text == "ünïcödé \u2028 \u0085 text"
    assert store.get_run(run)["name"] == "n" * 256 and store.latest_metrics(run) == {"k" * 128: -1.5}
    assert store.list_trajectories(run_id=run)[0]["seed"] == 2**31 - 1


# -- resume bookkeeping and dead runs ------------------------------------------------------------------------


def test_metrics_once_per_step_and_key_and_resume_drops_what_lies_past_the_checkpoint(store):
    run = store.create_run("r")
    for step in (1, 2, 3):
        store.log_metrics(run, step, {"a": step, "b": -step})
        store.add_trajectories([{"run_id": run, "step": step, "env": "e", "task": "t", "seed": i} for i in range(2)])
    store.log_metrics(run, 3, {"a": 30.0})  # the same step logged again (a re-evaluation): superseded, not added
    rows = store.metrics_since(run)
    assert sorted((k, s) for _, k, s, _, _ in rows) == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("b", 3)]
    assert store.latest_metrics(run)["a"] == 30.0
    other = store.create_run("another run, untouched")
    store.log_metrics(other, 5, {"a": 1.0})
    # entry outcomes credited at steps 1-3 by this run (and one by the other run): those past step 1 go with their
    # episodes, and so do the successes/failures they added to the entry's counters
    e = store.add_entry("an entry", env="e", task="t")
    for step, ok in ((1, True), (2, True), (2, False), (3, True)):
        store.record_outcomes([(e, ok, float(ok))], run_id=run, step=step)
    store.record_outcomes([(e, False, 0.0)], run_id=other, step=9)
    assert (store.get(e).successes, store.get(e).failures) == (3, 2)
    # a resume from the step-1 checkpoint
    assert store.drop_after_step(run, 1) == {"metrics": 4, "episodes": 4, "outcomes": 3, "retrievals": 0, "trainings": 0,
                                             "entries": 0}
    assert {s for _, _, s, _, _ in store.metrics_since(run)} == {1}
    assert {t["step"] for t in store.list_trajectories(run_id=run)} == {1}
    assert len(store.metrics_since(other)) == 1
    assert sorted((u["run_id"], u["step"]) for u in store.usage(e)) == [(run, 1), (other, 9)]
    assert (store.get(e).successes, store.get(e).failures) == (1, 1)
    assert not any(store.drop_after_step(run, 1).values())  # a second resume: nothing


def test_resume_takes_back_the_counters_and_library_writes_of_the_steps_it_redoes(store):
    """What Eq. 6 and Eq. 7 read (retrieval counts and last retrieval, training counts and last update) and the run's
    library writes past the checkpoint go back to the checkpoint's; another run's, a person's and an untagged write
    stay. The undoing is new versions (history keeps both), and the same steps redone give the same counters."""
    from core.types import Status

    run, other = store.create_run("r"), store.create_run("another run")
    a, b, c = (store.add_entry(t, env="e", task="t") for t in ("a", "b", "c"))

    def step_1_and_2() -> None:
        store.record_retrievals([a, a, b], at={a: 10.0, b: 11.0}, run_id=run, step=1)
        store.record_trained([a], 0, run_id=run, run_step=1)
        store.record_retrievals([a], at=20.0, run_id=run, step=2)

    step_1_and_2()
    store.record_retrievals([c], at=5.0)  # a person's search, untagged
    at_checkpoint = {i: (e.retrieved_count, e.last_retrieved_at, e.trained_count, e.last_trained_step)
                     for i, e in store.get_many([a, b, c]).items()}
    assert at_checkpoint[a] == (3, 20.0, 1, 0) and at_checkpoint[c] == (1, 5.0, 0, None)
    # steps 3 and 4 of the attempt that is killed: more counts, an entry written, one replaced, one discarded
    store.record_retrievals([a, b, c], at=30.0, run_id=run, step=3)
    store.record_trained([a, b], 1, run_id=run, run_step=3)
    store.record_retrievals([b], at=40.0, run_id=other, step=3)  # another run's: kept
    new = store.add_entries([NewEntry(text="written at step 3", env="e", task="t", run_id=run, created_step=3)])[0]
    replacing = store.replace_entries([a], NewEntry(text="a, rewritten", run_id=run, created_step=4), actor="extractor",
                                      action="op_update")
    store.archive([c], actor="extractor", run_id=run, step=4)
    person = store.add_entry("a person's entry, written meanwhile", env="e", actor="human")
    took = store.drop_after_step(run, 2)
    assert (took["retrievals"], took["trainings"], took["entries"]) == (3, 2, 4)
    e = store.get_many([a, b, c, new, replacing, person])
    assert {i: (x.retrieved_count, x.last_retrieved_at, x.trained_count, x.last_trained_step) for i, x in e.items()
            if i in (a, c)} == {a: at_checkpoint[a], c: at_checkpoint[c]}
    assert (e[b].retrieved_count, e[b].last_retrieved_at) == (2, 40.0)  # this run's step-3 one gone, the other run's kept
    assert [e[i].status for i in (a, b, c, new, replacing, person)] == [Status.ACTIVE] * 3 + [Status.ARCHIVED] * 2 + [Status.ACTIVE]
    assert store.history(new)[-1].action == "rollback" and len(store.history(a)) == 3  # create, replaced, rollback
    assert not any(store.drop_after_step(run, 2).values())  # a second resume from the same checkpoint: nothing more
    store.record_retrievals([a, b, c], at=30.0, run_id=run, step=3)  # the redone step counts once
    assert store.get(a).retrieved_count == 4


def test_dead_runs_are_reaped_with_the_end_of_their_log(store, tmp_path):
    import os
    import socket
    import time

    from core.store import HEARTBEAT_STALE_S

    log = tmp_path / "train.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)) + "Traceback: the last words\n")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that existed and is gone now
    killed = store.create_run("killed", status="running", log_path=str(log))
    store.update_run(killed, pid=gone.pid, host=socket.gethostname(), heartbeat_at=time.time())
    silent = store.create_run("silent on another machine", status="paused")
    store.update_run(silent, pid=12345, host="elsewhere", heartbeat_at=time.time() - HEARTBEAT_STALE_S - 5)
    alive = store.create_run("alive", status="running")
    store.update_run(alive, pid=os.getpid(), host=socket.gethostname(), heartbeat_at=time.time())
    launching = store.create_run("being launched", status="created")  # no pid yet: its launcher's business
    finished = store.create_run("done", status="finished")
    store.update_run(finished, pid=gone.pid, host=socket.gethostname())
    assert sorted(store.reap_dead_runs()) == [killed, silent]
    k = store.get_run(killed)
    assert k["status"] == "failed" and k["pid"] is None and k["ended_at"]
    assert k["error"].startswith(f"died: process {gone.pid}") and k["error"].endswith("Traceback: the last words")
    assert "line 99" in k["error"] and "line 10\n" not in k["error"]  # the end of the log, not all of it
    assert store.get_run(silent)["error"].startswith("died: no heartbeat from process 12345 on elsewhere")
    assert [store.get_run(i)["status"] for i in (alive, launching, finished)] == ["running", "created", "finished"]
    assert store.reap_dead_runs() == []


def test_columns_added_since_a_database_was_made_are_added_on_open(db_url):
    from sqlalchemy import create_engine, text

    s = ExperienceStore(db_url)
    s.create_run("old")
    s.close()
    eng = create_engine(db_url)
    with eng.begin() as c:  # the runs table as released before host/heartbeat_at existed
        c.execute(text("ALTER TABLE runs DROP COLUMN heartbeat_at"))
        c.execute(text("ALTER TABLE runs DROP COLUMN host"))
    eng.dispose()
    s = ExperienceStore(db_url)
    r = s.get_run(s.list_runs()[0]["id"])
    assert r["name"] == "old" and r["heartbeat_at"] is None and r["host"] == ""
    s.heartbeat(r["id"])
    assert s.get_run(r["id"])["heartbeat_at"] > 0
    s.close()


@pytest.mark.slow
def test_counter_writers_in_threads_never_deadlock(store):
    """The manager's retrieval recorder and the extractor's outcome and training writers run in threads of one run,
    over the same entries in any order: each takes its rows in id order, so Postgres never reports a deadlock (it
    did, and the run died), and every count arrives."""
    import threading

    ids = store.add_entries([NewEntry(text=f"entry {i}", env="e", task="t") for i in range(8)], actor="test")
    rounds, errors = 60, []

    def forwards():
        try:
            for _ in range(rounds):
                store.record_retrievals(ids)
                store.record_trained(ids, step=1)
        except Exception as e:  # noqa: BLE001 - reported below, with the other thread's
            errors.append(e)

    def backwards():
        try:
            for _ in range(rounds):
                store.record_outcomes([(i, n % 2 == 0, 1.0) for n, i in enumerate(reversed(ids))], step=1)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=forwards), threading.Thread(target=backwards)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    for e in store.get_many(ids).values():
        assert e.retrieved_count == rounds and e.successes + e.failures == rounds

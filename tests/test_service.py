"""app/service/: every callback of the workbench, without a browser, on a real store and embedder."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from app.main import ServeError, is_loopback, resolve_auth
from app.service import Workbench, parse_ids, parse_seeds, trainer_available
from core.config import LibraryConfig
from core.manager import ExperienceManager
from core.store import NewEntry
from core.types import Source, Status

TRAINER, TRAINER_WHY = trainer_available()
# Every test that takes a database runs on SQLite and on Postgres (tests/conftest.py).
pytestmark = pytest.mark.both_backends


@pytest.fixture()
def wb(tmp_path, embedder, db_url):
    w = Workbench(tmp_path / "data", db_url, embedder=embedder, upload_cap_mb=0.01)
    yield w
    for launched in w._launched:  # processes this test started (an A/B evaluation), by their own handle
        if launched.proc.poll() is None:
            launched.proc.kill()
            launched.proc.wait(timeout=30)
    w.close()


def add(wb, text, env="minihack/Room-5x5", task="reach the stairs", **kw):
    return wb.store.add_entries([NewEntry(text=text, env=env, task=task, **kw)], actor="extractor")[0]


# -- serving --------------------------------------------------------------------------------------------


def test_host_and_auth_rules():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    assert resolve_auth("127.0.0.1", None, {}) is None
    assert resolve_auth("0.0.0.0", "ann:pw", {}) == ("ann", "pw")
    assert resolve_auth("0.0.0.0", None, {"COMPRL_AUTH": "bo:secret"}) == ("bo", "secret")
    with pytest.raises(ServeError, match="without credentials"):
        resolve_auth("0.0.0.0", None, {})
    with pytest.raises(ServeError, match="user:password"):
        resolve_auth("127.0.0.1", "nopassword", {})


def test_parsers():
    assert parse_ids("3, 7 #12,3") == [3, 7, 12]
    assert parse_seeds("0-3, 7") == [0, 1, 2, 3, 7]
    with pytest.raises(ValueError, match="not an entry id"):
        parse_ids("3, x")
    with pytest.raises(ValueError, match="backwards"):
        parse_seeds("5-1")
    with pytest.raises(ValueError, match="at least one"):
        parse_seeds(" ")


# -- runs -----------------------------------------------------------------------------------------------


def test_runs_table_and_commands(wb):
    rid = wb.store.create_run("r1", variant="grpo", env="minihack/Room-5x5", status="running")
    wb.store.log_metrics(rid, 3, {"policy/success_with_exp": 0.5})
    df = wb.runs_table()
    assert df.iloc[0]["id"] == rid and df.iloc[0]["success with exp"] == "0.50"
    assert "sent 'pause'" in wb.run_command(rid, "pause")
    assert wb.store.take_commands(rid) == ["pause"]
    assert "no run with id 999" in wb.run_command(999, "stop")
    assert "choose a run" in wb.run_command(None, "stop")
    wb.store.update_run(rid, status="finished")
    assert "already finished" in wb.run_command(rid, "resume")
    assert wb.run_choices()[0][1] == rid


def test_log_tail(wb, tmp_path):
    log = tmp_path / "run.log"
    log.write_text("\n".join(f"line {i}" for i in range(500)))
    rid = wb.store.create_run("r", log_path=str(log))
    tail = wb.log_tail(rid, lines=3)
    assert tail.splitlines() == ["line 497", "line 498", "line 499"]
    assert "no run with id" in wb.log_tail(12345)
    rid2 = wb.store.create_run("r2")
    assert "not started from this workbench" in wb.log_tail(rid2)


def test_bad_yaml_is_refused_with_its_line(wb):
    msg = wb.validate_config("env:\n  name: [unclosed\nalgorithm: x\n")
    assert msg.startswith("**Error**") and "line" in msg and "YAML" in msg
    assert "mapping" in wb.validate_config("- just\n- a list\n")
    assert "empty" in wb.validate_config("   ")
    before = list((wb.data_dir / "configs").iterdir())
    assert wb.launch_run("env: [").startswith("**Error**")
    assert list((wb.data_dir / "configs").iterdir()) == before  # nothing launched, nothing written


@pytest.mark.skipif(TRAINER, reason="checks the message shown when the trainer is missing")
def test_config_check_says_when_trainer_missing(wb):
    msg = wb.validate_config("run:\n  variant: grpo\n")
    assert "trainer is not available" in msg
    assert "trainer is not available" in wb.launch_run("run:\n  variant: grpo\n")


@pytest.mark.skipif(not TRAINER, reason="trainer not available")
def test_config_fields_are_checked_by_the_trainers_config(wb):
    msg = wb.validate_config("run:\n  variant: grpo\n  no_such_field: 1\n")
    assert msg.startswith("**Error**") and "no_such_field" in msg
    assert wb.validate_config("run:\n  variant: grpo\n").startswith("**OK**")
    assert wb.store.list_runs() == []


def test_shipped_configs_are_listed_and_read(wb):
    names = wb.shipped_configs()
    for n in names:
        assert wb.config_text(n).strip()
    assert "no shipped config" in wb.config_text("../pyproject.toml")
    assert "no run with id" in wb.resume_run(424242)
    assert "no run with id" in wb.fork_run(424242)


@pytest.mark.skipif(not TRAINER, reason="trainer not available")
def test_fork_needs_a_checkpoint(wb):
    rid = wb.store.create_run("no checkpoint yet", status="running")
    assert "has no checkpoint yet" in wb.fork_run(rid)
    assert len(wb.store.list_runs()) == 1  # nothing launched, no row added


@pytest.mark.skipif(not TRAINER, reason="trainer not available")
def test_fork_at_the_step_cap_is_refused_and_a_fork_keeps_its_parent(wb, tmp_path):
    """The bug: a fork with max steps 0 (the config's) of a run that reached its cap finished at once."""
    cfg = "run:\n  name: parent\n  max_steps: 12\nenv:\n  names: {minihack/Room-5x5: 1.0}\n"
    rid = wb.store.create_run("parent", variant="complementary", env="minihack/Room-5x5", config=cfg, status="finished")
    ck = tmp_path / "ck"
    (ck / "step_000012").mkdir(parents=True)
    (ck / "latest").write_text("step_000012")
    wb.store.update_run(rid, step=12, checkpoint_dir=str(ck))
    msg = wb.fork_run(rid, 0)
    assert "at step 12" in msg and "max steps 12" in msg and "larger max steps" in msg
    assert "at step 12" in wb.resume_run(rid, 0)
    assert len(wb.store.list_runs()) == 1  # refused before any row
    msg = wb.fork_run(rid, 20)
    assert "forked run" in msg, msg
    child = wb.store.list_runs()[0]
    assert child["name"] == f"parent (fork of {rid})" and child["parent_run_id"] == rid and child["step"] == 12
    assert f"fork of run **#{rid}**" in wb.run_details(child["id"]) and f"#{child['id']}" in wb.run_details(rid)
    proc = wb._launched[-1].proc  # the fake checkpoint cannot train: end the process we started
    proc.kill()
    proc.wait(timeout=30)


def test_a_config_naming_a_missing_model_folder_makes_no_row(wb):
    text = "run:\n  name: x\nenv:\n  names: {minihack/Room-5x5: 1.0}\nactor:\n  path: /nonexistent/model\n"
    assert "does not exist" in wb.launch_run(text)
    text = "run:\n  name: x\nenv:\n  names: {minihack/Room-5x6: 1.0}\n"
    assert "unknown env 'minihack/Room-5x6'" in wb.launch_run(text)
    assert wb.store.list_runs() == []


def test_replay_listing_with_empty_filters_lists_every_episode(wb):
    wb.store.add_trajectories([{"run_id": None, "env": "minihack/Room-5x5", "task": "t", "seed": i, "success": True,
                                "reward": 1.0, "num_actions": 1, "with_experience": False, "steps": []} for i in range(3)])
    assert len(wb.episodes("", "")) == 3 and len(wb.episodes(None, None)) == 3


def test_curves_default_to_the_running_run_and_export_csv(wb):
    running = wb.store.create_run("running one", status="running")
    wb.store.create_run("newest, stopped", status="stopped")
    assert wb.default_curve_runs() == [running]
    for s in range(3):
        wb.store.log_metrics(running, s, {"eval/success_with_exp": 0.5, "eval/success_with_exp_ci_low": 0.2,
                                          "eval/success_with_exp_ci_high": 0.8})
    path, msg = wb.curves_csv([running], "heldout")
    text = Path(path).read_text().splitlines()
    assert text[0] == "run_id,run_name,key,step,time,value" and len(text) == 1 + 9 and "exported 9 points" in msg
    assert "choose one or more runs" in wb.curves_csv([], "heldout")[1]


def test_build_state_shows_a_build_in_flight_with_its_run(wb):
    import json as _json
    import os as _os

    rid = wb.store.create_run("first run", status="running")
    wb.store.update_run(rid, pid=_os.getpid())
    (wb.data_dir / ".models-build.json").write_text(_json.dumps(
        {"state": "building", "pid": _os.getpid(), "stage": "policy SFT", "done": 250, "total": 1000,
         "started_at": time.time() - 60, "updated_at": time.time(), "eta_s": 300.0}))
    h = wb.build_html()
    assert "model build 25% (policy SFT)" in h and "about 5 min 00 s left" in h and f"for run #{rid}" in h
    assert wb.runs_table().iloc[0]["status"] == "building models 25%"
    tok, html_, status = wb.demo_start(None, "policy", "minihack/Room-5x5", 0)
    assert "being built" in status


# -- live curves ----------------------------------------------------------------------------------------


def test_curves_fetch_only_new_rows(wb, monkeypatch):
    import app.service.curves as service  # the live-curve cache and its settings

    rid = wb.store.create_run("c", status="running")
    for s in range(100):
        wb.store.log_metrics(rid, s, {"policy/reward_with_exp": s / 100, "library/size": s, "other/key": 1.0})
    monkeypatch.setattr(service, "PULL_INTERVAL_S", 0.0)
    calls = []
    real = wb.store.metric_series_since

    def spy(run_id, key, after_id=0, limit=200_000):
        cols = real(run_id, key, after_id, limit)
        calls.append((key, after_id, len(cols["id"])))
        return cols

    monkeypatch.setattr(wb.store, "metric_series_since", spy)
    tok, figs, status = wb.refresh_curves(None, [rid], 0.6, "step")
    read = {k: n for k, _, n in calls}
    assert read["policy/reward_with_exp"] == 100 and read["library/size"] == 100 and "other/key" not in read
    assert all(f is not None for f in figs)
    reward = json.loads(figs[0])
    assert [len(t["x"]) for t in reward["data"]] == [100, 100]
    # Nothing new: only past the cursors is asked, nothing read, nothing redrawn.
    calls.clear()
    tok2, figs2, _ = wb.refresh_curves(tok, [rid], 0.6, "step")
    assert tok2 == tok and figs2 == [None] * len(figs)
    cursor = {k: a for k, a, _ in calls}
    assert cursor["policy/reward_with_exp"] > 0 and all(n == 0 for _, _, n in calls)
    calls.clear()
    wb.store.log_metrics(rid, 100, {"policy/reward_with_exp": 1.0})
    _, figs3, status = wb.refresh_curves(tok, [rid], 0.6, "step")
    assert ("policy/reward_with_exp", cursor["policy/reward_with_exp"], 1) in calls
    assert figs3[0] is not None and figs3[1] is None  # only the reward panel changed
    assert [len(t["x"]) for t in json.loads(figs3[0])["data"]] == [101, 101]
    assert "1 new points" in status
    # A second browser session shares what was read: its first refresh asks the store nothing new.
    calls.clear()
    _, figs4, status = wb.refresh_curves(None, [rid], 0.6, "step")
    assert all(n == 0 for _, _, n in calls) and [len(t["x"]) for t in json.loads(figs4[0])["data"]] == [101, 101]


def test_curves_view_changes_redraw_and_edits_are_marked(wb):
    rid = wb.store.create_run("c")
    t0 = time.time()
    for s in range(10):
        wb.store.log_metrics(rid, s, {"policy/reward_with_exp": float(s)}, at=t0 + s)
    tok, figs, _ = wb.refresh_curves(None, [rid], 0.0, "time")
    assert json.loads(figs[0])["layout"]["xaxis"]["type"] == "date"
    eid = add(wb, "## Title: a\n## Description: b\n## Content: c")
    wb.store.update_text(eid, "edited", expected_version=1, actor="human")
    _, figs, status = wb.refresh_curves(tok, [rid], 0.0, "time")
    assert all(f is not None for f in figs)
    assert len(json.loads(figs[0])["layout"]["shapes"]) == 1 and "1 human edits" in status
    _, figs, _ = wb.refresh_curves(tok, [rid], 0.3, "step")  # smoothing changed: redrawn
    assert figs[0] is not None
    _, figs, status = wb.refresh_curves(tok, [], 0.3, "step")
    assert "choose one or more runs" in status
    _, figs, _ = wb.refresh_curves(tok, ["999"], 0.3, "step")  # an unknown run is just empty
    assert json.loads(figs[0])["data"] == []


def test_long_history_loads_over_several_ticks(wb, monkeypatch):
    import app.service.curves as service  # the live-curve cache and its settings

    monkeypatch.setattr(service, "ROWS_PER_KEY_PER_PULL", 25)
    monkeypatch.setattr(service, "PULL_INTERVAL_S", 0.0)
    rid = wb.store.create_run("long")
    for s in range(60):
        wb.store.log_metrics(rid, s, {"policy/reward_with_exp": float(s), "policy/success_with_exp": 0.5})
    tok, figs, status = wb.refresh_curves(None, [rid])
    assert "loading history" in status and "50 new points" in status
    tok, figs, status = wb.refresh_curves(tok, [rid])
    assert "loading history" in status
    tok, figs, status = wb.refresh_curves(tok, [rid])
    assert "loading history" not in status and "120 points held" in status
    assert [len(t["x"]) for t in json.loads(figs[0])["data"]] == [60, 60]


def test_curve_sessions_are_independent_and_bounded(wb):
    rid = wb.store.create_run("c")
    wb.store.log_metrics(rid, 0, {"policy/reward_with_exp": 1.0})
    a, fa, _ = wb.refresh_curves(None, [rid])
    b, fb, _ = wb.refresh_curves(None, [rid])
    assert a != b and fa[0] is not None and fb[0] is not None
    for _ in range(wb._max_sessions + 5):
        wb.refresh_curves(None, [rid])
    assert len(wb._curves) == wb._max_sessions


# -- library --------------------------------------------------------------------------------------------


def test_library_page_filter_sort_and_bad_input(wb):
    for i in range(30):
        add(wb, f"## Title: entry {i}\n## Description: d\n## Content: c{i}", env="minihack/Room-5x5" if i % 2 else "webshop")
    df, info = wb.library_page(env="webshop", page=2, page_size=10)
    assert len(df) == 5 and "entries 11–15 of 15" in info
    df, _ = wb.library_page(sort="id", descending=True, page_size=5)
    assert list(df["id"]) == [30, 29, 28, 27, 26]
    df, info = wb.library_page(text="entry 7")
    assert list(df["id"]) == [8]
    df, info = wb.library_page(sort="not_a_column")
    assert info.startswith("**Error**") and "sortable" in info
    df, info = wb.library_page(page="x")
    assert info.startswith("**Error**")
    assert "webshop" in wb.library_facets()["env"]


def test_semantic_search_uses_the_retrieval_embedder(wb):
    add(wb, "## Title: Apples\n## Description: d\n## Content: apples are usually in the fridge", env="alfworld/pick_and_place",
        task="put an apple in the microwave")
    add(wb, "## Title: Stairs\n## Description: d\n## Content: walk diagonally to the staircase", task="reach the staircase down")
    df, msg = wb.semantic_search("where is the apple", k=2)
    assert df.iloc[0]["title"] == "Apples" and "score" in df.columns
    before = wb.store.get(1).retrieved_count
    assert before == 0  # a person's search is not counted as an actor's retrieval
    df, msg = wb.semantic_search("   ")
    assert len(df) == 0 and "type a query" in msg


def test_semantic_search_ranks_by_the_entrys_text_not_its_task_key(wb):
    """The bug: search scored the task key, so every entry of one task tied ("Monster" first for a question about the
    stairs). Three entries of the same task: the one whose text is about the stairs in the dark comes first."""
    task = "Dungeon 3: reach the staircase down"
    add(wb, "## Title: Monster\n## Description: a monster\n## Content: step around the monster diagonally", task=task)
    add(wb, "## Title: Trap\n## Description: a trap\n## Content: the trap is one square west of the door", task=task)
    stairs = add(wb, "## Title: Stairs in the dark\n## Description: the room is dark\n## Content: the stairs (>) are two "
                     "squares south and one east of where you start; walk there in the dark", task=task)
    df, msg = wb.semantic_search("how do I find the stairs in the dark", k=3)
    assert int(df.iloc[0]["id"]) == stairs, df
    assert len(set(df["task score"])) == 1  # the task key's score is shown beside, and ties, as it must
    assert df["score"].is_monotonic_decreasing and "text" in msg


def test_open_edit_stale_archive_restore_diff_revert(wb):
    eid = add(wb, "## Title: t\n## Description: d\n## Content: first")
    d = wb.open_entry(eid)
    assert d["version"] == 1 and d["text"].endswith("first") and d["error"] == ""
    msg, v = wb.save_entry(eid, "## Title: t\n## Description: d\n## Content: second", 1)
    assert msg.startswith("**OK**") and v == 2
    assert wb.store.get(eid).text.endswith("second")
    # Someone else edits; our edit based on version 2 is refused and nothing is lost.
    wb.store.update_text(eid, "## Title: t\n## Description: d\n## Content: theirs", expected_version=2, actor="cli")
    msg, v = wb.save_entry(eid, "## Title: t\n## Description: d\n## Content: mine", 2)
    assert msg.startswith("**Error**") and "changed by someone else" in msg and "Content: theirs" in msg and v == 2
    assert wb.store.get(eid).text.endswith("theirs")
    assert "open an entry" in wb.save_entry(None, "x", None)[0]
    assert "empty" in wb.save_entry(eid, "  ", 3)[0]
    msg, v = wb.set_entry_status(eid, 3, "archived")
    assert "archived" in msg and v == 4 and wb.store.get(eid).status is Status.ARCHIVED
    msg, v = wb.set_entry_status(eid, 2, "active")  # stale
    assert msg.startswith("**Error**")
    msg, v = wb.set_entry_status(eid, 4, "active")
    assert "restored" in msg and v == 5
    html = wb.diff_versions(eid, 1, 3)
    assert "d-del" in html and "first" in html and "theirs" in html
    assert "no entry" in wb.diff_versions(9999, 1, 2) or "no version" in wb.diff_versions(9999, 1, 2)
    msg, v = wb.revert_entry(eid, 1, 5)
    assert msg.startswith("**OK**") and wb.store.get(eid).text.endswith("first") and v == 6
    d = wb.open_entry(eid)
    assert d["versions"] == [1, 2, 3, 4, 5, 6] and len(d["history"]) == 6
    assert wb.open_entry("abc")["error"].startswith("**Error**")
    assert "no entry with id 4242" in wb.open_entry(4242)["error"]


def test_lineage_and_usage_in_the_panel(wb):
    a = add(wb, "## Title: a\n## Description: d\n## Content: x", source_episode_id=17)
    b = add(wb, "## Title: b\n## Description: d\n## Content: y")
    wb.store.record_outcomes([(a, True, 1.0), (a, False, -1.0)], run_id=3, episode_ids=[11, 12], step=5)
    d = wb.open_entry(a)
    assert "Source episode: #17" in d["lineage"]
    assert list(d["usage"]["episode"]) == [12, 11] and list(d["usage"]["outcome"]) == ["failure", "success"]
    msg, nid = wb.accept_merge(f"{a}, {b}", "## Title: ab\n## Description: d\n## Content: x and y")
    assert msg.startswith("**OK**") and nid
    d = wb.open_entry(nid)
    assert f"#{a}" in d["lineage"] and f"#{b}" in d["lineage"] and "Parents (2)" in d["lineage"]
    assert f"#{nid}" in wb.open_entry(a)["lineage"]  # the parent lists its child


def test_create_entry_and_running_trainer_sees_edits_within_2s(wb, embedder):
    msg, eid = wb.create_entry("Keys", "when a door is locked", "pick up the key first", "minihack/KeyRoom-S5",
                               "open the locked door")
    assert msg.startswith("**OK**") and wb.store.get(eid).source is Source.MANUAL
    assert wb.create_entry("", "", "", "", "")[0].startswith("**Error**")
    # A trainer in another "process" (its own manager on the same store) polls the change feed.
    cfg = LibraryConfig()
    cfg.manager.diversify = False
    trainer = ExperienceManager(wb.store, embedder, cfg.manager, cfg.index)
    try:
        hits = trainer.search_sync(["open the locked door"], k=1, task="minihack/KeyRoom-S5")[0]
        assert hits and "pick up the key first" in hits[0].text
        msg, _ = wb.save_entry(eid, "## Title: Keys\n## Description: d\n## Content: kick the door", 1)
        assert msg.startswith("**OK**")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:
            hits = trainer.search_sync(["open the locked door"], k=1, task="minihack/KeyRoom-S5")[0]
            if hits and "kick the door" in hits[0].text:
                break
            time.sleep(0.05)
        assert hits and "kick the door" in hits[0].text, "the trainer did not see the edit within 2 s"
    finally:
        trainer.close()


def test_merge_propose_preview_accept_undo(wb):
    a = add(wb, "## Title: a\n## Description: d\n## Content: go east")
    b = add(wb, "## Title: b\n## Description: d\n## Content: go east quickly")
    text, note = wb.propose_merge(f"{a},{b}")
    assert "go east" in text and "go east quickly" in text
    try:
        import trainers.extractor as ext  # noqa: F401

        has_proposer = hasattr(ext, "propose_merge")
    except Exception:
        has_proposer = False
    if not has_proposer:
        assert "joined" in note
    assert "at least two" in wb.propose_merge(str(a))[1]
    assert "no entry with id 77" in wb.propose_merge(f"{a}, 77")[1]
    html = wb.merge_preview(f"{a},{b}", "## Title: ab\n## Description: d\n## Content: go east")
    assert html.count("comprl-diff") == 2
    assert wb.accept_merge(f"{a},{b}", "  ")[0].startswith("**Error**")
    msg, nid = wb.accept_merge(f"{a},{b}", "## Title: ab\n## Description: d\n## Content: go east")
    assert msg.startswith("**OK**")
    merged = wb.store.get(nid)
    assert merged.parent_ids == [a, b] and merged.source is Source.MERGED
    assert wb.store.get(a).status is Status.ARCHIVED
    assert "archived" in wb.accept_merge(f"{a},{b}", "again")[0]
    msg = wb.undo_merge(nid)
    assert msg.startswith("**OK**") and wb.store.get(a).status is Status.ACTIVE and wb.store.get(nid).status is Status.ARCHIVED
    assert wb.undo_merge(a).startswith("**Error**")  # not a merge


def test_near_duplicate_queue(wb):
    a = add(wb, "## Title: stairs\n## Description: d\n## Content: walk diagonally to the staircase")
    b = add(wb, "## Title: stairs\n## Description: d\n## Content: walk diagonally to the staircase!")
    add(wb, "## Title: apples\n## Description: d\n## Content: apples are in the fridge")
    df, msg = wb.duplicate_clusters(0.95)
    assert "1 near-duplicate clusters" in msg and df.iloc[0]["ids"] == f"{a}, {b}"
    assert wb.cluster_ids(df, 0) == f"{a}, {b}"
    assert wb.cluster_ids(df, 7) == ""
    assert wb.duplicate_clusters("x")[1].startswith("**Error**")
    assert wb.duplicate_clusters(3)[1].startswith("**Error**")


def test_import_export_validation_and_cap(wb, tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": "## Title: a\n## Description: d\n## Content: c", "env": "webshop"}) + "\n")
    assert wb.import_file(str(good)).startswith("**OK** — imported 1 entries")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": ""}\nnot json\n')
    msg = wb.import_file(str(bad))
    assert msg.startswith("**Error**") and "line 2" in msg and "line 3" in msg and "nothing imported" in msg
    assert wb.store.count(status=None) == 1  # nothing of the bad file
    big = tmp_path / "big.jsonl"
    big.write_text((json.dumps({"text": "x" * 100}) + "\n") * 200)  # ~21 kB, cap is 10 kB here
    msg = wb.import_file(str(big))
    assert "over the upload cap" in msg and wb.store.count(status=None) == 1
    assert "choose a JSONL file" in wb.import_file(None)
    assert "gone" in wb.import_file(str(tmp_path / "missing.jsonl"))
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    assert "UTF-8" in wb.import_file(str(binary))
    path, msg = wb.export_library("all")
    assert "exported 1 entries" in msg and Path(path).read_text().count("\n") == 1


# -- A/B tests ------------------------------------------------------------------------------------------


def test_ab_create_validates_everything_first(wb, tmp_path):
    a = add(wb, "## Title: a\n## Description: d\n## Content: c")
    base = dict(name="t", env="minihack/Room-5x5", seeds="0-9", checkpoint="", max_turns=None,
                a_kind="current", a_arg="", a_file=None, b_kind="none", b_arg="", b_file=None)

    def create(**kw):
        return wb.create_ab_test(**{**base, **kw})

    assert "give the test a name" in create(name=" ")[0]
    assert "unknown env" in create(env="nope")[0]
    assert "not a seed" in create(seeds="a-b")[0]
    assert "not a model folder" in create(checkpoint=str(tmp_path / "nope"))[0]
    assert "max turns" in create(max_turns="x")[0]
    assert "does not exist" in create(a_kind="version", a_arg="99")[0]
    assert "as a number" in create(a_kind="version", a_arg="v1")[0]
    assert "name the entries" in create(a_kind="minus", a_arg="")[0]
    assert "no entry with id 55" in create(b_kind="plus", b_arg="55")[0]
    assert "upload an exported library" in create(a_kind="file")[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": ""}\n')
    assert "line 1" in create(a_kind="file", a_file=str(bad))[0]
    assert "same library" in create(b_kind="current")[0]
    assert "kind must be one of" in create(a_kind="weird")[0]
    assert "choose sampled decoding" in create(episodes_per_task=8)[0]  # greedy would play each task the same way 8 times
    assert "decoding must be one of" in create(decoding="beam")[0]
    assert "whole number from 1 to 64" in create(episodes_per_task=65, decoding="sampled")[0]
    assert "episodes per task must be a whole number" in create(episodes_per_task="many", decoding="sampled")[0]
    assert wb.store.list_ab_tests() == []  # nothing created by bad input
    msg, ab_id = create(a_kind="minus", a_arg=str(a))
    if TRAINER:
        assert msg.startswith("**OK**") and ab_id
        cfg = wb.store.get_ab_test(ab_id)["config"]
        assert cfg == {"env": "minihack/Room-5x5", "seeds": list(range(10)), "checkpoint": "", "max_turns": None,
                       "arms": {"A": {"kind": "minus", "ids": [a]}, "B": {"kind": "none"}}, "task_ids": False,
                       "episodes_per_task": 1, "decoding": "greedy", "actor": None, "constrain_actions": False}
        proc = next(launched.proc for launched in wb._launched if launched.ab_id == ab_id)
        if proc.poll() is None:  # still importing torch: an A/B test yields the CPU to training runs (nice 10)
            assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 10
    else:
        assert "trainer is not available" in msg and ab_id is None and wb.store.list_ab_tests() == []


def test_ab_details_show_the_evaluators_results(wb):
    config = {"env": "minihack/Room-5x5", "seeds": [0, 1], "checkpoint": "", "max_turns": None,
              "arms": {"A": {"kind": "current"}, "B": {"kind": "none"}}}
    ab = wb.store.create_ab_test("by hand", config)
    summary, bar, res, tasks, eps = wb.ab_details(ab)
    assert "created" in summary and len(res) == 0
    wb.store.update_ab_test(ab, status="done", progress=1.0, results={
        "arms": {"A": {"n": 2, "successes": 2, "rate": 1.0, "ci_low": 0.342, "ci_high": 1.0, "mean_actions": 4.0},
                 "B": {"n": 2, "successes": 0, "rate": 0.0, "ci_low": 0.0, "ci_high": 0.658, "mean_actions": 9.0}},
        "diff": 1.0, "p_value": 0.0455, "per_task": {"reach the stairs": {"A": 1.0, "B": 0.0}}})
    tid = wb.store.add_trajectories([{"ab_test_id": ab, "env": "minihack/Room-5x5", "task": "reach the stairs", "seed": 0,
                                      "success": True, "reward": 1.0, "num_actions": 4, "with_experience": True,
                                      "steps": [{"observation": "o", "action": "east", "reward": 1.0, "kind": "action",
                                                 "tool_query": "", "tool_answer": ""}]}])[0]
    summary, bar, res, tasks, eps = wb.ab_details(ab)
    assert "unpaired two-proportion p-value 0.0455" in summary and "100%" in bar  # one of four episodes stored: no pairs
    assert res.iloc[0]["Wilson 95% CI"] == "[0.34, 1.00]" and len(tasks) == 1
    assert list(eps["episode"]) == [tid] and list(eps["arm"]) == ["A"]
    assert "east" in wb.replay(tid)
    assert "no A/B test" in wb.ab_details(999)[0]
    assert "choose" in wb.ab_details(None)[0]
    assert wb.ab_tests_table().iloc[0]["rate A"] == "1.00"


def test_ab_details_pair_the_arms_by_seed_with_mcnemars_test(wb):
    """Both arms play the same seeds: the test is paired (McNemar's, exact for few discordant pairs), and the
    discordant pairs are shown; the evaluator stores arm A's episodes, then arm B's."""
    seeds = list(range(12))
    config = {"env": "minihack/Room-Ultimate-5x5", "seeds": seeds, "checkpoint": "", "max_turns": None,
              "arms": {"A": {"kind": "current"}, "B": {"kind": "none"}}}
    ab = wb.store.create_ab_test("paired", config)
    a_wins = {0, 1, 2, 3, 4, 5, 6, 7}  # A solves 8, B solves 2 of them and seed 11: 6 pairs A only, 1 B only
    b_wins = {0, 1, 11}

    def ep(seed: int, ok: bool, exp: bool) -> dict:
        return {"ab_test_id": ab, "env": "minihack/Room-Ultimate-5x5", "task": f"Dungeon {seed}", "seed": seed, "success": ok,
                "reward": float(ok), "num_actions": 3, "with_experience": exp, "steps": []}

    wb.store.add_trajectories([ep(s, s in a_wins, True) for s in seeds])
    wb.store.add_trajectories([ep(s, s in b_wins, False) for s in seeds])
    wb.store.update_ab_test(ab, status="done", progress=1.0, results={"diff": 0.4167, "p_value": 0.03, "arms": {}})
    summary, _, _, _, eps = wb.ab_details(ab)
    assert "McNemar's, exact, p-value **0.125**" in summary  # 2 * P[Bin(7, 1/2) <= 1] = 2 * 8/128
    assert "**6** solved by A only, **1** by B only" in summary and "both solved 2, neither 3" in summary
    assert list(eps["arm"]) == ["A"] * 12 + ["B"] * 12
    assert wb.ab_tests_table().iloc[0]["p-value"] == "0.125"  # the list shows the paired test's p-value too


def test_ab_details_pair_each_tasks_kth_sampled_episode(wb):
    """Several sampled episodes per task: the k-th episode of a task in A pairs with the k-th in B (the same
    sampling stream), so 3 tasks x 4 episodes are 12 pairs, not 3."""
    config = {"env": "minihack/Room-Ultimate-5x5", "seeds": [0, 1, 2], "checkpoint": "", "max_turns": 8, "task_ids": True,
              "episodes_per_task": 4, "decoding": "sampled", "arms": {"A": {"kind": "current"}, "B": {"kind": "none"}}}
    ab = wb.store.create_ab_test("repeats", config)
    order = [(r, s) for r in range(4) for s in range(3)]  # the evaluator's order: every task once, then again
    a_ok = {(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (0, 2)}  # 7 of 12
    b_ok = {(0, 0), (1, 2)}  # 2 of 12: A only 6, B only 1, both 1, neither 4

    def ep(r: int, s: int, ok: bool, exp: bool) -> dict:
        return {"ab_test_id": ab, "env": "minihack/Room-Ultimate-5x5", "task": f"Dungeon {s}", "seed": 1000 + s, "success": ok,
                "reward": float(ok), "num_actions": 3, "with_experience": exp, "steps": []}

    wb.store.add_trajectories([ep(r, s, (r, s) in a_ok, True) for r, s in order])
    wb.store.add_trajectories([ep(r, s, (r, s) in b_ok, False) for r, s in order])
    wb.store.update_ab_test(ab, status="done", progress=1.0, results={"diff": 5 / 12, "p_value": 0.03, "arms": {}})
    summary, _, _, _, eps = wb.ab_details(ab)
    assert "3 task ids × 4 sampled episodes = 12 per arm" in summary
    assert "12 pairs: each task's k-th sampled episode in A and in B" in summary and "**6** solved by A only, **1** by B only" in summary
    assert "both solved 1, neither 4" in summary and list(eps["arm"]) == ["A"] * 12 + ["B"] * 12


# -- agent demo -----------------------------------------------------------------------------------------


def test_expert_plays_an_episode_with_retrieved_experience(wb):
    add(wb, "## Title: Stairs\n## Description: d\n## Content: the stairs are usually in a corner", env="minihack/Room-5x5")
    tok, html, status = wb.demo_start(None, "expert", "minihack/Room-5x5", 0, "", "current")
    assert "ready" in status and "turn 0" in html and "stairs are usually in a corner" in html
    done = False
    for _ in range(60):
        html, status, done = wb.demo_step(tok)
        if done:
            break
    assert done and "episode over" in status and "success" in status
    assert "turn 1" in html
    html, status, done = wb.demo_step(tok)  # stepping a finished episode changes nothing
    assert done
    tok2, html, status = wb.demo_start(tok, "expert", "minihack/Room-5x5", 1, "", "none")
    assert "no experience shown" in html and tok2 != tok
    assert "start an episode first" in wb.demo_step("unknown")[1]


def test_demo_bad_input(wb):
    assert "whole number" in wb.demo_start(None, "expert", "minihack/Room-5x5", "x")[2]
    assert "unknown env" in wb.demo_start(None, "expert", "nope/env", 0)[2]
    if not TRAINER:
        msg = wb.demo_start(None, "policy", "minihack/Room-5x5", 0)[2]
        assert "trainers.models" in msg


def test_replay_and_episode_lists(wb):
    rid = wb.store.create_run("r")
    tid = wb.store.add_trajectories([{"run_id": rid, "env": "minihack/Room-5x5", "task": "reach", "seed": 3, "success": False,
                                      "reward": -1.0, "num_actions": 1,
                                      "steps": [{"observation": "a wall", "action": "north", "reward": 0.0}]}])[0]
    assert list(wb.episodes(run_id=rid)["episode"]) == [tid]
    assert len(wb.episodes(run_id=rid + 1)) == 0
    assert "a wall" in wb.replay(tid) and "failure" in wb.replay(tid)
    assert "no stored episode" in wb.replay(9999)
    assert "give an episode id" in wb.replay("x")


def test_overview(wb):
    wb.store.create_run("r", status="running")
    md = wb.overview_md()
    assert "1 runs (1 running)" in md and str(wb.data_dir) in md


@pytest.mark.slow
def test_comprl_app_refuses_a_public_address_without_credentials(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COMPRL_AUTH"}
    r = subprocess.run([sys.executable, "-m", "app.cli", "app", "--host", "0.0.0.0", "--data-dir", str(tmp_path)],
                       cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "refusing to serve on 0.0.0.0 without credentials" in r.stderr and "Traceback" not in r.stderr


def test_demo_run_is_not_started_twice_and_names_a_missing_config(wb):
    assert "does not exist" in wb.start_demo_run("no_such_config.yaml")
    assert wb.store.list_runs() == []
    wb.store.create_run("already", status="running")
    assert "already running" in wb.start_demo_run()
    assert len(wb.store.list_runs()) == 1


# -- input edges: every id, version, seed and count from the page --------------------------------------------

HUGE = [2**63, 2**64, -(2**63), "9" * 30, 2**31, -1, float("nan"), float("inf"), "1e400", "#" + str(2**63), 3.5, "  ", "x"]
HINTS = ("out of range", "whole number", "needs at least", "no entry", "no run", "choose", "give", "open an entry", "no A/B", "no stored")


def _texts(out) -> list[str]:
    items = out if isinstance(out, tuple) else (out,)
    return [x for x in items if isinstance(x, str)] + [x["error"] for x in items if isinstance(x, dict) and "error" in x]


def test_malformed_ids_versions_and_counts_are_messages_and_change_nothing(wb):
    eid = add(wb, "an entry")
    rid = wb.store.create_run("r", status="finished")
    calls = {  # each callback of the page that takes a number, with the mutated value in that place
        "open_entry": lambda v: wb.open_entry(v),
        "save_entry id": lambda v: wb.save_entry(v, "t", 1),
        "save_entry version": lambda v: wb.save_entry(eid, "t", v),
        "set_entry_status id": lambda v: wb.set_entry_status(v, 1, "archived"),
        "set_entry_status version": lambda v: wb.set_entry_status(eid, v, "archived"),
        "diff_versions": lambda v: wb.diff_versions(eid, v, 1),
        "revert_entry to": lambda v: wb.revert_entry(eid, v, 1),
        "revert_entry loaded": lambda v: wb.revert_entry(eid, 1, v),
        "accept_merge": lambda v: wb.accept_merge(f"{eid}, {v}", "merged"),
        "merge_preview": lambda v: wb.merge_preview(f"{eid}, {v}", "merged"),
        "propose_merge": lambda v: wb.propose_merge(f"{eid}, {v}"),
        "undo_merge": lambda v: wb.undo_merge(v),
        "replay": lambda v: wb.replay(v),
        "run_command": lambda v: wb.run_command(v, "stop"),
        "resume_run id": lambda v: wb.resume_run(v),
        "resume_run steps": lambda v: wb.resume_run(rid, v),
        "fork_run": lambda v: wb.fork_run(v),
        "launch_run steps": lambda v: wb.launch_run("run: {max_steps: 2}\n", v),
        "ab_details": lambda v: wb.ab_details(v),
        "semantic_search k": lambda v: wb.semantic_search("stairs", None, v),
        "demo_start seed": lambda v: wb.demo_start(None, "expert", "minihack/Room-5x5", v),
    }
    quiet = {  # these show nothing for an id nothing can have (a log, a table, a curve): no message, no error
        "ab_log_tail": lambda v: wb.ab_log_tail(v),
        "episodes run": lambda v: wb.episodes(run_id=v),
        "episodes ab": lambda v: wb.episodes(ab_id=v),
        "refresh_curves": lambda v: wb.refresh_curves("tok", [v]),
        "log_tail": lambda v: wb.log_tail(v),
    }
    before = (wb.store.library_version(), wb.store.get(eid).version, len(wb.store.list_runs()), wb.store.get_run(rid)["status"])
    tried = handled = 0
    for name, call in {**calls, **quiet}.items():
        for v in HUGE:
            if v == -1 and name == "semantic_search k":
                continue  # a count below 1 is clamped to 1, as a slider would
            tried += 1
            out = call(v)  # an exception here is what the page showed as "the app raised an exception"
            texts = _texts(out)
            if name in quiet or any(h in t for t in texts for h in HINTS):
                handled += 1
            else:
                print("no message:", name, repr(v)[:24], [t[:80] for t in texts])
    print(f"\nworkbench ({wb.store.url.split(':')[0].split('+')[0]}): malformed numbers handled {handled}/{tried}")
    assert handled == tried
    after = (wb.store.library_version(), wb.store.get(eid).version, len(wb.store.list_runs()), wb.store.get_run(rid)["status"])
    assert after == before


def test_edit_size_cap_matches_import_and_negative_max_steps_are_refused(wb):
    from core.library_io import MAX_ENTRY_CHARS

    eid = add(wb, "short")
    v = wb.store.library_version()
    msg, version = wb.save_entry(eid, "x" * (5 * 1024 * 1024), 1)
    assert f"at most {MAX_ENTRY_CHARS:,}" in msg and "Not saved" in msg and version == 1
    msg, new = wb.create_entry("title", "", "y" * MAX_ENTRY_CHARS)
    assert "at most" in msg and new is None
    msg, new = wb.create_entry("title", "", "ok", env="e" * 129)  # the store's own refusal is a message too
    assert "128" in msg and new is None
    assert wb.store.library_version() == v and wb.store.get(eid).text == "short"
    ok, version = wb.save_entry(eid, "z" * MAX_ENTRY_CHARS, 1)
    assert version == 2  # exactly the cap is fine: it exports and imports again
    runs = len(wb.store.list_runs())
    for steps in (-5, 0.5, "many"):
        assert "max steps" in wb.launch_run("run: {max_steps: 2}\n", steps)
    assert len(wb.store.list_runs()) == runs and not wb._launched


def test_curves_follow_a_resume_that_dropped_and_redid_steps(wb, monkeypatch):
    """A resume deletes the steps it redoes (and SQLite may give the new rows the old ids): an open page must
    show the redone values, once each, not the dead attempt's nor both."""
    import app.service.curves as service  # the live-curve cache and its settings

    monkeypatch.setattr(service, "PULL_INTERVAL_S", 0.0)
    rid = wb.store.create_run("c", status="running")
    for s in range(1, 11):
        wb.store.log_metrics(rid, s, {"policy/reward_with_exp": 0.0})
    tok, figs, _ = wb.refresh_curves(None, [rid], 0.0, "step")
    assert [len(t["x"]) for t in json.loads(figs[0])["data"]] == [10]  # smoothing 0: the raw series only
    wb.store.drop_after_step(rid, 6)  # the resume from the step-6 checkpoint
    for s in range(7, 10):
        wb.store.log_metrics(rid, s, {"policy/reward_with_exp": 1.0})
    _, figs, _ = wb.refresh_curves(tok, [rid], 0.0, "step")
    raw = json.loads(figs[0])["data"][0]
    assert raw["x"] == list(range(1, 10)) and raw["y"] == [0.0] * 6 + [1.0] * 3
    wb.store.log_metrics(rid, 9, {"policy/reward_with_exp": 2.0})  # a value logged again supersedes
    _, figs, _ = wb.refresh_curves(tok, [rid], 0.0, "step")
    raw = json.loads(figs[0])["data"][0]
    assert raw["x"] == list(range(1, 10)) and raw["y"][-1] == 2.0


def _recurring_run(wb, **kw):
    cfg = "run:\n  name: dark\nenv:\n  names: {minihack/Room-Ultimate-5x5: 1.0}\n  max_turns: 8\n  task_set: 16\n"
    return wb.store.create_run("dark", variant="complementary", env="minihack/Room-Ultimate-5x5", config=cfg, **kw)


def test_demo_defaults_open_on_the_newest_runs_recurring_task_with_an_entry(wb):
    """Issue 39: the demo opens on the newest run's env and a recurring task its library holds an entry for."""
    d = wb.demo_defaults()  # no run yet: the default config's env, recurring, with a line saying why
    assert d["env"] == "minihack/Room-Ultimate-5x5" and d["task_ids"] and d["max_turns"] == 8
    assert "no run yet" in d["note"] and "minihack_room_cpu.yaml" in d["note"]
    if d["mode"] == "expert":  # no embedded policy built in a test's data dir
        assert d["checkpoint"] == "" and "not built yet" in d["note"]
    rid = _recurring_run(wb, status="stopped")
    task = "Dungeon 7: Reach the staircase down (>)."
    wb.store.add_entries([NewEntry(text="## Title: Where the staircase is\n## Description: d\n## Content: 2 south",
                                   env="minihack/Room-Ultimate-5x5", task=task, run_id=rid),
                          NewEntry(text="## Title: Elsewhere\n## Description: d\n## Content: 1 north",
                                   env="minihack/Room-Ultimate-5x5", task="Dungeon 40: unseen", run_id=rid)],
                         actor="extractor")
    d = wb.demo_defaults()
    assert (d["env"], d["seed"], d["task_ids"], d["max_turns"], d["library"]) == ("minihack/Room-Ultimate-5x5", 7, True, 8,
                                                                                     "current")
    assert f"#{rid} dark" in d["note"] and "task 7" in d["note"]


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory) -> Path:
    """An untrained tiny Qwen2 model folder (seconds to build): a policy the demo and an A/B test can load."""
    if not TRAINER:
        pytest.skip(TRAINER_WHY)
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder

    tok = build_tokenizer(["go to take from move open close drawer desk shelf garbagecan pen 1 2 3 north south east west "
                           "the stairs > @ ."] * 40, vocab_size=400)
    return Path(save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, max_pos=2048), tok,
                                  tmp_path_factory.mktemp("tiny") / "policy"))


def _checkpoint(root: Path, step: int, policy: Path) -> Path:
    """A checkpoint as trainers/engine.py RunContext.save_checkpoint writes one: step_<N>/ with the policy's model
    folder and state.pt (step, RNG states, library version), and `latest` naming it."""
    import shutil

    import torch

    from trainers.engine import rng_state

    final = root / f"step_{step:06d}"
    shutil.copytree(policy, final / "policy")
    torch.save({"step": step, "rng": rng_state(), "library_version": 0, "saved_at": time.time()}, final / "state.pt")
    (root / "latest").write_text(final.name)
    return final


def test_demo_defaults_take_the_runs_latest_checkpoint_as_the_policy(wb, tmp_path, tiny_policy):
    from trainers.engine import latest_checkpoint

    ck = tmp_path / "ck"
    _checkpoint(ck, 2, tiny_policy)
    step = _checkpoint(ck, 4, tiny_policy)
    (ck / "step_000006" / "policy").mkdir(parents=True)  # a save killed before its state.pt: not a checkpoint
    assert latest_checkpoint(ck) == step
    rid = _recurring_run(wb, status="finished", checkpoint_dir=str(ck))
    d = wb.demo_defaults()
    assert d["mode"] == "policy" and d["checkpoint"] == str(step)
    assert f"run #{rid}'s policy at its latest checkpoint (step_000004)" in d["note"]
    (ck / "latest").write_text("step_000006")  # the marker names the half-written one: the newest complete is taken
    assert wb.demo_defaults()["checkpoint"] == str(step)


def test_demo_plays_a_recurring_task_with_its_entry(wb):
    """The expert on task 3 of the recurring dark rooms: the task text names Dungeon 3, the run's turn limit holds,
    and the library's entry for that dungeon is shown."""
    from envs.base import instance_task, task_seed
    from trainers.player import EpisodePlayer

    probe = EpisodePlayer("minihack/Room-Ultimate-5x5", task_seed("minihack/Room-Ultimate-5x5", 3), expert=True,
                          use_library=False)
    probe.reset()
    task = probe.batch.lives[0].ep.traj.task
    probe.close()
    wb.store.add_entries([NewEntry(text="## Title: Where the staircase is\n## Description: d\n## Content: go 2 south",
                                   env="minihack/Room-Ultimate-5x5", task=instance_task("minihack/Room-Ultimate-5x5", 3, task))],
                         actor="extractor")
    tok, html_, status = wb.demo_start(None, "expert", "minihack/Room-Ultimate-5x5", 3, "", "current", True, 2)
    assert "task 3 (recurring): ready" in status and "entry for it is shown" in status, status
    assert "go 2 south" in html_
    done = False
    for _ in range(5):
        html_, status, done = wb.demo_step(tok)
        if done:
            break
    assert done and int(status.split("after ")[1].split(" turns")[0]) <= 2, status  # the turn limit held


# -- ALFWorld's recurring households (issue 38 item 6): the demo and the A/B test as on MiniHack's dungeons ------------

ALF = "alfworld/pick_and_place"
ALF_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "alfworld_recurring_cpu.yaml"


def _household(task_id: int) -> str:
    """Household `task_id`'s task text, as a run with env.task_set gives it ("Household 3: put some pen on ...")."""
    from app.service.demo import TaskPlayer

    probe = TaskPlayer(ALF, task_id, expert=True, use_library=False)
    try:
        probe.reset()
        return probe.task
    finally:
        probe.close()


def test_demo_and_ab_tab_open_on_an_alfworld_recurring_run_and_the_demo_plays_its_household(wb):
    """A run of configs/alfworld_recurring_cpu.yaml: the demo opens on its env, a household its library holds an entry
    for and its turn limit, and the expert plays that household with the entry shown; the A/B tab opens on its
    households; the labels say "Household N", not "Dungeon N"."""
    pytest.importorskip("alfworld")
    from app.service.common import task_id_label, task_noun

    assert (task_noun(ALF), task_noun("minihack/Room-Ultimate-5x5")) == ("Household", "Dungeon")
    assert "Household N" in task_id_label(ALF) and "Dungeon N" in task_id_label("minihack/Room-5x5", plural=True)
    task = _household(3)
    assert task.startswith("Household 3: ")
    import yaml

    cfg = yaml.safe_load(ALF_CONFIG.read_text())
    cfg["rollout"]["constrain_actions"] = True  # the policy decoded within the admissible commands
    rid = wb.store.create_run("households", variant="complementary", env=ALF, config=yaml.safe_dump(cfg), status="stopped")
    claim = "In household 3 the pen is on desk 1: go to desk 1 and take it."
    wb.store.add_entries([NewEntry(text=f"## Title: Where the pen is\n## Description: d\n## Content: {claim}", env=ALF,
                                   task=task, run_id=rid)], actor="extractor")
    d = wb.demo_defaults()
    assert (d["env"], d["seed"], d["task_ids"], d["max_turns"], d["library"]) == (ALF, 3, True, 20, "current")
    assert d["constrain_actions"] is True  # the demo's policy plays as the run's did
    assert f"#{rid} households" in d["note"] and "task 3 (Household 3)" in d["note"] and "at most 20 turns" in d["note"]
    a = wb.ab_defaults()
    assert (a["env"], a["seeds"], a["task_ids"], a["max_turns"], a["constrain_actions"]) == (ALF, "0-15", True, 20, True)
    assert "admissible actions" in a["note"]
    assert f"#{rid} households" in a["note"] and "Households 0–15" in a["note"]
    tok, html_, status = wb.demo_start(None, "expert", ALF, 3, "", "current", True, 20)
    assert "task 3 (recurring): ready" in status and "entry for it is shown" in status, status
    assert f"task text “{task}”" in status and claim in html_
    done = False
    for _ in range(20):
        html_, status, done = wb.demo_step(tok)
        if done:
            break
    assert done and "success" in status, status  # the scripted expert solves its household
    tok, _, status = wb.demo_start(tok, "expert", ALF, 4, "", "none", True, 20)  # another household, no library
    assert "task 4 (recurring): ready" in status and "task text “Household 4: " in status


@pytest.mark.slow
def test_policy_demo_and_an_ab_test_on_alfworld_recurring_households(tmp_path, embedder, tiny_policy):
    """A tiny policy plays household 0 in the demo (its entry retrieved, its replies within the admissible commands:
    none refused), and an A/B test of the library against none
    on households 0-1 (task ids, 2 turns) runs to the end in its own process, paired household by household, each
    episode's task text "Household N: ...". SQLite only: the A/B evaluation is a process of its own, tens of seconds."""
    pytest.importorskip("alfworld")
    w = Workbench(tmp_path / "data", f"sqlite:///{tmp_path / 'wb.db'}", embedder=embedder)
    try:
        tasks = [_household(i) for i in (0, 1)]
        w.store.add_entries([NewEntry(text=f"## Title: Household {i}\n## Description: d\n## Content: look on desk 1 first",
                                      env=ALF, task=t) for i, t in enumerate(tasks)], actor="extractor")
        tok, html_, status = w.demo_start(None, "policy", ALF, 0, str(tiny_policy), "current", True, 3, True)
        assert "the policy on alfworld/pick_and_place, task 0 (recurring): ready" in status, status
        assert "entry for it is shown" in status and "look on desk 1 first" in html_
        assert "its replies within the env's admissible actions" in status
        done = False
        for _ in range(5):
            html_, status, done = w.demo_step(tok)
            if done:
                break
        assert done and int(status.split("after ")[1].split(" turns")[0]) <= 3, status
        assert w._plays[tok].player.batch.lives[0].ep.invalid_actions == 0  # an untrained policy, every action admissible
        msg, ab = w.create_ab_test("households", ALF, "0-1", str(tiny_policy), 2, "current", "", None, "none", "", None,
                                   task_ids=True, constrain_actions=True)
        assert msg.startswith("**OK**") and "2 episodes per arm" in msg, msg
        deadline = time.time() + 600
        while w.store.get_ab_test(ab)["status"] not in ("done", "failed") and time.time() < deadline:
            time.sleep(1)
        t = w.store.get_ab_test(ab)
        assert t["status"] == "done", (t["status"], t["error"], w.ab_log_tail(ab))
        assert t["config"]["task_ids"] and t["config"]["constrain_actions"]
        assert t["results"]["arms"]["A"]["invalid_share"] == t["results"]["arms"]["B"]["invalid_share"] == 0.0
        assert t["results"]["arms"]["A"]["n"] == t["results"]["arms"]["B"]["n"] == 2
        summary, bar, res, per_task, eps = w.ab_details(ab)
        assert f"env `{ALF}`" in summary and "2 task ids per arm, greedy" in summary and "McNemar" in summary, summary
        assert [row.split(":")[1] for row in per_task["task"]] == [" Household 0", " Household 1"], per_task
        assert list(eps["arm"]) == ["A", "A", "B", "B"]
        assert sorted(e["task"] for e in w.store.list_trajectories(ab_test_id=ab)) == sorted(tasks * 2)
        assert all(e["with_experience"] == (e["id"] in set(eps["episode"][:2])) for e in w.store.list_trajectories(ab_test_id=ab))
    finally:
        for launched in w._launched:
            if launched.proc.poll() is None:
                launched.proc.kill()
                launched.proc.wait(timeout=30)
        w.close()

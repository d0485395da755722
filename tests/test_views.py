"""app/views/ without a browser: smoothing, downsampling, figures, tables, HTML."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from app import views
from core.types import Experience, Source, Status

PANEL = {p.id: p for p in views.PANELS}


def slow_ema(xs, w):
    out, b = [], 0.0
    for t, x in enumerate(xs, start=1):
        b = w * b + (1 - w) * x
        out.append(b / (1 - w ** t))
    return np.array(out)


def test_ema_hand_computed_and_debiased():
    # w = .5: b = .5, 1.25, 2.125 -> debiased .5/.5 = 1, 1.25/.75 = 1.6667, 2.125/.875 = 2.42857
    s, state = views.ema(np.array([1.0, 2.0, 3.0]), 0.5)
    assert s == pytest.approx([1.0, 5 / 3, 2.125 / 0.875])
    assert state == (pytest.approx(2.125), 3)


def test_ema_resumes_where_it_stopped():
    rng = np.random.default_rng(0)
    xs = rng.normal(size=1000)
    whole, _ = views.ema(xs, 0.9)
    a, st = views.ema(xs[:600], 0.9)
    b, _ = views.ema(xs[600:], 0.9, st)
    assert np.concatenate([a, b]) == pytest.approx(whole)
    assert whole == pytest.approx(slow_ema(xs, 0.9))
    same, _ = views.ema(xs, 0.0)
    assert same == pytest.approx(xs)


def test_minmax_keeps_extremes_ends_and_bounds_size():
    n = 100_000
    y = np.sin(np.arange(n) / 500.0)
    y[43_210] = 50.0  # a spike must survive
    y[77_777] = -50.0
    idx = views.minmax_indices(n, y, 1200)
    assert len(idx) <= 1206
    assert idx[0] == 0 and idx[-1] == n - 1
    assert 43_210 in idx and 77_777 in idx
    assert np.all(np.diff(idx) > 0)
    assert list(views.minmax_indices(10, np.arange(10.0), 1200)) == list(range(10))


def test_minmax_is_fast_at_100k():
    y = np.random.default_rng(1).normal(size=100_000)
    t0 = time.perf_counter()
    for _ in range(10):
        views.minmax_indices(len(y), y, 1200)
    assert (time.perf_counter() - t0) / 10 < 0.05


def _series(run_id, key, n, start=0):
    x = np.arange(start, start + n, dtype=float)
    y = np.linspace(0, 1, n)
    return views.SeriesView(run_id, key, x, y, views.ema(y, 0.6)[0])


def test_curve_figure_overlays_runs_with_faint_raw_and_keeps_uirevision():
    panel = PANEL['reward']
    series = [_series(1, "policy/reward_with_exp", 50), _series(1, "policy/reward_without_exp", 50),
              _series(2, "policy/reward_with_exp", 30)]
    fig = views.curve_figure(panel, series, run_names={1: "#1 a", 2: "#2 b"}, smoothing=0.6, edit_marks=[10.0, 20.0])
    assert len(fig["data"]) == 6  # raw + smoothed for each of 3 series
    raw = [t for t in fig["data"] if t["name"].endswith("(raw)")]
    assert len(raw) == 3 and all("0.22" in t["line"]["color"] for t in raw)
    assert fig["layout"]["uirevision"] == "curves-reward"
    assert [s["x0"] for s in fig["layout"]["shapes"]] == [10.0, 20.0]
    colors = {t["line"]["color"] for t in fig["data"] if not t["name"].endswith("(raw)")}
    assert len(colors) == 2  # one colour per run
    json.loads(views.figure_json(fig))


def test_curve_figure_downsamples_100k_and_time_axis():
    s = _series(1, "policy/reward_with_exp", 100_000)
    s.x = 1.7e9 + np.arange(100_000, dtype=float)
    fig = views.curve_figure(PANEL['reward'], [s], run_names={}, x_axis="time", smoothing=0.6)
    assert all(len(t["x"]) <= views.MAX_RAW_POINTS + 6 for t in fig["data"])
    assert fig["layout"]["xaxis"]["type"] == "date"
    assert fig["data"][0]["x"][0] == pytest.approx(1.7e12)  # epoch milliseconds
    unsmoothed = views.curve_figure(PANEL['reward'], [s], run_names={}, smoothing=0.0)
    assert len(unsmoothed["data"]) == 1


def test_smoothed_constant_is_drawn_flat():
    y = np.full(500, 5.0)
    s = views.SeriesView(1, "library/size", np.arange(500.0), y, views.ema(y, 0.6)[0])
    fig = views.curve_figure(PANEL['library'], [s], run_names={}, smoothing=0.6)
    assert all(set(np.asarray(t["y"]).tolist()) == {5.0} for t in fig["data"])


def test_curve_figure_empty_says_so_and_secondary_axis():
    fig = views.curve_figure(PANEL['extractor'], [], run_names={})
    assert fig["data"] == [] and "no data yet" in json.dumps(fig["layout"]["annotations"])
    assert fig["layout"]["yaxis2"]["overlaying"] == "y"
    fig = views.curve_figure(PANEL['extractor'], [_series(1, "extractor/loss", 5)], run_names={}, smoothing=0)
    assert fig["data"][0]["yaxis"] == "y2"


def test_panels_cover_the_metric_keys():
    for key in ["policy/reward_with_exp", "policy/reward_without_exp", "policy/success_with_exp",
                "policy/success_without_exp", "policy/actions_with_exp", "policy/actions_without_exp",
                "extractor/reward_mean", "extractor/loss", "library/size", "library/adds", "library/merges",
                "retrieval/latency_p50_ms", "retrieval/latency_p99_ms", "search_and_ask/calls"]:
        assert key in views.CURVE_KEYS


def test_edit_positions_interpolate_to_steps():
    times = np.array([100.0, 110.0, 120.0])
    steps = np.array([0.0, 10.0, 20.0])
    assert views.edit_positions([105.0, 119.0, 50.0, 500.0], "step", times, steps) == pytest.approx([5.0, 19.0])
    assert views.edit_positions([105.0], "time", None, None) == [105.0]
    assert views.edit_positions([105.0], "step", None, None) == []


def _entry(i=1, **kw):
    base = dict(id=i, text="## Title: Go diagonal\n## Description: d\n## Content: c", env="minihack/Room-5x5", task="reach >",
                source=Source.EXTRACTED, status=Status.ACTIVE, version=2, successes=3, failures=1, updated_at=time.time())
    base.update(kw)
    return Experience(**base)


def test_entries_table_columns_and_scores():
    df = views.entries_table([_entry(1), _entry(2, successes=0, failures=0)])
    assert list(df.columns) == views.ENTRY_COLUMNS and len(views.ENTRY_COLUMN_WIDTHS) == len(views.ENTRY_COLUMNS)
    assert df.iloc[0]["title"] == "Go diagonal" and df.iloc[0]["success rate"] == "0.75 (3 of 4)"
    assert df.iloc[0]["content"] == "c"
    assert df.iloc[1]["success rate"] == ""
    df = views.entries_table([_entry(1)], scores=[0.91234])
    assert df.columns[1] == "score" and df.iloc[0]["score"] == 0.912


def test_runs_table_shows_latest_success():
    runs = [{"id": 3, "name": "r", "variant": "grpo", "env": "minihack/Room-5x5", "status": "running", "step": 12,
             "started_at": time.time(), "device": "cpu", "backend": "hf"}]
    df = views.runs_table(runs, {3: {"policy/success_with_exp": 0.5, "policy/success_without_exp": 0.25}})
    row = df.iloc[0]
    assert row["success with exp"] == "0.50" and row["success without exp"] == "0.25"
    assert row["device"] == "cpu"  # the back end's paragraph is in the run's details, not in its one-line row


def test_runs_table_rows_stay_one_line_and_say_the_build():
    long_backend = "hf (Qwen2ForCausalLM, 3.2M params, fp32, 1 thread); learner hf (LoRA off) " * 4
    runs = [{"id": 4, "name": "n" * 90, "variant": "complementary", "env": "minihack/Room-Ultimate-5x5", "status": "running",
             "step": 0, "started_at": time.time(), "device": "cpu", "backend": long_backend, "pid": 77},
            {"id": 5, "name": "other", "variant": "grpo", "env": "minihack/Room-5x5", "status": "running", "step": 0,
             "started_at": time.time(), "device": "", "backend": "", "pid": 78}]
    build = {"state": "building", "pid": 77, "done": 50, "total": 200}
    df = views.runs_table(runs, {}, build=build)
    assert all(len(str(v)) <= 40 and "\n" not in str(v) for v in df.to_numpy().ravel())
    assert df.iloc[0]["status"] == "building models 25%"
    assert df.iloc[1]["status"] == "waiting for model build (25%)"
    md = views.run_details_md({**runs[0], "parent_run_id": 2, "log_path": "/x.log", "error": "", "ended_at": None}, [9], None)
    assert "fork of run **#2**" in md and "#9" in md and long_backend.strip()[:40] in md


def test_sparse_series_get_markers_and_their_intervals():
    panel = PANEL["heldout"]
    x = np.array([0.0, 10.0, 20.0])
    y = np.array([0.2, 0.5, 0.6])
    s = views.SeriesView(1, "eval/success_with_exp", x, y, y, lo=y - 0.1, hi=y + 0.2)
    one = views.SeriesView(1, "eval/success_without_exp", x[:1], y[:1], y[:1])
    fig = views.curve_figure(panel, [s, one], run_names={1: "#1"}, smoothing=0.6)
    by = {t["name"]: t for t in fig["data"]}
    t = by["#1 · greedy, with exp"]
    assert t["mode"] == "lines+markers" and np.allclose(t["error_y"]["array"], 0.2) and np.allclose(t["error_y"]["arrayminus"], 0.1)
    assert by["#1 · greedy, without exp"]["mode"] == "markers"  # one point: a line would draw nothing
    assert fig["layout"]["xaxis"]["tickformat"] == "d" and fig["layout"]["xaxis"]["dtick"] >= 1
    assert fig["layout"]["legend"]["yanchor"] == "top" and fig["layout"]["legend"]["y"] < 0


def test_gap_is_with_minus_without_at_the_common_steps():
    steps, gap = views.gap_series((np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.6, 0.9])),
                                  (np.array([2.0, 3.0, 4.0]), np.array([0.1, 0.4, 0.0])))
    assert steps.tolist() == [2.0, 3.0] and np.allclose(gap, [0.5, 0.5])


def test_episode_view_is_a_step_slider_oldest_first():
    turns = [{"turn": i, "observation": f"obs {i}", "action": "north" if i else ""} for i in range(50)]
    h = views.live_episode_html(turns)
    assert h.count("class='comprl-step'") == 50 and "max='49'" in h and "value='49'" in h
    assert h.index("obs 0") < h.index("obs 49")
    assert h.count("display:block") == 1


def test_upload_cap_in_binary_units():
    assert views.fmt_bytes(20 * 1024 * 1024) == "20 MiB"


def test_page_info():
    assert views.page_info(50, 50, 100_000, 2, 50) == "entries 51–100 of 100,000 · page 2 of 2,000"
    assert views.page_info(0, 0, 0, 1, 50) == "no entries match"


def test_diff_html_escapes_and_colours():
    out = views.diff_html("--- v1\n+++ v2\n@@ -1 +1 @@\n-<b>old</b>\n+new & better\n")
    assert "&lt;b&gt;old&lt;/b&gt;" in out and "new &amp; better" in out
    assert "d-del" in out and "d-add" in out and "d-hunk" in out
    assert "no difference" in views.diff_html("")


def test_lineage_lists_parents_children_and_episode():
    child = _entry(5, parent_ids=[1, 2, 99], source=Source.MERGED, source_episode_id=42)
    md = views.lineage_md(child, {1: _entry(1), 2: _entry(2)}, {7: _entry(7)})
    assert "#1" in md and "#2" in md and "#99 (not in the library)" in md and "#7" in md and "episode: #42" in md


def test_ab_tables_and_summary():
    results = {"arms": {"A": {"n": 20, "successes": 15, "rate": 0.75, "ci_low": 0.53, "ci_high": 0.89, "mean_actions": 7.5},
                        "B": {"n": 20, "successes": 10, "rate": 0.5, "mean_actions": 9.0}},
               "diff": 0.25, "p_value": 0.1025, "per_task": {"t1": {"A": 1.0, "B": 0.5}}}
    df = views.ab_results_table(results)
    assert list(df["arm"]) == ["A", "B"]
    assert df.iloc[0]["Wilson 95% CI"] == "[0.53, 0.89]"
    assert df.iloc[1]["Wilson 95% CI"] == "[0.30, 0.70]"  # recomputed: Wilson(10, 20) = (.299, .701)
    assert views.ab_per_task_table(results).iloc[0].tolist() == ["t1", "1.00", "0.50"]
    long = {"per_task": {f"env: Dungeon {i}: " + "Reach the staircase down in a dark room " * 3: {"A": 1.0, "B": 0.0} for i in (10, 2, 1)}}
    table = views.ab_per_task_table(long)
    assert [t.split(":")[1] for t in table["task"]] == [" Dungeon 1", " Dungeon 2", " Dungeon 10"]  # natural order
    assert all(len(t) <= 70 for t in table["task"])  # shortened, so the rates stay in view
    homes = {f"alfworld/pick_and_place: Household {i}: put some pen on garbagecan.": {"A": 1.0, "B": 0.0} for i in (12, 3, 0)}
    assert [t.split(":")[1] for t in views.ab_per_task_table({"per_task": homes})["task"]] == [
        " Household 0", " Household 3", " Household 12"]  # ALFWorld's recurring households too
    test = {"id": 4, "name": "x", "status": "done", "progress": 1.0, "error": "", "created_at": time.time(),
            "config": {"env": "minihack/Room-5x5", "seeds": list(range(20)), "checkpoint": "", "max_turns": None,
                       "arms": {"A": {"kind": "current"}, "B": {"kind": "minus", "ids": [3, 4]}}}, "results": results}
    md = views.ab_summary_md(test)
    assert "+0.250" in md and "0.102" in md and "current − #3, #4" in md
    assert views.ab_tests_table([test]).iloc[0]["p-value"] == "0.102 (unpaired)"
    assert views.ab_tests_table([test], {test["id"]: 0.125}).iloc[0]["p-value"] == "0.125"
    assert "100%" in views.progress_bar_html(1.0, "done")


def test_episode_html_escapes_and_marks_the_end():
    traj = {"id": 9, "env": "minihack/Room-5x5", "seed": 3, "with_experience": True, "success": True, "reward": 1.0,
            "num_actions": 2, "task": "reach <stairs>", "experience_text": "go east", "experience_ids": [4],
            "steps": [{"observation": "you see a <wall>", "action": "east", "reward": 0.0, "kind": "action",
                       "tool_query": "", "tool_answer": ""},
                      {"observation": "stairs", "action": "south", "reward": 1.0, "kind": "action",
                       "tool_query": "where?", "tool_answer": "east"}]}
    out = views.trajectory_html(traj)
    assert "&lt;wall&gt;" in out and "&lt;stairs&gt;" in out and "episode over: success" in out
    assert "search-and-ask" in out and "#4" in out
    live = views.live_episode_html([{"turn": 0, "observation": "start"}, {"turn": 1, "observation": "next", "action": "east",
                                                                           "reward": 0.0}], "an entry")
    assert live.index("turn 1") < live.index("turn 0")  # newest first
    assert "an entry" in live


def test_diff_keeps_the_last_lines_apart_and_shows_the_added_one():
    """The bug: difflib on splitlines(True) joined '-old last' and '+new last' into one line (the texts end without a
    newline), so the added line was never its own green line. Store, CLI, UI diff, merge preview all use text_diff."""
    from core.store import text_diff

    d = text_diff("## Title: Stairs\n## Content: go to the >", "## Title: Stairs\n## Content: walk to the > now", "v1", "v2")
    assert "-## Content: go to the >" in d.splitlines() and "+## Content: walk to the > now" in d.splitlines()
    h = views.diff_html(d)
    assert "<span class='d-add'>+## Content: walk to the &gt; now</span>" in h
    assert "<span class='d-del'>-## Content: go to the &gt;</span>" in h


def test_entries_table_shows_each_entrys_claim_shortened():
    """Issue 39: a run's entries share one title ("Where the staircase is"); the table shows what each one says."""
    from core.types import entry_content, format_entry_text

    claim = "The staircase down (>) was 2 south and 1 east of your starting square; from the start, head south."
    text = format_entry_text("Where the staircase is", "Reaching the staircase down", claim)
    assert entry_content(text) == claim and entry_content("no headers\nat all") == "no headers at all"
    long = format_entry_text("Where the staircase is", "d", claim + " " + "Then keep going east along the wall. " * 5)
    df = views.entries_table([_entry(1, text=text), _entry(2, text=long)])
    assert df.iloc[0]["content"] == claim and df.iloc[0]["title"] == "Where the staircase is"
    assert df.iloc[1]["content"].startswith(claim[:60]) and df.iloc[1]["content"].endswith("…")
    assert len(df.iloc[1]["content"]) <= views.CONTENT_CHARS
    assert sum(float(w.rstrip("%")) for w in views.ENTRY_COLUMN_WIDTHS) == pytest.approx(100)
    assert sum(float(w.rstrip("%")) for w in views.RUN_COLUMN_WIDTHS) == pytest.approx(100)


def test_a_sync_gap_past_the_threshold_is_a_warning_on_the_runs_tab():
    from core.metrics import SYNC_GAP_WARN, sync_warning

    runs = [{"id": 3, "name": "r", "variant": "grpo", "env": "minihack/Room-5x5", "status": "running", "step": 12,
             "started_at": time.time(), "device": "cpu", "backend": "vllm"}]
    ok = {"sync/logprob_gap_max": 1e-6, "sync/extractor_logprob_gap_max": 0.01}
    bad = {**ok, "sync/extractor_logprob_gap_max": SYNC_GAP_WARN + 1.2}
    assert sync_warning(ok) is None and sync_warning({}) is None
    assert views.runs_table(runs, {3: ok}).iloc[0]["status"] == "running"
    assert views.runs_table(runs, {3: bad}).iloc[0]["status"] == "running · sync warning"
    md = views.run_details_md({**runs[0], "parent_run_id": None, "log_path": "", "error": "", "ended_at": None}, [], None, bad)
    assert "weight sync (extractor)" in md and "1.70 nats" in md
    assert "weight sync" not in views.run_details_md({**runs[0], "parent_run_id": None}, [], None, ok)

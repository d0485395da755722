"""The real workbench in Debian Chromium: `comprl app` on a loopback port, driven by Playwright.

Each test leaves a screenshot under test-output/<test name>/. The tests that need the trainer
(a run launched from the UI, an A/B test, live policy play) skip only when `trainers.engine`
cannot be imported. Never runs `playwright install`: the browser is /usr/bin/chromium.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

# slow as a whole: the module's app server and Chromium take ~15 s to start, and its tests, most of them driving
# the UI for seconds or a trainer for minutes, several minutes together (`make test-fast` leaves them out).
pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
OUT = ROOT / "test-output"
# Bounds for waiting on a condition (a point appeared, a status changed), never fixed sleeps: generous, because on a
# loaded 2-core machine a training step can take minutes; a condition met early returns at once.
UI_S = 60_000  # a click's answer from the server
SLOW_S = 900_000  # the trainer's work (a run's steps, an A/B test's episodes)

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium); browser tests skipped", allow_module_level=True)
if importlib.util.find_spec("playwright") is None:
    pytest.skip("the playwright package is not installed (pip install playwright); browser tests skipped",
                allow_module_level=True)

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

from core.store import ExperienceStore, NewEntry  # noqa: E402


def _trainer() -> bool:
    try:
        importlib.import_module("trainers.engine")
    except Exception:
        return False
    return True


needs_trainer = pytest.mark.skipif(not _trainer(), reason="trainer not available")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class App:
    def __init__(self, url: str, data_dir: Path, db_url: str, proc: subprocess.Popen):
        self.url, self.data_dir, self.db_url, self.proc = url, data_dir, db_url, proc
        self.store = ExperienceStore(db_url)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    data = tmp_path_factory.mktemp("workbench") / "data"
    data.mkdir()
    db_url = f"sqlite:///{data / 'workbench.db'}"
    port = _free_port()
    log = (data.parent / "app.log").open("w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("COMPRL_AUTH", None)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "app", "--data-dir", str(data), "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"the workbench did not start: {(data.parent / 'app.log').read_text()[-3000:]}")
        time.sleep(0.5)
    a = App(url, data, db_url, proc)
    yield a
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    # Runs and evaluations the UI started are their own processes: end the ones still going, by pid.
    for r in a.store.list_runs():
        if r["pid"] and r["status"] in ("created", "starting", "running", "paused"):
            try:
                os.kill(r["pid"], 9)
            except ProcessLookupError:
                pass
    a.store.close()
    log.close()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture()
def page(app, browser, request):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.goto(app.url)
    pg.wait_for_selector("#runs-table", timeout=60_000)
    yield pg
    out = OUT / request.node.name
    out.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(out / "final.png"), full_page=True)
    ctx.close()


def shot(page: Page, request, name: str) -> None:
    out = OUT / request.node.name
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / f"{name}.png"), full_page=True)


def tab(page: Page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def fill(page: Page, elem_id: str, value: str, kind: str = "input") -> None:
    page.locator(f"#{elem_id} {kind}").first.fill(value)


def open_accordion(page: Page, label: str) -> None:
    page.get_by_role("button", name=label).first.click()


def open_entry(page: Page, entry_id: int) -> None:
    fill(page, "entry-id", str(entry_id))
    page.locator("#entry-open").click()
    expect(page.locator("#entry-loaded")).to_contain_text(f"entry #{entry_id} loaded", timeout=20_000)


def choose(page: Page, elem_id: str, value: str) -> None:
    """Pick a dropdown's option by typing it and clicking the option that reads exactly `value` (ArrowDown + Enter, as
    docs/make_screenshots.py does, took a neighbour — `Room-Random-5x5` for `Room-5x5` — when the filtered list had
    not caught up under load)."""
    box = page.locator(f"#{elem_id} input").first
    box.click()
    box.fill(value)
    exact = re.compile(rf"(^|[\s✓]){re.escape(value)}\s*$")
    page.locator('li[data-testid="dropdown-option"]:visible').filter(has_text=exact).first.click(timeout=UI_S)
    expect(box).to_have_value(value, timeout=UI_S)


def demo_on(page: Page, mode: str = "expert", env: str = "minihack/Room-5x5", seed: int = 0) -> None:
    """The demo on a chosen env seed (it opens on the newest run's recurring task: issue 39)."""
    tab(page, "Agent demo")
    expect(page.locator("#demo-defaults")).to_contain_text("Opens on", timeout=UI_S)  # the page's first paint is done
    page.locator("#demo-mode label", has_text="scripted expert" if mode == "expert" else "policy").click()
    choose(page, "demo-env", env)
    page.locator("#demo-seed input").fill(str(seed))
    page.locator("#demo-task-ids input").uncheck()
    page.locator("#demo-turns input").fill("0")


def add_entry(app: App, text: str, **kw) -> int:
    return app.store.add_entries([NewEntry(text=text, env=kw.pop("env", "minihack/Room-5x5"), task=kw.pop("task", "reach"),
                                           **kw)], actor="extractor")[0]


def plot_points(page: Page, elem_id: str) -> list[int]:
    return page.evaluate(
        "(id) => { const el = document.querySelector('#' + id + ' .js-plotly-plot');"
        " return el && el.data ? el.data.map(t => t.x.length) : []; }", elem_id)


# -- the tests ----------------------------------------------------------------------------------------------


def test_page_loads(page, request):
    for name in ("Runs", "Live curves", "Library", "A/B tests", "Agent demo"):
        expect(page.get_by_role("tab", name=name)).to_be_visible()
    expect(page.locator("#overview")).to_contain_text("Complementary RL workbench")
    shot(page, request, "runs")


def test_edit_entry_in_the_ui_writes_a_new_version(app, page, request):
    eid = add_entry(app, "## Title: Doors\n## Description: d\n## Content: open the door first")
    tab(page, "Library")
    open_entry(page, eid)
    expect(page.locator("#entry-text textarea")).to_have_value("## Title: Doors\n## Description: d\n## Content: open the door first")
    page.locator("#entry-text textarea").fill("## Title: Doors\n## Description: d\n## Content: kick the door open")
    page.locator("#entry-save").click()
    expect(page.locator("#entry-msg")).to_contain_text("as version 2", timeout=20_000)
    e = app.store.get(eid)
    assert e.version == 2 and e.text.endswith("kick the door open")
    assert app.store.history(eid)[-1].actor == "human"
    expect(page.locator("#entry-history")).to_contain_text("edit")
    shot(page, request, "edited")


def test_stale_edit_is_refused_and_nothing_is_lost(app, page, request):
    eid = add_entry(app, "## Title: Keys\n## Description: d\n## Content: take the key")
    tab(page, "Library")
    open_entry(page, eid)
    # Meanwhile someone else changes it (the CLI, another browser).
    app.store.update_text(eid, "## Title: Keys\n## Description: d\n## Content: theirs", expected_version=1, actor="cli")
    mine = "## Title: Keys\n## Description: d\n## Content: mine"
    page.locator("#entry-text textarea").fill(mine)
    page.locator("#entry-save").click()
    expect(page.locator("#entry-msg")).to_contain_text("changed by someone else", timeout=20_000)
    expect(page.locator("#entry-text textarea")).to_have_value(mine)  # the person's text is still there
    assert app.store.get(eid).text.endswith("theirs") and app.store.get(eid).version == 2
    shot(page, request, "stale")


def test_merge_is_accepted_and_lineage_shows_the_parents(app, page, request):
    a = add_entry(app, "## Title: Stairs A\n## Description: d\n## Content: go to the > sign")
    b = add_entry(app, "## Title: Stairs B\n## Description: d\n## Content: walk to the stairs")
    tab(page, "Library")
    open_accordion(page, "Merge entries")
    page.locator("#merge-ids textarea, #merge-ids input").first.fill(f"{a}, {b}")
    page.locator("#merge-text textarea").fill("## Title: Stairs\n## Description: d\n## Content: walk to the > (the stairs)")
    page.locator("#merge-preview").click()
    expect(page.locator("#merge-diff")).to_contain_text(f"#{a} → merged", timeout=20_000)
    page.locator("#merge-accept").click()
    expect(page.locator("#merge-msg")).to_contain_text("merged", timeout=20_000)
    expect(page.locator("#entry-lineage")).to_contain_text("Parents (2)", timeout=20_000)
    expect(page.locator("#entry-lineage")).to_contain_text(f"#{a}")
    expect(page.locator("#entry-lineage")).to_contain_text(f"#{b}")
    new = app.store.list_entries(source="merged", sort="id", descending=True, limit=1).entries[0]
    assert new.parent_ids == [a, b]
    shot(page, request, "merged")


def test_import_of_a_bad_file_names_the_line(app, page, request, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "## Title: ok\n## Description: d\n## Content: c"}) + "\n" + '{"text": ""}\n')
    before = app.store.count(status=None)
    tab(page, "Library")
    open_accordion(page, "Import / export (JSONL)")
    page.locator("#import-file input[type=file]").set_input_files(str(bad))
    # uploaded (not a fixed 1 s); the name may be shown as "bad .jsonl" (stem and extension apart)
    expect(page.locator("#import-file")).to_contain_text(re.compile(r"bad\s*\.jsonl"), timeout=UI_S)
    page.locator("#import-btn").click()
    expect(page.locator("#import-msg")).to_contain_text("line 2", timeout=20_000)
    expect(page.locator("#import-msg")).to_contain_text("nothing imported")
    assert app.store.count(status=None) == before
    shot(page, request, "import-error")


def test_demo_plays_an_expert_episode(page, request):
    demo_on(page)
    page.locator("#demo-start").click()
    expect(page.locator("#demo-status")).to_contain_text("ready", timeout=60_000)
    expect(page.locator("#demo-episode")).to_contain_text("turn 0")
    page.locator("#demo-step").click()
    expect(page.locator("#demo-episode")).to_contain_text("turn 1", timeout=20_000)
    page.locator("#demo-play").click()
    expect(page.locator("#demo-status")).to_contain_text("episode over", timeout=60_000)
    expect(page.locator("#demo-status")).to_contain_text("success")
    shot(page, request, "expert-episode")


def test_curves_gain_points_when_metrics_are_written(app, browser, request):
    rid = app.store.create_run("browser-curves", variant="grpo", env="minihack/Room-5x5", status="running")
    for s in range(20):
        app.store.log_metrics(rid, s, {"policy/reward_with_exp": s / 20, "policy/reward_without_exp": s / 40})
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    try:
        page.goto(app.url)  # a fresh page: the running run (this one) is preselected
        page.wait_for_selector("#runs-table", timeout=60_000)
        tab(page, "Live curves")
        page.wait_for_function("() => { const el = document.querySelector('#curve-reward .js-plotly-plot');"
                               " return el && el.data && el.data.length >= 2 && el.data[0].x.length === 20; }",
                               timeout=SLOW_S)
        for s in range(20, 45):
            app.store.log_metrics(rid, s, {"policy/reward_with_exp": s / 20, "policy/reward_without_exp": s / 40})
        page.wait_for_function("() => { const el = document.querySelector('#curve-reward .js-plotly-plot');"
                               " return el && el.data && el.data[0].x.length === 45; }", timeout=SLOW_S)
        assert set(plot_points(page, "curve-reward")) == {45}
        expect(page.locator("#curve-status")).to_contain_text("points held")
        shot(page, request, "curves")
    finally:
        ctx.close()


# -- with the trainer ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """An untrained tiny Qwen2 model folder (seconds to build): enough to run the real loop end to end."""
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder

    texts = ["north south east west northeast northwest southeast southwest wait search the stairs > @ . # | -"] * 40
    tok = build_tokenizer(texts, vocab_size=400)
    return str(save_model_folder(build_tiny_qwen2(tok, hidden=64, layers=2, heads=4, kv_heads=2, max_pos=2048), tok,
                                 tmp_path_factory.mktemp("tiny") / "model"))


TINY_RUN = """run:
  name: browser-tiny
  variant: complementary
  max_steps: 12
  checkpoint_every: 2
  eval_episodes: 0
env:
  names: {{minihack/Room-5x5: 1.0}}
  max_turns: 4
actor:
  path: {model}
  max_new_tokens: 4
rollout:
  tasks_per_step: 1
  group_size: 2
  with_experience: 1
extractor:
  model:
    path: {model}
    max_new_tokens: 16
  buffer_size: 2
"""


@needs_trainer
def test_run_launched_from_the_ui_gains_curve_points(app, page, request, tiny_model):
    editor = page.locator("#config-editor .cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(TINY_RUN.format(model=tiny_model))
    page.locator("#config-check").click()
    expect(page.locator("#config-msg")).to_contain_text("valid", timeout=30_000)
    page.locator("#config-launch").click()
    expect(page.locator("#config-msg")).to_contain_text("launched run", timeout=30_000)
    run = next(r for r in app.store.list_runs() if r["name"] == "browser-tiny")
    expect(page.locator("#runs-table")).to_contain_text("browser-tiny", timeout=30_000)
    page.reload()
    page.wait_for_selector("#runs-table", timeout=60_000)
    tab(page, "Live curves")
    page.wait_for_function("() => { const el = document.querySelector('#curve-success .js-plotly-plot');"
                           " return el && el.data && el.data.length > 0 && el.data[0].x.length >= 1; }", timeout=SLOW_S)
    first = max(plot_points(page, "curve-success"))
    page.wait_for_function("(n) => { const el = document.querySelector('#curve-success .js-plotly-plot');"
                           " return el && el.data && Math.max(...el.data.map(t => t.x.length)) > n; }", arg=first,
                           timeout=SLOW_S)
    assert app.store.latest_metrics(run["id"])
    shot(page, request, "run-curves")


@needs_trainer
def test_ab_test_completes_with_intervals(app, page, request, tiny_model):
    add_entry(app, "## Title: Stairs\n## Description: d\n## Content: the > is the way down")
    tab(page, "A/B tests")
    page.locator("#ab-name input, #ab-name textarea").first.fill("tiny arms")
    page.locator("#ab-seeds input, #ab-seeds textarea").first.fill("0-1")
    page.locator("#ab-ckpt input, #ab-ckpt textarea").first.fill(tiny_model)
    page.locator("#ab-turns input").fill("3")
    page.locator("#ab-reps input").fill("3")  # sampled (the tab's default), each task 3 times per arm
    page.locator("#ab-create").click()
    expect(page.locator("#ab-msg")).to_contain_text("6 episodes per arm", timeout=30_000)
    expect(page.locator("#ab-summary")).to_contain_text("status **done**".replace("**", ""), timeout=SLOW_S)
    expect(page.locator("#ab-results")).to_contain_text("[", timeout=10_000)
    expect(page.locator("#ab-summary")).to_contain_text("p-value")
    expect(page.locator("#ab-summary")).to_contain_text("2 task ids × 3 sampled episodes = 6 per arm")
    t = app.store.list_ab_tests()[0]
    assert t["status"] == "done" and set(t["results"]["arms"]) == {"A", "B"}
    assert t["config"]["decoding"] == "sampled" and t["results"]["arms"]["A"]["n"] == 6
    shot(page, request, "ab-done")


@needs_trainer
def test_live_policy_demo_plays(page, request, tiny_model):
    tab(page, "Agent demo")
    page.locator("#demo-mode label", has_text="policy").click()
    page.locator("#demo-ckpt input, #demo-ckpt textarea").first.fill(tiny_model)
    page.locator("#demo-start").click()
    expect(page.locator("#demo-status")).to_contain_text("ready", timeout=SLOW_S)
    page.locator("#demo-play").click()
    expect(page.locator("#demo-status")).to_contain_text("episode over", timeout=SLOW_S)
    shot(page, request, "policy-episode")


# -- issue 25: the first hour of a new user, views that are never stale, plots and comparisons ----------------


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def test_model_build_shows_as_a_phase_with_progress_and_eta(app, page, request):
    """While the default models are built (minutes), the Runs tab and Live curves show the build with its progress and
    time left, and the building run's status says so, instead of "running, step 0" and empty plots."""
    builder = _sleeper()
    rid = app.store.create_run("first-run", variant="complementary", env="minihack/Room-Ultimate-5x5", status="running")
    app.store.update_run(rid, pid=builder.pid)
    progress = app.data_dir / ".models-build.json"
    try:
        progress.write_text(json.dumps({"state": "building", "pid": builder.pid, "stage": "policy SFT", "done": 1700,
                                        "total": 5003, "started_at": time.time() - 130, "updated_at": time.time(),
                                        "eta_s": 400.0}))
        expect(page.locator("#build-progress-runs")).to_contain_text("model build 34% (policy SFT)", timeout=UI_S)
        expect(page.locator("#build-progress-runs")).to_contain_text("left", timeout=UI_S)
        expect(page.locator("#build-progress-runs")).to_contain_text(f"for run #{rid}")
        expect(page.locator("#runs-table")).to_contain_text("building models 34%", timeout=UI_S)
        shot(page, request, "build-runs")
        tab(page, "Live curves")
        expect(page.locator("#build-progress-curves")).to_contain_text("model build 34%", timeout=UI_S)
        builder.kill()
        builder.wait()
        # the builder is gone without saying so (SIGKILL): the page must not claim a build is running
        expect(page.locator("#build-progress-curves")).to_contain_text("ended without finishing", timeout=UI_S)
    finally:
        builder.kill()
        progress.unlink(missing_ok=True)
        app.store.update_run(rid, status="stopped", pid=None)


def test_a_fresh_page_shows_the_library_as_it_is_now(app, browser, request, tmp_path):
    """The library table was filled once when the app started: a new tab said "no entries match" while the header
    counted the entries, and it did not refresh after an import."""
    title = f"Fresh {time.time_ns()}"
    add_entry(app, f"## Title: {title}\n## Description: d\n## Content: added after the app started")
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    try:
        page.goto(app.url)
        page.wait_for_selector("#runs-table", timeout=UI_S)
        tab(page, "Library")
        expect(page.locator("#library-table")).to_contain_text(title, timeout=UI_S)
        shot(page, request, "fresh-library")
        good = tmp_path / "good.jsonl"
        imported = f"Imported {time.time_ns()}"
        good.write_text(json.dumps({"text": f"## Title: {imported}\n## Description: d\n## Content: c", "env": "minihack/Room-5x5"}) + "\n")
        open_accordion(page, "Import / export (JSONL)")
        page.locator("#import-file input[type=file]").set_input_files(str(good))
        expect(page.locator("#import-file")).to_contain_text("good.jsonl", timeout=UI_S)
        page.locator("#import-btn").click()
        expect(page.locator("#import-msg")).to_contain_text("imported 1", timeout=UI_S)
        page.locator("#lib-desc input").check()  # newest first, so the imported entry is on the first page however many the module added
        expect(page.locator("#library-table")).to_contain_text(imported, timeout=UI_S)
    finally:
        ctx.close()


def test_id_boxes_start_empty_and_replay_lists_every_episode(app, page, request):
    """The replay box's fields labelled "(empty: any)" held 0, so the default listing was empty."""
    app.store.add_trajectories([{"run_id": None, "env": "minihack/Room-5x5", "task": "reach the stairs", "seed": 4242 + i,
                                 "success": bool(i % 2), "reward": 1.0, "num_actions": 3, "with_experience": False,
                                 "steps": [{"observation": f"obs {j}", "action": "east", "reward": 0.0} for j in range(3)]}
                                for i in range(3)])
    for name, box in (("Runs", "run-id"), ("Library", "entry-id"), ("A/B tests", "ab-id")):
        tab(page, name)
        expect(page.locator(f"#{box} input, #{box} textarea").first).to_have_value("", timeout=UI_S)
    tab(page, "Agent demo")
    open_accordion(page, "Replay a stored episode")
    for box in ("replay-run", "replay-ab", "replay-id"):
        expect(page.locator(f"#{box} input, #{box} textarea").first).to_have_value("", timeout=UI_S)
    page.locator("#replay-list").click()
    expect(page.locator("#replay-table")).to_contain_text("4242", timeout=UI_S)
    shot(page, request, "replay-list")


def test_the_diff_shows_the_changed_last_line_as_removed_and_added(app, page, request):
    eid = add_entry(app, "## Title: Diff\n## Description: d\n## Content: go to the >")
    app.store.update_text(eid, "## Title: Diff\n## Description: d\n## Content: walk to the > now", expected_version=1, actor="cli")
    tab(page, "Library")
    open_entry(page, eid)
    page.locator("#diff-btn").click()
    expect(page.locator("#diff-view .d-add")).to_have_text("+## Content: walk to the > now", timeout=UI_S)
    expect(page.locator("#diff-view .d-del")).to_have_text("-## Content: go to the >")
    page.locator("#entry-history").scroll_into_view_if_needed()
    shot(page, request, "diff")


def test_fork_from_the_ui_keeps_step_name_and_parent(app, page, request, tmp_path):
    """Fork with max steps 0 finished at once, showed step 0, dropped "(fork of N)", and the parent showed nowhere."""
    cfg = "run:\n  name: parent-run\n  max_steps: 12\nenv:\n  names: {minihack/Room-5x5: 1.0}\n"
    rid = app.store.create_run("parent-run", variant="complementary", env="minihack/Room-5x5", config=cfg, status="finished")
    ck = tmp_path / "ck"
    (ck / "step_000012").mkdir(parents=True)
    (ck / "latest").write_text("step_000012")
    app.store.update_run(rid, step=12, checkpoint_dir=str(ck))
    fill(page, "run-id", str(rid))
    page.locator("#run-id input").press("Enter")
    page.locator("#run-fork").click()
    expect(page.locator("#run-msg")).to_contain_text("at step 12", timeout=UI_S)  # refused: nothing to train
    page.locator("#fork-steps input").fill("20")
    page.locator("#run-fork").click()
    expect(page.locator("#run-msg")).to_contain_text("forked run", timeout=UI_S)
    child = next(r for r in app.store.list_runs() if r.get("parent_run_id") == rid)
    try:
        assert child["name"] == f"parent-run (fork of {rid})" and child["step"] == 12
        expect(page.locator("#runs-table")).to_contain_text(f"parent-run (fork of {rid})", timeout=UI_S)
        fill(page, "run-id", str(child["id"]))
        page.locator("#run-id input").press("Enter")
        expect(page.locator("#run-details")).to_contain_text(f"fork of run #{rid}", timeout=UI_S)
        shot(page, request, "fork")
    finally:
        pid = app.store.get_run(child["id"])["pid"]
        if pid:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        app.store.update_run(child["id"], status="stopped", pid=None)


def test_live_curves_preselect_the_running_run(app, browser, request):
    running = app.store.create_run("the-running-one", variant="grpo", env="minihack/Room-5x5", status="running")
    newest = app.store.create_run("newest-but-stopped", variant="grpo", env="minihack/Room-5x5", status="stopped")
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    try:
        page.goto(app.url)
        page.wait_for_selector("#runs-table", timeout=UI_S)
        tab(page, "Live curves")
        expect(page.locator("#curve-runs")).to_contain_text(f"#{running} the-running-one", timeout=UI_S)
        expect(page.locator("#curve-runs")).not_to_contain_text(f"#{newest} newest-but-stopped")
    finally:
        app.store.update_run(running, status="stopped")
        ctx.close()


def test_sparse_evaluations_are_drawn_with_markers_intervals_and_a_gap(app, browser, request):
    rid = app.store.create_run("eval-points", variant="complementary", env="minihack/Room-5x5", status="running")
    for s in (0, 10, 20):
        app.store.log_metrics(rid, s, {"eval/success_with_exp": 0.3 + s / 100, "eval/success_with_exp_ci_low": 0.1 + s / 100,
                                       "eval/success_with_exp_ci_high": 0.6 + s / 100, "eval/success_without_exp": 0.2,
                                       "eval/success_without_exp_ci_low": 0.05, "eval/success_without_exp_ci_high": 0.45})
    app.store.log_metrics(rid, 5, {"retrieval/latency_p50_ms": 3.0})  # logged once
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    try:
        page.goto(app.url)
        page.wait_for_selector("#runs-table", timeout=UI_S)
        tab(page, "Live curves")
        page.wait_for_function("() => { const el = document.querySelector('#curve-heldout .js-plotly-plot');"
                               " return el && el.data && el.data.some(t => t.x.length === 3); }", timeout=SLOW_S)
        traces = page.evaluate("() => document.querySelector('#curve-heldout .js-plotly-plot').data.map(t => "
                               "({name: t.name, mode: t.mode, err: !!(t.error_y && t.error_y.array)}))")
        mine = [t for t in traces if t["name"].startswith(f"#{rid} ")]
        assert mine and all("markers" in t["mode"] and t["err"] for t in mine), traces
        one = page.evaluate("() => document.querySelector('#curve-latency .js-plotly-plot').data.map(t => t.mode)")
        assert "markers" in one  # one point is a marker, not an invisible line
        gap = page.evaluate("() => document.querySelector('#curve-gap .js-plotly-plot').data.map(t => t.y)")
        assert any(len(y) == 3 for y in gap)
        ticks = page.evaluate("() => document.querySelector('#curve-heldout .js-plotly-plot').layout.xaxis.dtick")
        assert ticks >= 1 and float(ticks).is_integer()
        page.locator("#curve-heldout").scroll_into_view_if_needed()
        shot(page, request, "eval-curves")
        open_accordion(page, "Export the points of a panel as CSV")
        page.locator("#curve-csv-btn").click()
        expect(page.locator("#curve-csv-msg")).to_contain_text("exported", timeout=UI_S)
    finally:
        app.store.update_run(rid, status="stopped")
        ctx.close()


def test_ab_test_shows_the_paired_test_and_the_arm_of_each_episode(app, page, request):
    seeds = list(range(8))
    ab = app.store.create_ab_test("paired by seed", {"env": "minihack/Room-Ultimate-5x5", "seeds": seeds, "checkpoint": "",
                                                     "max_turns": None, "arms": {"A": {"kind": "current"}, "B": {"kind": "none"}}})
    for arm, wins in (("A", {0, 1, 2, 3, 4}), ("B", {0, 5})):
        app.store.add_trajectories([{"ab_test_id": ab, "env": "minihack/Room-Ultimate-5x5", "task": f"Dungeon {s}", "seed": s,
                                     "success": s in wins, "reward": float(s in wins), "num_actions": 4,
                                     "with_experience": arm == "A", "steps": []} for s in seeds])
    app.store.update_ab_test(ab, status="done", progress=1.0, results={"diff": 0.375, "p_value": 0.1, "arms": {}})
    tab(page, "A/B tests")
    fill(page, "ab-id", str(ab))
    page.locator("#ab-open").click()
    expect(page.locator("#ab-summary")).to_contain_text("McNemar", timeout=UI_S)
    expect(page.locator("#ab-summary")).to_contain_text("4 solved by A only, 1 by B only")
    expect(page.locator("#ab-episodes")).to_contain_text("arm")
    shot(page, request, "ab-paired")


def test_semantic_search_finds_the_entry_by_its_text(app, page, request):
    task = "Dungeon 9: reach the staircase down"
    for t, c in (("Monster", "step around the monster diagonally"), ("Trap", "the trap is one square west of the door"),
                 ("Stairs in the dark", "the stairs (>) are two squares south and one east of where you start; walk there "
                                        "in the dark")):
        add_entry(app, f"## Title: {t}\n## Description: d\n## Content: {c}", task=task, env="minihack/Room-Ultimate-5x5")
    tab(page, "Library")
    page.locator("#lib-search input, #lib-search textarea").first.fill("how do I find the stairs in the dark")
    page.locator("#lib-search-btn").click()
    expect(page.locator("#search-table .virtual-row").first).to_contain_text("Stairs in the dark", timeout=SLOW_S)
    expect(page.locator("#search-table")).to_contain_text("task score")


def test_runs_rows_stay_one_line(app, page, request):
    rid = app.store.create_run("long-backend", variant="grpo", env="minihack/Room-5x5", status="stopped")
    app.store.update_run(rid, device="cpu", backend=("hf (Qwen2ForCausalLM, 3.2M params, fp32, 1 thread); " * 6)[:250])
    row = page.locator("#runs-table .virtual-row", has_text="long-backend").first  # Gradio's rows are divs
    expect(row).to_be_visible(timeout=UI_S)
    assert row.bounding_box()["height"] < 60
    row.locator(".body-cell").first.click()
    expect(page.locator("#run-details")).to_contain_text("Qwen2ForCausalLM", timeout=UI_S)


def test_episode_view_is_a_step_slider(page, request):
    demo_on(page)
    page.locator("#demo-start").click()
    expect(page.locator("#demo-status")).to_contain_text("ready", timeout=UI_S)
    for n in range(1, 4):
        page.locator("#demo-step").click()
        expect(page.locator("#demo-episode .comprl-step-label")).to_contain_text(f"turn {n} of {n}", timeout=UI_S)
    assert page.locator("#demo-episode .comprl-step:visible").count() == 1
    page.locator("#live-slider").fill("0")
    expect(page.locator("#demo-episode .comprl-step-label")).to_contain_text("turn 0 of 3")
    assert page.locator("#demo-episode .comprl-step:visible").first.get_attribute("data-turn") == "0"
    shot(page, request, "step-slider")


def test_an_extracted_entry_links_its_source_episode_and_explains_its_count(app, page, request):
    ep = app.store.add_trajectories([{"run_id": None, "env": "minihack/Room-5x5", "task": "reach", "seed": 7, "success": True,
                                      "reward": 1.0, "num_actions": 2, "with_experience": False,
                                      "steps": [{"observation": "the source episode's first view", "action": "east",
                                                 "reward": 0.0}]}])[0]
    eid = add_entry(app, "## Title: From an episode\n## Description: d\n## Content: c", source_episode_id=ep)
    app.store.record_retrievals([eid] * 8)
    tab(page, "Library")
    open_entry(page, eid)
    expect(page.locator("#entry-usage-note")).to_contain_text("retrieved 8× in all", timeout=UI_S)
    page.locator("#entry-source-btn").click()
    expect(page.locator("#entry-source-episode")).to_contain_text(f"episode #{ep}", timeout=UI_S)


def test_the_log_tail_follows_the_end(app, page, request):
    log = app.data_dir / "logs" / "follow.log"
    log.write_text("".join(f"line {i}\n" for i in range(300)))
    rid = app.store.create_run("logged-run", variant="grpo", env="minihack/Room-5x5", status="stopped", log_path=str(log))
    fill(page, "run-id", str(rid))
    page.locator("#run-id input").press("Enter")
    expect(page.locator("#run-log textarea")).to_have_value(re.compile("line 299"), timeout=UI_S)
    page.wait_for_function("() => { const t = document.querySelector('#run-log textarea');"
                           " return t && t.scrollHeight > t.clientHeight && t.scrollTop + t.clientHeight >= t.scrollHeight - 4; }",
                           timeout=UI_S)


# -- issue 39: the first screens ---------------------------------------------------------------------------------

# Every word of every header lies on one line inside its column (none cut, none broken inside: "succes ses",
# "succes..."): the header's words measured with a Range, each one rectangle within its header cell.
HEADERS_WHOLE_JS = """(id) => { const bad = [];
  for (const th of document.querySelectorAll('#' + id + ' thead th')) {
    const span = th.querySelector('.header.text'); if (!span) continue;
    const box = (th.querySelector('.header-content') || th).getBoundingClientRect();
    const node = [...span.childNodes].find(n => n.nodeType === 3); if (!node) continue;
    let at = 0;
    for (const word of node.textContent.split(' ')) {
      const r = document.createRange(); r.setStart(node, at); r.setEnd(node, at + word.length); at += word.length + 1;
      const rects = [...r.getClientRects()].filter(x => x.width > 0);
      if (rects.length !== 1 || rects[0].right > box.right + 1 || rects[0].left < box.left - 1) bad.push(word);
    } }
  return bad; }"""


def _fresh_page(app: App, browser) -> tuple[Any, Page]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    page.goto(app.url)
    page.wait_for_selector("#runs-table", timeout=UI_S)
    return ctx, page


def test_the_library_table_shows_each_entrys_claim_under_whole_headers(app, browser, request):
    """A run's entries share one title ("Where the staircase is"): the table shows what each says, shortened, under
    headers whose words are whole."""
    from core.types import format_entry_text

    claims = [f"The staircase down (>) was {n} south and 1 east of your starting square; from the start, head south."
              for n in (2, 3)]
    ids = [add_entry(app, format_entry_text("Where the staircase is", "Reaching the staircase down", c),
                     env="minihack/Room-Ultimate-5x5", task=f"Dungeon {n}: reach the staircase down")
           for n, c in zip((12, 13), claims)]
    ctx, page = _fresh_page(app, browser)
    try:
        tab(page, "Library")
        page.locator("#lib-desc input").check()  # newest first: these two on the first page
        for c in claims:
            expect(page.locator("#library-table")).to_contain_text(c, timeout=UI_S)
        row = page.locator("#library-table .virtual-row", has_text=claims[0]).first
        expect(row).to_contain_text("Where the staircase is")
        assert page.evaluate(HEADERS_WHOLE_JS, "library-table") == []
        for word in ("retrieved", "trained", "success", "claim", "content"):
            expect(page.locator("#library-table thead")).to_contain_text(word)
        shot(page, request, "library-claims")
        assert app.store.get(ids[0]).text.endswith(claims[0])
    finally:
        ctx.close()


def test_the_runs_table_shows_its_figures_whole(app, browser, request):
    rid = app.store.create_run("figures-whole", variant="complementary", env="minihack/Room-Ultimate-5x5", status="stopped")
    app.store.update_run(rid, step=1234, device="cpu", started_at=time.time())
    app.store.log_metrics(rid, 1234, {"policy/success_with_exp": 0.71875, "policy/success_without_exp": 0.40625})
    ctx, page = _fresh_page(app, browser)
    try:
        row = page.locator("#runs-table .virtual-row", has_text="figures-whole").first
        expect(row).to_contain_text("0.72", timeout=UI_S)
        expect(row).to_contain_text("0.41")
        # the variant, env, step, both success figures, the start time and the device: nothing cut (no ellipsis)
        cut = page.evaluate("""(name) => { const row = [...document.querySelectorAll('#runs-table .virtual-row')]
            .find(r => r.textContent.includes(name));
          return [...row.querySelectorAll('td')].slice(2).filter((td, i) => i !== 2)
            .filter(td => td.scrollWidth > td.clientWidth + 1).map(td => td.textContent.trim()); }""", "figures-whole")
        assert cut == []
        assert page.evaluate(HEADERS_WHOLE_JS, "runs-table") == []
        shot(page, request, "runs-figures")
    finally:
        ctx.close()


def test_the_demo_opens_on_the_newest_runs_recurring_task_and_shows_its_entry(app, browser, request, tmp_path):
    """The Agent demo opens on the newest run's env and a recurring task its library holds an entry for, played by
    the run's policy (its latest checkpoint; without the trainer, the scripted expert, saying why), with the library:
    the first Start shows that entry."""
    import shutil

    from envs.base import instance_task, task_seed
    from trainers.player import EpisodePlayer

    env = "minihack/Room-Ultimate-5x5"
    probe = EpisodePlayer(env, task_seed(env, 5), expert=True, use_library=False)
    probe.reset()
    task = instance_task(env, 5, probe.batch.lives[0].ep.traj.task)  # the task text a run gives Dungeon 5
    probe.close()
    cfg = f"run:\n  name: dark-rooms\nenv:\n  names: {{{env}: 1.0}}\n  max_turns: 8\n  task_set: 16\n"
    ck = tmp_path / "checkpoints"
    policy = _trainer()
    if policy:  # the run's latest checkpoint holds a policy (the tiny model)
        shutil.copytree(request.getfixturevalue("tiny_model"), ck / "step_000002" / "policy")
        (ck / "step_000002" / "state.pt").write_bytes(b"")
        (ck / "latest").write_text("step_000002")
    rid = app.store.create_run("dark-rooms", variant="complementary", env=env, config=cfg, status="stopped",
                               checkpoint_dir=str(ck) if policy else "")
    claim = "The staircase down (>) was 2 south and 1 east of your starting square; from the start, head south."
    app.store.add_entries([NewEntry(text=f"## Title: Where the staircase is\n## Description: d\n## Content: {claim}",
                                    env=env, task=task, run_id=rid)], actor="extractor")
    ctx, page = _fresh_page(app, browser)
    try:
        tab(page, "Agent demo")
        expect(page.locator("#demo-defaults")).to_contain_text(f"#{rid} dark-rooms", timeout=UI_S)
        expect(page.locator("#demo-defaults")).to_contain_text("task 5")
        expect(page.locator("#demo-env input")).to_have_value(env)
        expect(page.locator("#demo-seed input")).to_have_value("5")
        expect(page.locator("#demo-task-ids input")).to_be_checked()
        expect(page.locator("#demo-turns input")).to_have_value("8")
        who = "policy" if policy else "expert"
        expect(page.locator(f"#demo-mode input[value={who}]")).to_be_checked()
        if policy:
            expect(page.locator("#demo-ckpt input, #demo-ckpt textarea").first).to_have_value(str(ck / "step_000002"))
            expect(page.locator("#demo-defaults")).to_contain_text(f"run #{rid}'s policy")
        else:
            expect(page.locator("#demo-defaults")).to_contain_text("scripted expert")
        shot(page, request, "demo-opens")
        page.locator("#demo-start").click()
        expect(page.locator("#demo-status")).to_contain_text("task 5 (recurring): ready", timeout=SLOW_S)
        expect(page.locator("#demo-status")).to_contain_text("entry for it is shown")
        expect(page.locator("#demo-episode")).to_contain_text(claim)
        shot(page, request, "demo-entry")
    finally:
        ctx.close()


@needs_trainer
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed: pip install -e '.[ray]'")
def test_a_ray_run_started_from_the_command_line_shows_live(app, page, request, tiny_model):
    """`comprl train CONFIG --set run.executor=ray` (its own local Ray cluster) in the workbench's data dir: the
    workbench needs no change to watch it; its curves gain points while it runs, and its stop command stops it."""
    cfg = app.data_dir.parent / "ray_run.yaml"
    cfg.write_text(TINY_RUN.format(model=tiny_model).replace("browser-tiny", "browser-ray").replace("max_steps: 12",
                                                                                                  "max_steps: 1000"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    log = (app.data_dir.parent / "ray_run.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "train", str(cfg), "--set", "run.executor=ray", "--set",
                             "ray.num_cpus=2", "--data-dir", str(app.data_dir)], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + SLOW_S / 1000
        while not any(r["name"] == "browser-ray" and r["step"] >= 1 for r in app.store.list_runs()):
            assert proc.poll() is None, (app.data_dir.parent / "ray_run.log").read_text()[-3000:]
            assert time.time() < deadline
            time.sleep(0.5)
        page.reload()
        page.wait_for_selector("#runs-table", timeout=60_000)
        expect(page.locator("#runs-table")).to_contain_text("browser-ray", timeout=UI_S)
        tab(page, "Live curves")
        # this run's own traces (another test's run may still be running beside it)
        points = ("() => { const el = document.querySelector('#curve-success .js-plotly-plot');"
                  " const t = el && el.data ? el.data.filter(t => (t.name || '').includes('browser-ray')) : [];"
                  " return t.length ? Math.max(...t.map(t => t.x.length)) : 0; }")
        page.wait_for_function(f"() => ({points})() >= 1", timeout=SLOW_S)
        first = page.evaluate(points)
        page.wait_for_function(f"(n) => ({points})() > n", arg=first, timeout=SLOW_S)
        shot(page, request, "ray-run-curves")
        run = next(r for r in app.store.list_runs() if r["name"] == "browser-ray")
        assert run["status"] == "running"  # the curve grew while it ran
        app.store.send_command(run["id"], "stop")  # what the workbench's stop button sends
        assert proc.wait(timeout=SLOW_S / 1000) == 0
        assert "executor ray: a local cluster started by this run" in (app.data_dir.parent / "ray_run.log").read_text()
        assert app.store.get_run(run["id"])["status"] == "stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def test_the_demo_and_the_ab_tab_open_on_an_alfworld_recurring_run(app, browser, request):
    """Issue 38 item 6: on a run of configs/alfworld_recurring_cpu.yaml the Agent demo opens on a household its library
    holds an entry for (the checkbox says "Household N") and the expert plays it with that entry shown; the A/B tab
    opens on the run's households and turn limit. (Last in the module: its run is the newest from here on.)"""
    pytest.importorskip("alfworld")
    from app.service.demo import TaskPlayer

    env = "alfworld/pick_and_place"
    probe = TaskPlayer(env, 6, expert=True, use_library=False)
    probe.reset()
    task = probe.task  # "Household 6: put some ... on ..."
    probe.close()
    import yaml

    cfg = yaml.safe_load((ROOT / "configs" / "alfworld_recurring_cpu.yaml").read_text())
    cfg["rollout"]["constrain_actions"] = True  # a policy decoded within the admissible commands
    rid = app.store.create_run("households", variant="complementary", env=env, status="stopped", config=yaml.safe_dump(cfg))
    claim = "In household 6 look in drawer 1 before anything else."
    app.store.add_entries([NewEntry(text=f"## Title: Where it is\n## Description: d\n## Content: {claim}", env=env,
                                    task=task, run_id=rid)], actor="extractor")
    ctx, page = _fresh_page(app, browser)
    try:
        tab(page, "Agent demo")
        expect(page.locator("#demo-defaults")).to_contain_text(f"#{rid} households", timeout=UI_S)
        expect(page.locator("#demo-defaults")).to_contain_text("task 6 (Household 6)")
        expect(page.locator("#demo-env input")).to_have_value(env)
        expect(page.locator("#demo-seed input")).to_have_value("6")
        expect(page.locator("#demo-task-ids input")).to_be_checked()
        expect(page.locator("#demo-task-ids")).to_contain_text("Household N", timeout=UI_S)
        expect(page.locator("#demo-turns input")).to_have_value("20")
        expect(page.locator("#demo-constrain input")).to_be_checked()  # as the run's policy played
        page.locator("#demo-mode label", has_text="scripted expert").click()
        page.locator("#demo-start").click()
        expect(page.locator("#demo-status")).to_contain_text("task 6 (recurring): ready", timeout=SLOW_S)
        expect(page.locator("#demo-status")).to_contain_text("Household 6: ")
        expect(page.locator("#demo-episode")).to_contain_text(claim)
        page.locator("#demo-play").click()
        expect(page.locator("#demo-status")).to_contain_text("episode over", timeout=SLOW_S)
        expect(page.locator("#demo-status")).to_contain_text("success")
        shot(page, request, "demo-household")
        tab(page, "A/B tests")
        expect(page.locator("#ab-defaults")).to_contain_text(f"#{rid} households", timeout=UI_S)
        expect(page.locator("#ab-env input")).to_have_value(env)
        expect(page.locator("#ab-seeds input, #ab-seeds textarea").first).to_have_value("0-15")
        expect(page.locator("#ab-task-ids input")).to_be_checked()
        expect(page.locator("#ab-task-ids")).to_contain_text("Household N")
        expect(page.locator("#ab-turns input")).to_have_value("20")
        shot(page, request, "ab-households")
    finally:
        ctx.close()

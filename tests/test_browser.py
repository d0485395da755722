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
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
OUT = ROOT / "test-output"

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
    page.wait_for_timeout(1000)
    page.locator("#import-btn").click()
    expect(page.locator("#import-msg")).to_contain_text("line 2", timeout=20_000)
    expect(page.locator("#import-msg")).to_contain_text("nothing imported")
    assert app.store.count(status=None) == before
    shot(page, request, "import-error")


def test_demo_plays_an_expert_episode(page, request):
    tab(page, "Agent demo")
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
        page.goto(app.url)  # a fresh page: the newest run (this one) is preselected
        page.wait_for_selector("#runs-table", timeout=60_000)
        tab(page, "Live curves")
        page.wait_for_function("() => { const el = document.querySelector('#curve-reward .js-plotly-plot');"
                               " return el && el.data && el.data.length >= 2 && el.data[0].x.length === 20; }",
                               timeout=30_000)
        for s in range(20, 45):
            app.store.log_metrics(rid, s, {"policy/reward_with_exp": s / 20, "policy/reward_without_exp": s / 40})
        page.wait_for_function("() => { const el = document.querySelector('#curve-reward .js-plotly-plot');"
                               " return el && el.data && el.data[0].x.length === 45; }", timeout=30_000)
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
                           " return el && el.data && el.data.length > 0 && el.data[0].x.length >= 1; }", timeout=150_000)
    first = max(plot_points(page, "curve-success"))
    page.wait_for_function("(n) => { const el = document.querySelector('#curve-success .js-plotly-plot');"
                           " return el && el.data && Math.max(...el.data.map(t => t.x.length)) > n; }", arg=first,
                           timeout=150_000)
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
    page.locator("#ab-create").click()
    expect(page.locator("#ab-msg")).to_contain_text("started", timeout=30_000)
    expect(page.locator("#ab-summary")).to_contain_text("status **done**".replace("**", ""), timeout=170_000)
    expect(page.locator("#ab-results")).to_contain_text("[", timeout=10_000)
    expect(page.locator("#ab-summary")).to_contain_text("p-value")
    t = app.store.list_ab_tests()[0]
    assert t["status"] == "done" and set(t["results"]["arms"]) == {"A", "B"}
    shot(page, request, "ab-done")


@needs_trainer
def test_live_policy_demo_plays(page, request, tiny_model):
    try:
        importlib.import_module("trainers.rollout").EpisodePlayer  # noqa: B018
    except AttributeError:
        pytest.skip("trainers.rollout.EpisodePlayer is not provided by the trainer yet")
    tab(page, "Agent demo")
    page.locator("#demo-mode label", has_text="policy").click()
    page.locator("#demo-ckpt input, #demo-ckpt textarea").first.fill(tiny_model)
    page.locator("#demo-start").click()
    expect(page.locator("#demo-status")).to_contain_text("ready", timeout=90_000)
    page.locator("#demo-play").click()
    expect(page.locator("#demo-status")).to_contain_text("episode over", timeout=120_000)
    shot(page, request, "policy-episode")

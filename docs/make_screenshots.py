"""Screenshots of every workbench view for docs/workbench.md, taken from the real app.

    python docs/make_screenshots.py [--out docs/img] [--steps 8]

In a temporary data directory it writes a few library entries by hand (through the workbench
service, as a person would), merges two of them and edits one; runs a real short training run
(`comprl train`, a tiny untrained model built on the spot, so the curves are real but flat); runs
a real A/B test; then starts `comprl app` on a free loopback port and photographs each tab in
Chromium (/usr/bin/chromium, headless). Needs the trainer for the run and the A/B test; without it
those views are photographed empty.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]

ENTRIES = [
    ("Walk diagonally to the stairs", "Room tasks where the > is visible from the start",
     "Diagonal moves (northeast, southwest, ...) cover a room in half the steps; head straight for the > and stop."),
    ("Stairs first, items never", "Room-5x5 and Room-Ultimate-5x5",
     "Picking up objects or fighting costs turns without reward; only reaching the staircase counts."),
    ("Go around monsters", "Room-Ultimate with a monster between you and the stairs",
     "Step diagonally past a monster instead of attacking; attacks can miss for several turns."),
    ("Get the key before the door", "KeyRoom: a locked door separates you from the stairs",
     "Walk to the key (the ( sign), pick it up, then apply it at the door before going through."),
    ("Follow the corridor", "MazeWalk: long corridors with dead ends",
     "Keep to one wall; on a dead end turn back at once rather than searching."),
    ("Walk diagonally toward the staircase", "Room tasks where the > can be seen",
     "Diagonal steps reach the > in fewer turns; go directly there."),
    ("Get the key before the locked door", "KeyRoom: a locked door separates you from the stairs",
     "Walk to the key (the ( sign), pick it up, then apply it at the door before going through it."),
]

TINY_RUN = """run:
  name: docs-demo
  variant: complementary
  max_steps: {steps}
  checkpoint_every: 4
  eval_every: 2
  eval_episodes: 4
env:
  names: {{minihack/Room-5x5: 1.0}}
  max_turns: 6
actor:
  path: {model}
  max_new_tokens: 4
rollout:
  tasks_per_step: 1
  group_size: 4
  with_experience: 2
extractor:
  model:
    path: {model}
    max_new_tokens: 24
  buffer_size: 4
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_available() -> bool:
    try:
        importlib.import_module("trainers.engine")
    except Exception:
        return False
    return True


def tiny_model(folder: Path) -> str:
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder

    texts = ["north south east west northeast northwest southeast southwest wait search the stairs > @ . # | -"] * 40
    tok = build_tokenizer(texts, vocab_size=400)
    return str(save_model_folder(build_tiny_qwen2(tok, hidden=64, layers=2, heads=4, kv_heads=2, max_pos=2048), tok, folder))


def seed(data: Path, steps: int) -> dict:
    from app.service import Workbench

    wb = Workbench(data)
    envs = ["minihack/Room-5x5"] * 3 + ["minihack/KeyRoom-S5", "minihack/MazeWalk-9x9", "minihack/Room-5x5",
                                        "minihack/KeyRoom-S5"]
    ids = [wb.create_entry(t, d, c, env, "Reach the staircase down (>)")[1] for (t, d, c), env in zip(ENTRIES, envs)]
    wb.save_entry(ids[1], wb.store.get(ids[1]).text + " Ignore gold.", 1)
    _, merged = wb.accept_merge(f"{ids[0]}, {ids[5]}", "## Title: Walk diagonally to the stairs\n"
                                "## Description: Room tasks where the > can be seen\n"
                                "## Content: Diagonal steps reach the > in about half the turns; go straight there.")
    info = {"entries": ids, "merged": merged, "run": None, "ab": None}
    if trainer_available():
        model = tiny_model(data.parent / "tiny-model")
        cfg = data.parent / "docs-run.yaml"
        cfg.write_text(TINY_RUN.format(steps=steps, model=model))
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        print("training a short real run …", flush=True)
        subprocess.run([sys.executable, "-m", "app.cli", "train", str(cfg), "--data-dir", str(data)], cwd=ROOT, env=env,
                       check=True, stdout=subprocess.DEVNULL)
        info["run"] = wb.store.list_runs()[0]["id"]
        print("running an A/B test …", flush=True)
        # An env whose seeds differ (Room-5x5 is one fixed layout): the recurring dark rooms, by task id.
        msg, ab = wb.create_ab_test("current vs none", "minihack/Room-Ultimate-5x5", "0-7", model, 6, "current", "", None, "none",
                                    "", None, True)
        info["ab"] = ab
        deadline = time.time() + 300
        while ab and wb.store.get_ab_test(ab)["status"] not in ("done", "failed") and time.time() < deadline:
            time.sleep(2)
            wb.reap_processes()
    wb.close()
    return info


def shoot_build(url: str, out: Path, data: Path) -> None:
    """The model build as a phase of the first run: the default config on this data dir (which has no models yet)
    builds them; photographed once the build is under way, then stopped with SIGTERM (the run ends 'stopped')."""
    import signal

    from playwright.sync_api import expect, sync_playwright

    from core import build_progress

    from app.service import Workbench

    wb = Workbench(data)  # launched as the workbench launches a run: its row, then `comprl train`, its log in logs/
    wb.launch_run((ROOT / "configs" / "minihack_room_cpu.yaml").read_text())
    run = wb._launched[-1].proc
    try:
        deadline = time.time() + 900
        while True:  # past the demo stage, so the bar has an ETA
            p = build_progress.building(data)
            if p is not None and p.get("eta_s") is not None:
                break
            if run.poll() is not None or time.time() > deadline:
                raise RuntimeError("the model build did not get under way")
            time.sleep(1)
        with sync_playwright() as pw:
            browser, page = _open(pw, url)
            expect(page.locator("#build-progress-runs")).to_contain_text("left", timeout=60_000)
            expect(page.locator("#runs-table")).to_contain_text("building models", timeout=60_000)
            expect(page.locator("#run-log textarea")).to_have_value(re.compile(r"\S"), timeout=60_000)
            page.screenshot(path=str(out / "build-progress.png"), full_page=False)
            page.get_by_role("tab", name="Live curves").click()
            expect(page.locator("#build-progress-curves")).to_contain_text("model build", timeout=60_000)
            page.screenshot(path=str(out / "build-progress-curves.png"), full_page=False)
            browser.close()
    finally:
        run.send_signal(signal.SIGTERM)  # a clean stop during the build
        run.wait(timeout=300)
        wb.close()


def _open(p, url: str):
    """Headless Debian Chromium on the workbench, once its runs table is there: (browser, page)."""
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_selector("#runs-table", timeout=60_000)
    return browser, page


def shoot(url: str, out: Path, info: dict) -> None:
    from playwright.sync_api import expect, sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser, page = _open(p, url)
        if info["run"]:
            page.locator("#run-id input").fill(str(info["run"]))
            page.locator("#run-id input").press("Enter")
            page.wait_for_timeout(1500)
        page.locator("#config-choice input").click()
        page.locator("#config-choice input").fill("minihack_room_cpu")
        page.wait_for_timeout(500)
        page.locator("#config-choice input").press("ArrowDown")
        page.locator("#config-choice input").press("Enter")
        page.wait_for_timeout(1500)
        page.locator("#config-check").click()
        page.wait_for_timeout(2500)
        page.screenshot(path=str(out / "runs.png"), full_page=True)

        page.get_by_role("tab", name="Live curves").click()
        if info["run"]:
            page.wait_for_function("() => { const el = document.querySelector('#curve-heldout .js-plotly-plot');"
                                   " return el && el.data && el.data.some(t => t.error_y && t.x.length >= 2); }", timeout=300_000)
        page.wait_for_timeout(1500)
        page.screenshot(path=str(out / "curves.png"), full_page=True)
        page.locator("#curve-heldout").scroll_into_view_if_needed()
        page.screenshot(path=str(out / "curves-intervals.png"))

        page.get_by_role("tab", name="Library").click()
        # A fresh page lists the library as it is now (entries written after the app started included).
        expect(page.locator("#library-table")).to_contain_text("Get the key", timeout=60_000)
        page.screenshot(path=str(out / "library-fresh-tab.png"), full_page=False)
        page.locator("#entry-id input").fill(str(info["merged"]))
        page.locator("#entry-open").click()
        expect(page.locator("#entry-loaded")).to_contain_text("loaded", timeout=20_000)
        page.screenshot(path=str(out / "library.png"), full_page=True)
        page.locator("#entry-id input").fill(str(info["entries"][1]))
        page.locator("#entry-open").click()
        page.wait_for_timeout(1500)
        page.locator("#diff-btn").click()
        expect(page.locator("#diff-view .d-add")).to_be_visible(timeout=60_000)
        page.locator("#entry-history").scroll_into_view_if_needed()
        page.mouse.wheel(0, 250)  # the history and the whole diff below it
        page.wait_for_timeout(300)
        page.screenshot(path=str(out / "library-history-diff.png"))
        page.get_by_role("button", name="Merge entries").click()
        page.locator("#dup-find").click()
        page.wait_for_timeout(6000)
        page.locator("#merge-box").scroll_into_view_if_needed()
        page.screenshot(path=str(out / "library-merge.png"))

        page.get_by_role("tab", name="A/B tests").click()
        if info["ab"]:
            page.locator("#ab-id input").fill(str(info["ab"]))
            page.locator("#ab-open").click()
            expect(page.locator("#ab-summary")).to_contain_text("McNemar", timeout=60_000)
        page.screenshot(path=str(out / "ab.png"), full_page=True)

        page.get_by_role("tab", name="Agent demo").click()
        page.locator("#demo-start").click()
        expect(page.locator("#demo-status")).to_contain_text("ready", timeout=60_000)
        for _ in range(3):
            page.locator("#demo-step").click()
            page.wait_for_timeout(700)
        page.screenshot(path=str(out / "demo.png"), full_page=False)
        browser.close()


def shoot_run(url: str, out: Path, run_id: int, prefix: str, ab: bool = False, ab_id: int = 0) -> None:
    """The Live curves and the Library of an existing run (a data dir a study or `make run` left behind); with `ab`,
    an A/B test started from the A/B tab with its defaults (the current library against none, on the default's task
    ids), photographed once it is done (its McNemar test, results per arm and per task); with `ab_id`, that existing
    test is opened and photographed instead."""
    from playwright.sync_api import expect, sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser, page = _open(p, url)
        page.locator("#run-id input").fill(str(run_id))
        page.locator("#run-id input").press("Enter")
        page.wait_for_timeout(1500)
        page.get_by_role("tab", name="Live curves").click()
        page.wait_for_function("() => { const el = document.querySelector('#curve-success .js-plotly-plot');"
                               " return el && el.data && el.data.some(t => t.x.length > 1); }", timeout=120_000)
        page.wait_for_timeout(3000)
        page.screenshot(path=str(out / f"{prefix}curves.png"), full_page=True)
        page.get_by_role("tab", name="Library").click()
        page.wait_for_timeout(4000)
        page.screenshot(path=str(out / f"{prefix}library.png"), full_page=False)
        if ab or ab_id:
            page.get_by_role("tab", name="A/B tests").click()
            if not ab_id:
                page.locator("#ab-name textarea").fill(f"run {run_id}'s library vs none")
                page.locator("#ab-create").click()
                expect(page.locator("#ab-msg")).to_contain_text("started", timeout=60_000)
                ab_id = int(page.locator("#ab-msg").inner_text().split("A/B test ", 1)[1].split(" ", 1)[0])
            page.locator("#ab-id input").fill(str(ab_id))
            deadline = time.time() + 1800
            while "status done" not in page.locator("#ab-summary").inner_text():  # its results per arm and per task are in
                if time.time() > deadline:
                    raise RuntimeError(f"A/B test {ab_id} did not finish in 30 minutes; see its log in the A/B tab")
                page.locator("#ab-open").click()
                page.wait_for_timeout(5000)
            page.screenshot(path=str(out / f"{prefix}ab.png"), full_page=True)
            print(page.locator("#ab-summary").inner_text())
        browser.close()


def serve(data: Path):
    """`comprl app` on `data` at a free loopback port, once it answers: (process, url)."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("COMPRL_AUTH", None)
    app = subprocess.Popen([sys.executable, "-m", "app.cli", "app", "--data-dir", str(data), "--port", str(port)],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return app, url
        except OSError:
            if app.poll() is not None or time.time() > deadline:
                app.terminate()
                raise RuntimeError("the workbench did not start") from None
            time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    ap.add_argument("--steps", type=int, default=8, help="steps of the short real training run")
    ap.add_argument("--no-build", action="store_true", help="skip the photograph of the model build (it starts the real "
                                                             "default build for a minute, then stops it)")
    ap.add_argument("--data-dir", default="", help="photograph an existing run's curves and library in this data dir instead")
    ap.add_argument("--run", type=int, default=0, help="with --data-dir: the run id (default: the newest)")
    ap.add_argument("--prefix", default="recurring-", help="with --data-dir: file name prefix of the screenshots")
    ap.add_argument("--ab", action="store_true", help="with --data-dir: also run and photograph an A/B test (the tab's "
                                                       "defaults: the current library against none)")
    ap.add_argument("--ab-id", type=int, default=0, help="with --data-dir: photograph this existing A/B test instead")
    args = ap.parse_args()
    if args.data_dir:
        from core.store import ExperienceStore

        data = Path(args.data_dir).resolve()
        store = ExperienceStore(f"sqlite:///{data / 'workbench.db'}")
        run_id = args.run or store.list_runs()[0]["id"]
        store.close()
        app, url = serve(data)
        try:
            shoot_run(url, Path(args.out), run_id, args.prefix, args.ab, args.ab_id)
        finally:
            app.terminate()
            app.wait(timeout=30)
        print(f"screenshots in {args.out}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        info = seed(data, args.steps)
        app, url = serve(data)
        try:
            shoot(url, Path(args.out), info)
            if not args.no_build and trainer_available():  # last: its run would be the one the curves show
                shoot_build(url, Path(args.out), data)
        finally:
            app.terminate()
            app.wait(timeout=30)
    print(f"screenshots in {args.out}")


if __name__ == "__main__":
    main()

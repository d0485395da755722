"""One model build at a time, its progress file and its few log lines (core/build_progress.py), and the run that
is stopped by a signal while the models are being built (comprl train on a fresh data dir, the real build)."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core import build_progress as B

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_stop():
    B._STOP.clear()
    yield
    B._STOP.clear()


def test_progress_file_and_a_few_log_lines(tmp_path):
    t = [1000.0]
    out = io.StringIO()
    bar = B.BuildProgress(tmp_path / "models", total=1000, stream=out, clock=lambda: t[0])
    bar.set_postfix_str("demos")
    for i in range(1000):
        t[0] += 0.5
        bar.update(1)
        if i == 500:
            bar.set_postfix_str("policy SFT")
    bar.close()
    lines = out.getvalue().splitlines()
    # started, two stages, ten tenths: a few lines for a thousand updates (tqdm wrote one per update to a log)
    assert 10 <= len(lines) <= 16, lines
    assert any("policy SFT" in ln for ln in lines)
    p = B.read_progress(tmp_path)
    assert p["state"] == "building" and p["done"] == 1000 and p["total"] == 1000 and p["pid"] == os.getpid()
    assert not list((tmp_path / "models").glob("*")) if (tmp_path / "models").exists() else True  # nothing in models/


def test_without_a_plan_the_eta_comes_from_the_rate_across_stages(tmp_path):
    t = [0.0]
    bar = B.BuildProgress(tmp_path / "models", total=100, disable=True, clock=lambda: t[0])
    bar.set_postfix_str("demos")
    for _ in range(20):
        t[0] += 1.0
        bar.update(1)
    assert bar.eta_s() == pytest.approx(80.0)
    bar.set_postfix_str("policy SFT")  # a new stage keeps the estimate (it read "estimating the time left")
    assert bar.eta_s() == pytest.approx(80.0)
    assert "left" in B.describe(bar.state())


def test_with_a_plan_an_estimate_from_the_start_through_every_stage(tmp_path):
    """Issue 39 item 5: the line read '70% (policy SFT (short prompts)) ... estimating the time left' for minutes."""
    t = [0.0]
    plan = [("demos", 300, 0.05), ("policy SFT", 100, 1.0), ("evaluate", 1, 10.0)]
    bar = B.BuildProgress(tmp_path / "models", disable=True, clock=lambda: t[0], plan=plan)
    assert bar.eta_s() == pytest.approx(15 + 100 + 10)  # the plan's seconds before anything ran
    bar.set_postfix_str("demos")
    pcts = []
    for _ in range(300):
        t[0] += 0.2  # four times slower than planned
        bar.update(1)
        assert bar.eta_s() is not None
    pcts.append(bar.state()["done"])
    bar.set_postfix_str("policy SFT")
    # the stages ahead scaled by how much slower the demos ran: 4 x (100 + 10) s, not "estimating"
    assert bar.eta_s() == pytest.approx(4 * 110, rel=0.01)
    for _ in range(40):
        t[0] += 2.0
        bar.update(1)
    st = bar.state()
    assert st["stage_done"] == 40 and st["stage_total"] == 100
    assert bar.eta_s() == pytest.approx(60 * 2.0 + 10 * (60 + 80) / (15 + 40), rel=0.05)  # measured rate, then the plan
    pcts.append(st["done"])
    # the share is of the time: 140 s of about 140 + 145 s (the steps' share would say 340 / 401 = 85%)
    assert 45 < st["done"] / st["total"] * 100 < 53 and pcts == sorted(pcts)
    assert "(policy SFT 40/100)" in B.describe(st) and "left" in B.describe(st)


def test_the_wait_for_the_process_beside_shows_its_steps_and_time(tmp_path):
    t = [0.0]
    out = io.StringIO()
    bar = B.BuildProgress(tmp_path / "models", stream=out, clock=lambda: t[0], wait="waiting for the extractor",
                          plan=[("policy SFT", 10, 1.0), ("waiting for the extractor", 1, 0.0), ("evaluate the extractor", 1, 4.0)],
                          beside=[("extractor SFT (short prompts)", 10, 1.0), ("extractor SFT", 20, 1.0)])
    assert bar.eta_s() == pytest.approx(30 + 4)  # the longer of the two, then what follows the wait
    bar.set_postfix_str("policy SFT")
    for i in range(10):
        t[0] += 1.0
        bar.update(1)
        bar.beside_at("extractor SFT (short prompts)", i + 1)
    bar.beside_at("extractor SFT", 0)
    bar.set_postfix_str("waiting for the extractor")
    for i in range(10):
        t[0] += 2.0  # alone, at its own measured rate
        bar.beside_at("extractor SFT", i + 1)
    st = bar.state()
    assert st["beside"] == {"stage": "extractor SFT", "done": 10, "total": 20}
    assert bar.eta_s() == pytest.approx(10 * 2.0 + 4.0, rel=0.05)  # its rate alone; the wait is not the lane's pace
    line = B.describe(st)
    assert "(waiting for the extractor; extractor SFT 10/20)" in line and "left" in line, line
    assert "estimating" not in out.getvalue()
    assert any("extractor SFT 0/20" in ln for ln in out.getvalue().splitlines())  # its stage change is a line


def test_the_extractor_takes_the_policys_thread_only_when_it_is_faster(monkeypatch):
    """Issue 39 item 6: once the policy is done the extractor trains on both threads if a core stands idle, and goes
    back to one when two are not faster (another process's load)."""
    import threading as th

    import torch

    from trainers.warmstart import build

    clock = [0.0]
    monkeypatch.setattr(build.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(build, "_idle_cores", lambda prev: (1.0, [0] * 8))
    old = torch.get_num_threads()
    try:
        for faster, kept in ((0.6, 2), (1.5, 1)):
            torch.set_num_threads(1)
            done = th.Event()
            more = build._MoreThreadsWhenFree(done, threads=2)
            step = 1.0
            for i in range(40):
                if i == 10:
                    done.set()
                if torch.get_num_threads() == 2:
                    step = faster
                clock[0] += step
                more.step()
            assert torch.get_num_threads() == kept and more.state == ("kept" if kept == 2 else "back")
    finally:
        torch.set_num_threads(old)


def test_a_second_builder_waits_and_uses_the_first_ones_models(tmp_path):
    """The bug: a second build deleted the first one's .building folder as stale and replaced models/ under it."""
    events: list[str] = []

    @B.one_build_at_a_time
    def ensure(data_dir, name):
        root = Path(data_dir) / "models"
        root.mkdir(exist_ok=True)
        if (root / "policy").exists():
            events.append(f"{name} found")
            return "existing"
        for stale in root.glob(".building-*"):
            events.append(f"{name} deleted {stale.name}")
        (root / f".building-{name}").mkdir()
        bar = B.BuildProgress(root, total=10, disable=True)
        for _ in range(10):
            time.sleep(0.05)
            bar.update(1)
        (root / f".building-{name}").rename(root / "policy")
        events.append(f"{name} built")
        return "built"

    results: dict[str, str] = {}
    first = threading.Thread(target=lambda: results.setdefault("a", ensure(tmp_path, "a")))
    first.start()
    while B.building(tmp_path) is None:
        time.sleep(0.01)
    second = threading.Thread(target=lambda: results.setdefault("b", ensure(tmp_path, "b")))
    second.start()
    first.join(30)
    second.join(30)
    assert events == ["a built", "b found"]
    assert results == {"a": "built", "b": "existing"}
    assert B.read_progress(tmp_path)["state"] == "done"


def test_a_wait_for_another_build_ends_on_stop(tmp_path):
    root = tmp_path / "models"
    said: list[str] = []
    with B.build_lock(root):
        box: dict[str, BaseException] = {}

        def wait():
            try:
                with B.build_lock(root, say=said.append):
                    pass
            except BaseException as e:  # noqa: BLE001
                box["e"] = e

        th = threading.Thread(target=wait)
        th.start()
        time.sleep(0.3)
        assert th.is_alive()  # waiting
        B.request_stop()
        th.join(5)
    assert isinstance(box.get("e"), B.BuildStopped)
    assert said and "waiting for the model build" in said[0]


def test_a_stop_request_ends_the_build_and_records_it(tmp_path):
    @B.one_build_at_a_time
    def ensure(data_dir):
        bar = B.BuildProgress(Path(data_dir) / "models", total=100, disable=True)
        for i in range(100):
            if i == 5:
                B.request_stop()
            bar.update(1)

    with pytest.raises(B.BuildStopped):
        ensure(tmp_path)
    p = B.read_progress(tmp_path)
    assert p["state"] == "stopped" and p["done"] == 5


def test_a_build_whose_process_died_is_not_shown_as_building(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(proc.stdout)
    (tmp_path / B.PROGRESS_NAME).write_text(json.dumps({"state": "building", "pid": dead, "done": 3, "total": 10}))
    assert B.building(tmp_path) is None
    assert B.read_progress(tmp_path)["state"] == "died"


@pytest.mark.slow
def test_sigterm_during_the_model_build_stops_the_run_cleanly(tmp_path):
    """The default config on a fresh data dir builds the models first (minutes). SIGTERM then must end it within
    seconds, mark the run stopped (not running, not failed) and leave no half-built folder."""
    data = tmp_path / "data"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "train.log").open("w")
    p = subprocess.Popen([sys.executable, "-m", "app.cli", "train", "configs/minihack_room_cpu.yaml", "--data-dir", str(data)],
                         cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 600
        while B.building(data) is None:  # the condition that matters: the build has begun (not a fixed sleep)
            assert p.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
            assert time.time() < deadline, "the build never started"
            time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
        log.close()
    from core.store import ExperienceStore

    store = ExperienceStore(f"sqlite:///{data / 'comprl.db'}") if (data / "comprl.db").exists() else None
    if store is None:
        from core.config import default_db_url

        store = ExperienceStore(default_db_url(data))
    run = store.list_runs()[0]
    store.close()
    assert run["status"] == "stopped", run
    assert B.read_progress(data)["state"] == "stopped"
    assert not list((data / "models").glob(".building-*"))
    text = (tmp_path / "train.log").read_text()
    assert text.count("\n") < 40, text  # a few lines, not a line per update

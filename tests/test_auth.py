"""`comprl app --auth`: the real Gradio server, probed over HTTP as a stranger would before logging in."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from app.main import LOGIN_FAILURES, LoginLimiter
from core.store import ExperienceStore

ROOT = Path(__file__).resolve().parents[1]
SECRET_RUN = "run-name-only-an-insider-knows"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("auth") / "data"
    store = ExperienceStore(f"sqlite:///{data / 'workbench.db'}")
    store.create_run(SECRET_RUN, status="finished")  # something from the store a leak would show
    store.add_entry("entry text only an insider knows", env="minihack/Room-5x5")
    store.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (data.parent / "app.log").open("w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "app", "--data-dir", str(data), "--port", str(port),
                             "--auth", "ann:right-password"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        try:
            if requests.get(url + "/", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"the workbench did not start: {(data.parent / 'app.log').read_text()[-3000:]}")
        time.sleep(0.5)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


PROBES = ["/", "/?view=api", "/gradio_api/runs", "/config", "/gradio_api/info", "/info", "/gradio_api/openapi.json",
          "/openapi.json", "/docs", "/gradio_api/startup-events", "/gradio_api/api/open_entry"]


@pytest.mark.slow
def test_nothing_about_the_app_before_login_and_all_of_it_after(server):
    leaks = []
    for path in PROBES:
        r = requests.get(server + path, timeout=10)
        body = r.text
        for secret in (SECRET_RUN, "insider", "open_entry", "save_entry", "launch_run", '"endpoints"', "named_endpoints"):
            if secret in body:
                leaks.append((path, r.status_code, secret))
    print(f"\nunauthenticated probes {len(PROBES)}, leaks {leaks}")
    assert leaks == []
    page = requests.get(server + "/", timeout=10).text
    assert "window.gradio_api_info = null;" in page and '"auth_required":true' in page.replace(" ", "")
    s = requests.Session()
    assert s.post(server + "/login", data={"username": "ann", "password": "right-password"}, timeout=10).status_code == 200
    inside = s.get(server + "/", timeout=10).text
    assert "window.gradio_api_info = null;" not in inside and "named_endpoints" in inside  # the app itself is whole
    # ... and what the probes looked for is really there once logged in (so their silence above means something)
    found = [x for x in ("open_entry", "save_entry", "launch_run", SECRET_RUN) if x in inside]
    print(f"after login the page names {found}")
    assert found


@pytest.mark.slow
def test_failed_logins_are_rate_limited(server):
    codes = [requests.post(server + "/login", data={"username": "ann", "password": f"guess{i}"}, timeout=10).status_code
             for i in range(30)]
    assert codes[:LOGIN_FAILURES] == [400] * LOGIN_FAILURES and set(codes[LOGIN_FAILURES:]) == {429}
    # locked out: the right password is not even checked until the window has passed
    r = requests.post(server + "/login", data={"username": "ann", "password": "right-password"}, timeout=10)
    assert r.status_code == 429 and "try again in" in r.json()["detail"] and int(r.headers["retry-after"]) > 0


def test_limiter_window():
    lim = LoginLimiter(failures=3, window_s=10)
    for t in (0, 1, 2):
        assert lim.wait_s("a", now=t) == 0
        lim.failed("a", now=t)
    assert lim.wait_s("a", now=3) == pytest.approx(7) and lim.wait_s("b", now=3) == 0
    assert lim.wait_s("a", now=10.5) == 0  # the first failure left the window
    lim.succeeded("a")
    assert lim.wait_s("a", now=10.6) == 0

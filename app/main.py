"""Serve the workbench: `comprl app` ends here.

Loopback by default. Any other address needs credentials (`--auth user:password` or COMPRL_AUTH),
because whoever reaches the page can edit the library and start processes. No share links, no
analytics, no server-side rendering process.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import threading
import time
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

from app import views


class ServeError(ValueError):
    """A serving option that cannot be used as given; the message says why and what to do."""


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def parse_auth(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ServeError("credentials must look like user:password (both parts non-empty)")
    return user, password


def resolve_auth(host: str, flag: str | None, env: dict[str, str] | None = None) -> tuple[str, str] | None:
    """Credentials to serve with; refuses a non-loopback address without them."""
    env = os.environ if env is None else env
    auth = parse_auth(flag or env.get("COMPRL_AUTH"))
    if auth is None and not is_loopback(host):
        raise ServeError(f"refusing to serve on {host} without credentials, since anyone who reaches it could edit the "
                         "library and start runs; pass --auth user:password or set COMPRL_AUTH")
    return auth


# -- what an unauthenticated visitor may see ----------------------------------------------------------------
#
# Gradio (6.x) renders its login page from the same template as the app, with `window.gradio_api_info`:
# every endpoint, its parameters and example values taken from the store. And it checks passwords as fast
# as they come. AuthGate sits in front of Gradio's own app (an ASGI middleware given to its FastAPI app) and
# fixes both, without touching Gradio's code: a visitor who is not logged in gets the login page with the API
# description emptied, and a client that keeps failing to log in is refused for a while.

LOGIN_FAILURES = 5  # failed logins allowed per client per window
LOGIN_WINDOW_S = 60.0  # the window, and how long a client that used them up waits
_API_INFO = re.compile(rb"window\.gradio_api_info\s*=\s*.*?;</script>", re.S)


class LoginLimiter:
    """Failed logins per client address in a sliding window (thread-safe; in memory: one server process)."""

    def __init__(self, failures: int = LOGIN_FAILURES, window_s: float = LOGIN_WINDOW_S):
        self.failures, self.window_s = failures, window_s
        self._fails: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def wait_s(self, client: str, now: float | None = None) -> float:
        """0 when `client` may try now, else the seconds until it may."""
        now = time.monotonic() if now is None else now
        with self._lock:
            recent = [t for t in self._fails.get(client, []) if now - t < self.window_s]
            self._fails[client] = recent
            return 0.0 if len(recent) < self.failures else self.window_s - (now - recent[0])

    def failed(self, client: str, now: float | None = None) -> None:
        with self._lock:
            self._fails.setdefault(client, []).append(time.monotonic() if now is None else now)
            if len(self._fails) > 10_000:  # a flood of addresses must not grow memory without bound
                self._fails = dict(list(self._fails.items())[-5_000:])

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._fails.pop(client, None)


class AuthGate:
    """ASGI middleware for Gradio's app; does nothing when the app has no auth."""

    def __init__(self, app: Any, limiter: LoginLimiter | None = None):
        self.app = app
        self.limiter = limiter or LoginLimiter()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        gradio_app = scope.get("app")
        if scope["type"] != "http" or getattr(gradio_app, "auth", None) is None:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "").rstrip("/")
        if scope["method"] == "POST" and path.endswith("/login"):
            await self._login(scope, receive, send)
        elif scope["method"] in ("GET", "HEAD") and not self._logged_in(scope, gradio_app):
            # Every page Gradio renders from its template (/, /gradio_api/runs, ...) embeds the API description.
            await self._login_page(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    @staticmethod
    def _logged_in(scope: dict, gradio_app: Any) -> bool:
        cookies = SimpleCookie()
        for name, value in scope.get("headers", []):
            if name == b"cookie":
                try:
                    cookies.load(value.decode("latin-1"))
                except Exception:  # noqa: BLE001 - a malformed cookie header is "not logged in"
                    return False
        tokens = getattr(gradio_app, "tokens", {})
        cid = getattr(gradio_app, "cookie_id", "")
        return any(cookies.get(f"{prefix}-{cid}") is not None and cookies[f"{prefix}-{cid}"].value in tokens
                   for prefix in ("access-token", "access-token-unsecure"))

    async def _login(self, scope: dict, receive: Any, send: Any) -> None:
        client = (scope.get("client") or ("?", 0))[0]
        wait = self.limiter.wait_s(client)
        if wait > 0:
            body = json.dumps({"detail": f"too many failed logins; try again in {wait:.0f} s"}).encode()
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", str(int(wait) + 1).encode()),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        status: list[int] = []

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await self.app(scope, receive, watch)
        if status and status[0] == 200:
            self.limiter.succeeded(client)
        elif status and status[0] in (400, 401, 403):
            self.limiter.failed(client)

    async def _login_page(self, scope: dict, receive: Any, send: Any) -> None:
        start: dict = {}
        chunks: list[bytes] = []
        html: list[bool] = []

        async def hold(message: dict) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                ctype = dict((k.lower(), v) for k, v in message.get("headers", [])).get(b"content-type", b"")
                html.append(ctype.startswith(b"text/html"))
                if not html[0]:
                    await send(message)  # scripts, styles, fonts: nothing of this app's, passed as they come
            elif message["type"] == "http.response.body" and not html[0]:
                await send(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    body = _API_INFO.sub(b"window.gradio_api_info = null;</script>", b"".join(chunks))
                    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                    headers.append((b"content-length", str(len(body)).encode()))
                    await send({**start, "headers": headers})
                    await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})
            else:
                await send(message)

        await self.app(scope, receive, hold)


def watch_build(data_dir: str | os.PathLike[str], interval_s: float = 2.0, stop: threading.Event | None = None,
                out: Any = None) -> threading.Thread:
    """Tell this terminal how a model build under `data_dir` goes (whoever builds: the demo run, an A/B test, the
    policy demo): a line when it starts, at each stage and every tenth of the way, and when it ends. Nothing is
    printed when no build runs."""
    import sys

    from core import build_progress

    out = out or sys.stdout

    def loop() -> None:
        last: tuple | None = None
        while not (stop.wait(interval_s) if stop is not None else time.sleep(interval_s)):
            p = build_progress.read_progress(data_dir)
            if p is None:
                continue
            total = max(1, int(p.get("total") or 1))
            key = (p.get("pid"), p.get("started_at"), p.get("state"), p.get("stage"), int(10 * int(p.get("done") or 0) / total))
            if key == last:
                continue
            if last is None and p.get("state") != "building":
                last = key  # an old build's file: nothing new to tell
                continue
            last = key
            line = build_progress.describe(p)
            if p.get("state") == "done":
                line += "; the first curve points come with the first training step (Live curves)"
            print(f"[models] {line}", file=out, flush=True)

    t = threading.Thread(target=loop, name="build-watch", daemon=True)
    t.start()
    return t


def serve(*, host: str = "127.0.0.1", port: int = 7860, data_dir: str, db_url: str | None = None, demo: bool = False,
          auth: str | None = None, upload_cap_mb: float = 20.0, demo_actor: dict | None = None) -> None:
    credentials = resolve_auth(host, auth)
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported
    from starlette.middleware import Middleware

    from app.service import Workbench
    from app.ui import build

    from app.service.runs import serve_below_runs

    nice = serve_below_runs()  # runs and A/B tests fork from a launcher thread at the priority we started with
    wb = Workbench(data_dir, db_url, upload_cap_mb=upload_cap_mb, demo_actor=demo_actor)
    if demo:
        print(f"demo: {wb.start_demo_run()}", flush=True)
    watch_build(wb.data_dir)
    wb.warm_up()
    blocks = build(wb)
    blocks.queue(default_concurrency_limit=4)
    print(f"workbench: data {wb.data_dir}, store {wb.db_url.split('@')[-1]}, serving at nice {nice} "
          "(runs it starts keep the priority it was started with; COMPRL_APP_NICE)", flush=True)
    try:
        blocks.launch(server_name=host, server_port=port, auth=credentials, share=False, inbrowser=False,
                      max_file_size=wb.upload_cap_bytes, allowed_paths=[str(Path(wb.data_dir) / "exports")],
                      ssr_mode=False, enable_monitoring=False, mcp_server=False, show_error=False, css=views.CSS,
                      footer_links=[], quiet=False, app_kwargs={"middleware": [Middleware(AuthGate)]})
    finally:
        wb.close()

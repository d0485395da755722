"""Serve the workbench: `comprl app` ends here.

Loopback by default. Any other address needs credentials (`--auth user:password` or COMPRL_AUTH),
because whoever reaches the page can edit the library and start processes. No share links, no
analytics, no server-side rendering process.
"""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path

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


def serve(*, host: str = "127.0.0.1", port: int = 7860, data_dir: str, db_url: str | None = None, demo: bool = False,
          auth: str | None = None, upload_cap_mb: float = 20.0) -> None:
    credentials = resolve_auth(host, auth)
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported
    from app.service import Workbench
    from app.ui import build

    wb = Workbench(data_dir, db_url, upload_cap_mb=upload_cap_mb)
    if demo:
        print(f"demo: {wb.start_demo_run()}", flush=True)
    wb.warm_up()
    blocks = build(wb)
    blocks.queue(default_concurrency_limit=4)
    print(f"workbench: data {wb.data_dir}, store {wb.db_url.split('@')[-1]}", flush=True)
    try:
        blocks.launch(server_name=host, server_port=port, auth=credentials, share=False, inbrowser=False,
                      max_file_size=wb.upload_cap_bytes, allowed_paths=[str(Path(wb.data_dir) / "exports")],
                      ssr_mode=False, enable_monitoring=False, mcp_server=False, show_error=False, css=views.CSS,
                      footer_links=[], quiet=False)
    finally:
        wb.close()

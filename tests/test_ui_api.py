"""app/ui.py's API: every event a script may call has a stable name; nothing public is a numbered lambda.

Built from the real Blocks on a real (empty) workbench, without a browser or a server: the names are what
`gradio_client.Client(...).view_api()` lists and docs/workbench.md ("Scripting the workbench") documents.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

# Changing this list changes the API scripts call: update docs/workbench.md's table with it.
ENDPOINTS = [
    "ab_details", "ab_log", "ab_tests", "accept_merge", "archive_entry", "create_ab_test", "create_entry", "curves",
    "curves_csv", "demo_start", "demo_step", "diff_versions", "duplicate_clusters", "edit_entry", "episodes",
    "export_library", "fork_run", "import_library", "launch_run", "library_page", "merge_preview", "open_entry",
    "pause_run", "propose_merge", "replay", "restore_entry", "resume_checkpoint", "resume_run", "revert_entry",
    "run_details", "run_log", "runs_table", "semantic_search", "shipped_config", "source_episode", "stop_run",
    "undo_merge", "validate_config",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from app.service import Workbench
    from app.ui import build

    wb = Workbench(tmp_path_factory.mktemp("ui-api") / "data")
    demo = build(wb)
    yield wb, demo
    wb.close()


def test_named_endpoints_are_pinned_and_none_is_a_lambda(built):
    _, demo = built
    info = demo.get_api_info()
    names = sorted(n.lstrip("/") for n in info["named_endpoints"])
    assert names == ENDPOINTS
    assert not info["unnamed_endpoints"]
    assert not [n for n in names if n.startswith("lambda")]
    # Every other event is private on purpose (named "internal", or a js-only one), none by forgetting: a new event
    # gets an api_name or PRIVATE.
    public = set(ENDPOINTS)
    stray = [fn.api_name for fn in demo.fns.values()
             if fn.api_name not in public and not (fn.api_visibility == "private"
                                                   and (fn.api_name.startswith("internal") or fn.fn is None))]
    assert not stray


def test_endpoints_take_named_parameters(built):
    """A script passes arguments by name: the service's own parameter names, never `args`."""
    _, demo = built
    eps = demo.get_api_info()["named_endpoints"]
    params = {n.lstrip("/"): [p["parameter_name"] for p in ep["parameters"]] for n, ep in eps.items()}
    assert params["semantic_search"] == ["query", "env", "k"]
    assert params["library_page"] == ["env", "source", "status", "text", "sort", "descending", "page", "page_size"]
    assert params["edit_entry"] == ["entry_id", "text", "loaded_version"]
    assert params["demo_step"] == []  # the session's token is gradio State, kept per client session
    assert all(p and not p.startswith("param") for ps in params.values() for p in ps)


def test_heavy_endpoints_have_their_own_concurrency(built):
    wb, demo = built
    groups: dict[str, set] = {}
    for fn in demo.fns.values():
        if fn.fn == wb.library_page or fn.api_name == "library_page":
            groups.setdefault("library_page", set()).add((fn.concurrency_id, fn.concurrency_limit))
        if fn.fn == wb.semantic_search:
            groups.setdefault("semantic_search", set()).add((fn.concurrency_id, fn.concurrency_limit))
    # All nine triggers of the library page (filters, buttons, the page's first paint shares it too) share one group.
    assert groups["library_page"] == {("library_page", 2)}
    assert groups["semantic_search"] == {("search", 2)}
    by_name = {fn.api_name: fn for fn in demo.fns.values()}
    assert by_name["duplicate_clusters"].concurrency_id == "search"
    assert (by_name["create_ab_test"].concurrency_id, by_name["create_ab_test"].concurrency_limit) == ("create_ab_test", 1)
    assert by_name["import_library"].concurrency_limit == 1
    first_paint = [fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", "") == "first_paint"]
    assert [(fn.concurrency_id, fn.concurrency_limit) for fn in first_paint] == [("library_page", 2)]


def test_demo_start_keeps_its_parameters_and_adds_the_recurring_task_at_the_end(built):
    """Issue 39: the demo plays a recurring task (its id, the run's turn limit); a script that passes the six old
    arguments still works: the new ones come last, with defaults."""
    _, demo = built
    ep = demo.get_api_info()["named_endpoints"]["/demo_start"]
    names = [p["parameter_name"] for p in ep["parameters"]]
    assert names == ["mode", "env_name", "seed", "checkpoint", "library", "task_ids", "max_turns", "constrain_actions"]
    assert all(p["parameter_has_default"] for p in ep["parameters"][-3:])  # issue 38: constrained replies, last too

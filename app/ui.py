"""The Gradio Blocks of the workbench: layout and wiring only (DESIGN.md habit 7).

Every callback is one line into `app.service.Workbench`; the few helpers here only translate
between service values and Gradio updates (a `None` figure becomes `gr.skip()`, a dict of entry
fields becomes the panel's outputs). Element ids (`elem_id`) are stable: the browser tests and the
screenshot script find components by them.
"""
from __future__ import annotations

from typing import Any

import gradio as gr
from gradio.components.plot import PlotData

from app import views
from app.service import ARM_KINDS, Workbench
from app.service.common import task_id_label
from core.store import SORTABLE

# The A/B tab opens on the newest run with recurring tasks (Workbench.ab_defaults: its env, task ids and turn limit, on
# MiniHack's dungeons or ALFWorld's households alike); with none, on the default run's recurring dark rooms, where a
# library holds each dungeon's lessons:
AB_ENV = "minihack/Room-Ultimate-5x5"
AB_MAX_TURNS = 8  # and its turn limit (configs/minihack_room_cpu.yaml env.max_turns), which the library was written under
# Each of the 16 dungeons played 16 times per arm at the rollout temperature (the policy GRPO trains), the k-th episode
# of a dungeon paired across the arms: 16 greedy pairs are too few to tell a real difference from chance. On the demo's
# library after 20 steps: greedy x1 +0.125, p = 0.69; sampled x8 +0.10, p = 0.037; x16 +0.125, p = 1.4e-4, ~3.5 minutes
# (docs/results.md, fifteenth round).
AB_DECODING, AB_EPISODES_PER_TASK = "sampled", 16

FOLLOW_END_JS = """() => { setTimeout(() => { const t = document.querySelector('#BOX textarea');
  if (t) t.scrollTop = t.scrollHeight; }, 60); }"""
CURVE_REFRESH_S = 1.0
TABLE_REFRESH_S = 2.0
PLAY_INTERVAL_S = 0.4


def _id_box(label: str, elem_id: str, **kw: Any) -> gr.Textbox:
    """An id typed or filled in by a click: empty until then (a number box would show 0, an id nothing has)."""
    return gr.Textbox(label=label, elem_id=elem_id, lines=1, max_lines=1, placeholder="empty", **kw)


def _plot(fig_json: str | None) -> Any:
    return gr.skip() if fig_json is None else PlotData(type="plotly", plot=fig_json)


def _curves_out(result: tuple[str, list[str | None], str]) -> tuple:
    token, figs, status = result
    return (token, status, *[_plot(f) for f in figs])


def _choices(new: list[tuple[str, int]], old: list | None) -> tuple:
    """Update a dropdown's choices only when they changed (an open menu is not disturbed every tick)."""
    new = [list(c) for c in new]
    if new == old:
        return gr.skip(), old
    return gr.update(choices=[tuple(c) for c in new]), new


def _entry_out(d: dict[str, Any], with_text: bool) -> tuple:
    if d.get("error"):
        n = 12 if with_text else 10
        return (d["error"], *[gr.skip()] * (n - 1))
    versions = d["versions"]
    vdrop = gr.update(choices=versions, value=versions[-1])
    vfrom = gr.update(choices=versions, value=versions[-2] if len(versions) > 1 else versions[-1])
    head = (f"entry #{d['id']} loaded at version {d['version']} ({d['status']})", d["meta"])
    tail = (d["lineage"], d["usage"], d["history"], vfrom, vdrop, gr.update(choices=versions, value=versions[0]),
            d["usage_note"], gr.update(visible=d["source_episode"] is not None, value=f"Replay the source episode #{d['source_episode']}"
                                       if d["source_episode"] is not None else "Replay the source episode"))
    if with_text:
        return (*head, d["text"], d["version"], *tail)
    return (*head, *tail)


def _row_first_cell(evt: gr.SelectData) -> Any:
    row = evt.row_value
    return row[0] if row else gr.skip()


def _play_tick(result: tuple[str, str, bool]) -> tuple:
    html_, status, done = result
    return html_, status, gr.Timer(active=not done)


def build(wb: Workbench) -> gr.Blocks:
    envs = wb.envs()
    facets = wb.library_facets()
    with gr.Blocks(title="Complementary RL workbench", analytics_enabled=False) as demo:
        header = gr.Markdown(wb.overview_md(), elem_id="overview")
        html_js = views.STEPPER_JS
        table_timer = gr.Timer(TABLE_REFRESH_S)
        with gr.Tabs():
            # ---------------------------------------------------------------- Runs
            with gr.Tab("Runs", id="runs", elem_id="tab-runs"):
                build_runs = gr.HTML(wb.build_html(), elem_id="build-progress-runs")
                runs_df = gr.Dataframe(value=wb.runs_table(), interactive=False, elem_id="runs-table",
                                       label="runs (click one for its details)", column_widths=views.RUN_COLUMN_WIDTHS,
                                       max_height=320, wrap=False)
                run_details = gr.Markdown(elem_id="run-details")
                with gr.Row():
                    run_id = _id_box("run id", "run-id", scale=1)
                    pause_btn = gr.Button("Pause", elem_id="run-pause", scale=1)
                    resume_btn = gr.Button("Resume", elem_id="run-resume", scale=1)
                    stop_btn = gr.Button("Stop", elem_id="run-stop", variant="stop", scale=1)
                    fork_steps = gr.Number(label="resume / fork: max steps (0: the config's)", precision=0, scale=1,
                                           elem_id="fork-steps")
                    fork_btn = gr.Button("Resume from checkpoint", elem_id="run-resume-ckpt", scale=1)
                    fork_new_btn = gr.Button("Fork into a new run", elem_id="run-fork", scale=1)
                run_msg = gr.Markdown(elem_id="run-msg")
                run_log = gr.Textbox(label="log tail", lines=12, max_lines=12, elem_id="run-log", autoscroll=True,
                                     interactive=False)
                with gr.Accordion("Launch a run", open=True):
                    with gr.Row():
                        cfg_choice = gr.Dropdown(choices=wb.shipped_configs(), label="shipped config", elem_id="config-choice",
                                                 value=None, scale=2)
                        launch_steps = gr.Number(label="max steps (0: the config's)", precision=0, elem_id="launch-steps",
                                                 scale=1)
                    with gr.Row():
                        cfg_editor = gr.Code(language="yaml", lines=18, max_lines=30, interactive=True,
                                             label="config (YAML; edit freely, it is checked before launch)",
                                             elem_id="config-editor", scale=3)
                        with gr.Column(scale=2):
                            cfg_msg = gr.Markdown(elem_id="config-msg")
                            validate_btn = gr.Button("Check config", elem_id="config-check")
                            launch_btn = gr.Button("Launch", variant="primary", elem_id="config-launch")
                            launch_log = gr.Textbox(label="newest launched process", lines=8, max_lines=8,
                                                    interactive=False, elem_id="launch-log")

            # ---------------------------------------------------------------- Live curves
            with gr.Tab("Live curves", id="curves", elem_id="tab-curves"):
                curve_token = gr.State(None)
                curve_choices = gr.State(None)
                with gr.Row():
                    curve_runs = gr.Dropdown(choices=wb.run_choices(), multiselect=True, label="runs (overlaid)",
                                             elem_id="curve-runs", scale=3)
                    smoothing = gr.Slider(0.0, 0.99, value=0.6, step=0.01, label="smoothing (EMA; raw series faint behind)",
                                          elem_id="curve-smoothing", scale=2)
                    x_axis = gr.Radio(["step", "time"], value="step", label="x axis", elem_id="curve-xaxis", scale=1)
                build_curves = gr.HTML(wb.build_html(), elem_id="build-progress-curves")
                curve_status = gr.Markdown(elem_id="curve-status")
                plots = []
                panels = list(views.PANELS)
                for i in range(0, len(panels), 2):
                    with gr.Row():
                        for p in panels[i:i + 2]:
                            plots.append(gr.Plot(elem_id=f"curve-{p.id}", show_label=False))
                with gr.Accordion("Export the points of a panel as CSV", open=False, elem_id="curve-csv-box"):
                    with gr.Row():
                        csv_panel = gr.Dropdown(choices=[("every panel", "all")] + [(p.title, p.id) for p in views.PANELS],
                                                value="all", label="panel", elem_id="curve-csv-panel", scale=3)
                        csv_btn = gr.Button("Export CSV", elem_id="curve-csv-btn", scale=1)
                    csv_msg = gr.Markdown(elem_id="curve-csv-msg")
                    csv_file = gr.File(label="CSV (run, key, step, time, value)", interactive=False, elem_id="curve-csv-file",
                                       height=80)
                curve_timer = gr.Timer(CURVE_REFRESH_S)

            # ---------------------------------------------------------------- Library
            with gr.Tab("Library", id="library", elem_id="tab-library"):
                with gr.Row():
                    f_env = gr.Dropdown(choices=[""] + facets["env"], value="", label="env", allow_custom_value=True,
                                        elem_id="lib-env", scale=2)
                    f_source = gr.Dropdown(choices=["", "extracted", "merged", "manual", "imported"], value="",
                                           label="source", elem_id="lib-source", scale=1)
                    f_status = gr.Dropdown(choices=["active", "archived", "all"], value="active", label="status",
                                           elem_id="lib-status", scale=1)
                    f_text = gr.Textbox(label="text filter (entry text or task)", elem_id="lib-text", scale=2)
                    f_sort = gr.Dropdown(choices=sorted(SORTABLE), value="id", label="sort by", elem_id="lib-sort", scale=1)
                    f_desc = gr.Checkbox(label="descending", value=False, elem_id="lib-desc", scale=1)
                with gr.Row():
                    prev_btn = gr.Button("◀ previous", elem_id="lib-prev", scale=1)
                    f_page = gr.Number(value=1, precision=0, label="page", elem_id="lib-page", scale=1)
                    next_btn = gr.Button("next ▶", elem_id="lib-next", scale=1)
                    f_size = gr.Dropdown(choices=[25, 50, 100, 200], value=50, label="page size", elem_id="lib-size", scale=1)
                    refresh_btn = gr.Button("Refresh", elem_id="lib-refresh", scale=1)
                    page_md = gr.Markdown(elem_id="lib-pageinfo")
                first_df, first_info = wb.library_page()
                lib_df = gr.Dataframe(value=first_df, interactive=False, elem_id="library-table", max_height=420, wrap=True,
                                      label="entries (click a row to open it)", column_widths=views.ENTRY_COLUMN_WIDTHS)
                with gr.Row():
                    q_text = gr.Textbox(label="semantic search (the actor's embedder and index)", elem_id="lib-search", scale=4)
                    q_k = gr.Number(value=20, precision=0, label="results", scale=1)
                    q_btn = gr.Button("Search", elem_id="lib-search-btn", scale=1)
                q_md = gr.Markdown()
                q_df = gr.Dataframe(value=views.entries_table([], scores=[]), interactive=False, elem_id="search-table", max_height=300, wrap=True,
                                    label="search results (click a row to open it)")

                gr.Markdown("### Entry")
                with gr.Row():
                    e_id = _id_box("entry id", "entry-id", scale=1)
                    e_open = gr.Button("Open", elem_id="entry-open", scale=1)
                    e_version = gr.Number(label="editing version", precision=0, interactive=False, elem_id="entry-version",
                                          scale=1)
                    e_loaded = gr.Markdown(elem_id="entry-loaded")
                e_meta = gr.Markdown(elem_id="entry-meta")
                with gr.Row():
                    with gr.Column(scale=3):
                        e_text = gr.Textbox(label="text", lines=10, max_lines=30, elem_id="entry-text", interactive=True)
                        with gr.Row():
                            e_save = gr.Button("Save edit", variant="primary", elem_id="entry-save")
                            e_archive = gr.Button("Archive", elem_id="entry-archive")
                            e_restore = gr.Button("Restore", elem_id="entry-restore")
                            e_to_merge = gr.Button("Add to merge selection", elem_id="entry-to-merge")
                        e_msg = gr.Markdown(elem_id="entry-msg")
                    with gr.Column(scale=2):
                        e_lineage = gr.Markdown(elem_id="entry-lineage")
                        e_usage_note = gr.Markdown(elem_id="entry-usage-note")
                        e_usage = gr.Dataframe(value=views.usage_table([]), interactive=False, label="retrieved by (episodes and outcomes)",
                                               elem_id="entry-usage", max_height=220)
                        e_src_btn = gr.Button("Replay the source episode", elem_id="entry-source-btn", visible=False, size="sm")
                e_src_html = gr.HTML(elem_id="entry-source-episode", js_on_load=html_js)
                e_history = gr.Dataframe(value=views.history_table([]), interactive=False, label="version history", elem_id="entry-history", max_height=260)
                with gr.Row():
                    v_from = gr.Dropdown(label="diff from version", choices=[], elem_id="diff-from", scale=1)
                    v_to = gr.Dropdown(label="to version", choices=[], elem_id="diff-to", scale=1)
                    diff_btn = gr.Button("Diff", elem_id="diff-btn", scale=1)
                    v_revert = gr.Dropdown(label="revert to version", choices=[], elem_id="revert-version", scale=1)
                    revert_btn = gr.Button("Revert", elem_id="revert-btn", scale=1)
                diff_html = gr.HTML(elem_id="diff-view")

                with gr.Accordion("Create an entry by hand", open=False):
                    with gr.Row():
                        c_title = gr.Textbox(label="title", elem_id="new-title")
                        c_env = gr.Dropdown(choices=[""] + envs, value="", label="env", allow_custom_value=True,
                                            elem_id="new-env")
                    c_desc = gr.Textbox(label="description (when it applies)", elem_id="new-desc")
                    c_content = gr.Textbox(label="content (what to do)", lines=4, elem_id="new-content")
                    c_task = gr.Textbox(label="task text it is keyed by (the retrieval query; empty: none)", elem_id="new-task")
                    c_btn = gr.Button("Create", elem_id="new-create")
                    c_msg = gr.Markdown(elem_id="new-msg")

                with gr.Accordion("Merge entries", open=False, elem_id="merge-box"):
                    with gr.Row():
                        m_ids = gr.Textbox(label="entry ids to merge (comma separated)", elem_id="merge-ids", scale=3)
                        m_propose = gr.Button("Propose merged text", elem_id="merge-propose", scale=1)
                    m_note = gr.Markdown(elem_id="merge-note")
                    m_text = gr.Textbox(label="merged text", lines=8, elem_id="merge-text")
                    with gr.Row():
                        m_preview = gr.Button("Preview diff", elem_id="merge-preview")
                        m_accept = gr.Button("Accept merge", variant="primary", elem_id="merge-accept")
                    m_msg = gr.Markdown(elem_id="merge-msg")
                    m_diff = gr.HTML(elem_id="merge-diff")
                    with gr.Row():
                        m_undo_id = _id_box("merged entry id", "merge-undo-id")
                        m_undo = gr.Button("Undo merge", elem_id="merge-undo")
                    gr.Markdown("**Near-duplicate review queue** (clusters of entries whose texts are nearly the same; "
                                "click a cluster to put its ids in the merge box)")
                    with gr.Row():
                        d_threshold = gr.Slider(0.5, 1.0, value=0.9, step=0.01, label="cosine threshold", elem_id="dup-threshold")
                        d_across = gr.Checkbox(label="across tasks", value=False)
                        d_btn = gr.Button("Find near-duplicates", elem_id="dup-find")
                    d_msg = gr.Markdown(elem_id="dup-msg")
                    d_df = gr.Dataframe(value=views.clusters_table([], {}), interactive=False, elem_id="dup-table", max_height=300, wrap=True)

                with gr.Accordion("Import / export (JSONL)", open=False, elem_id="io-box"):
                    with gr.Row():
                        i_file = gr.File(label=f"library file to import (≤ {views.fmt_bytes(wb.upload_cap_bytes)})",
                                         file_types=[".jsonl", ".json", ".txt"], elem_id="import-file")
                        with gr.Column():
                            i_fresh = gr.Checkbox(label="give imported entries fresh ids", value=True, elem_id="import-fresh")
                            i_btn = gr.Button("Import (all lines or none)", elem_id="import-btn")
                            i_msg = gr.Markdown(elem_id="import-msg")
                    with gr.Row():
                        x_status = gr.Dropdown(choices=["all", "active", "archived"], value="all", label="export entries")
                        x_btn = gr.Button("Export", elem_id="export-btn")
                        x_file = gr.File(label="exported file", interactive=False, elem_id="export-file")
                        x_msg = gr.Markdown(elem_id="export-msg")

            # ---------------------------------------------------------------- A/B tests
            with gr.Tab("A/B tests", id="ab", elem_id="tab-ab"):
                ad = wb.ab_defaults()  # set again on a page's first paint when a newer recurring run changed them
                if ad["env"] is None and AB_ENV in envs:
                    ad.update(env=AB_ENV, task_ids=True, max_turns=AB_MAX_TURNS)
                ab_note = gr.Markdown(ad["note"], elem_id="ab-defaults")
                with gr.Row():
                    ab_name = gr.Textbox(label="name", elem_id="ab-name")
                    ab_env = gr.Dropdown(choices=envs, value=ad["env"], label="env", elem_id="ab-env")
                    ab_seeds = gr.Textbox(label="task ids (or seeds)", value=ad["seeds"], elem_id="ab-seeds")
                    ab_task_ids = gr.Checkbox(label=task_id_label(ad["env"], plural=True), value=ad["task_ids"],
                                              elem_id="ab-task-ids")
                    ab_ckpt = gr.Textbox(label="policy checkpoint folder (empty: default policy)", elem_id="ab-ckpt")
                    ab_turns = gr.Number(value=ad["max_turns"], label="max turns (0: the env's)", precision=0,
                                         elem_id="ab-turns")
                    ab_decoding = gr.Radio(["greedy", "sampled"], value=AB_DECODING, label="decoding (sampled: the rollout temperature)",
                                           elem_id="ab-decoding")
                    ab_reps = gr.Number(value=AB_EPISODES_PER_TASK, label="episodes per task (sampled; paired across arms)",
                                        precision=0, elem_id="ab-reps")
                    ab_constrain = gr.Checkbox(label="policy: admissible actions only", value=ad.get("constrain_actions", False),
                                               elem_id="ab-constrain")
                with gr.Row():
                    with gr.Column():
                        a_kind = gr.Radio(list(ARM_KINDS), value="current", label="arm A library", elem_id="ab-a-kind")
                        a_arg = gr.Textbox(label="A: version number, or entry ids for minus/plus", elem_id="ab-a-arg")
                        a_file = gr.File(label="A: library file (kind 'file')", file_types=[".jsonl"], elem_id="ab-a-file")
                    with gr.Column():
                        b_kind = gr.Radio(list(ARM_KINDS), value="none", label="arm B library", elem_id="ab-b-kind")
                        b_arg = gr.Textbox(label="B: version number, or entry ids for minus/plus", elem_id="ab-b-arg")
                        b_file = gr.File(label="B: library file (kind 'file')", file_types=[".jsonl"], elem_id="ab-b-file")
                ab_create = gr.Button("Run A/B test", variant="primary", elem_id="ab-create")
                ab_msg = gr.Markdown(elem_id="ab-msg")
                ab_df = gr.Dataframe(value=wb.ab_tests_table(), interactive=False, elem_id="ab-table", max_height=260,
                                     label="A/B tests (click one to open it)")
                with gr.Row():
                    ab_id = _id_box("A/B test id", "ab-id")
                    ab_open = gr.Button("Open", elem_id="ab-open")
                ab_progress = gr.HTML(elem_id="ab-progress")
                ab_summary = gr.Markdown(elem_id="ab-summary")
                ab_results = gr.Dataframe(value=views.ab_results_table({}), interactive=False,
                                          label="success per arm (Wilson 95% intervals; the paired test is in the summary above)",
                                          elem_id="ab-results")
                ab_tasks = gr.Dataframe(value=views.ab_per_task_table({}), interactive=False, label="per task", elem_id="ab-tasks", max_height=260)
                ab_eps = gr.Dataframe(value=views.episodes_table([]), interactive=False, label="episodes (click one to replay it)", elem_id="ab-episodes",
                                      max_height=260)
                ab_episode = gr.HTML(elem_id="ab-episode", js_on_load=html_js)
                ab_log = gr.Textbox(label="evaluation log", lines=6, max_lines=6, interactive=False, elem_id="ab-log")

            # ---------------------------------------------------------------- Agent demo
            with gr.Tab("Agent demo", id="demo", elem_id="tab-demo"):
                gr.Markdown(wb.policy_status(), elem_id="demo-policy-status")
                # Opens on the newest run's env and one of its recurring tasks that the library holds an entry for,
                # played by its policy (Workbench.demo_defaults; set again on each page's first paint).
                dd = wb.demo_defaults()
                d_note = gr.Markdown(dd["note"], elem_id="demo-defaults")
                demo_token = gr.State(None)
                with gr.Row():
                    d_mode = gr.Radio([("scripted expert", "expert"), ("policy", "policy")], value=dd["mode"], label="who plays",
                                      elem_id="demo-mode")
                    d_env = gr.Dropdown(choices=envs, value=dd["env"] or None, label="env", elem_id="demo-env")
                    d_seed = gr.Number(value=dd["seed"], precision=0, label="task id, or seed", elem_id="demo-seed")
                    d_task_ids = gr.Checkbox(label=task_id_label(dd["env"]), value=dd["task_ids"], elem_id="demo-task-ids")
                    d_turns = gr.Number(value=dd["max_turns"], precision=0, label="max turns (0: the env's)", elem_id="demo-turns")
                    d_ckpt = gr.Textbox(value=dd["checkpoint"],
                                        label="policy checkpoint or model folder (empty: the embedded default, built on first use)",
                                        elem_id="demo-ckpt")
                    with gr.Column(min_width=160):
                        d_lib = gr.Radio(["current", "none"], value=dd["library"], label="library", elem_id="demo-lib")
                        # as a run with rollout.constrain_actions plays (ALFWorld's recurring config): opens as the run's
                        d_constrain = gr.Checkbox(label="policy: admissible actions only", value=dd["constrain_actions"],
                                                  elem_id="demo-constrain")
                with gr.Row():
                    d_start = gr.Button("Start", variant="primary", elem_id="demo-start")
                    d_step = gr.Button("Step", elem_id="demo-step")
                    d_play = gr.Button("Play", elem_id="demo-play")
                    d_pause = gr.Button("Pause", elem_id="demo-pause")
                d_status = gr.Markdown(elem_id="demo-status")
                d_html = gr.HTML(views.live_episode_html([]), elem_id="demo-episode", js_on_load=html_js)
                play_timer = gr.Timer(PLAY_INTERVAL_S, active=False)
                with gr.Accordion("Replay a stored episode", open=False, elem_id="replay-box"):
                    with gr.Row():
                        r_run = _id_box("run id (empty: any)", "replay-run")
                        r_ab = _id_box("A/B test id (empty: any)", "replay-ab")
                        r_list = gr.Button("List episodes", elem_id="replay-list")
                    r_df = gr.Dataframe(value=views.episodes_table([]), interactive=False, elem_id="replay-table", max_height=260,
                                        label="episodes (click one to replay it)")
                    with gr.Row():
                        r_id = _id_box("episode id", "replay-id")
                        r_btn = gr.Button("Replay", elem_id="replay-btn")
                    r_html = gr.HTML(elem_id="replay-episode", js_on_load=html_js)

        # ======================================================================== wiring
        # Every event a script may call has an `api_name`: the app's API page and gradio_client list those (the table
        # in docs/workbench.md, "Scripting the workbench"; tests/test_ui_api.py pins the list). The rest are PRIVATE:
        # timers that repaint, `.then` steps that move a value between components, page arithmetic, play/pause, and
        # every further trigger of an endpoint that already has its name (Gradio would number a repeated name).
        hidden = "hidden"
        # (Named too, "internal", "internal_1" ...: unnamed, each would take its function's name and push an endpoint's
        # own name to "curves_1".)
        PRIVATE = dict(api_visibility="private", api_name="internal")
        # Concurrency on purpose for the heavy endpoints (each event otherwise gets the queue's default of 4, each on
        # its own). A search (and the near-duplicate queue) goes through the service's search lock, one at a time: its
        # sync embeds entries and changes the index (Workbench.searching). The library page's verdicts play levels in
        # real envs under the env lock (app/service/common.py ENV_LOCK). More than two of either in flight would only
        # hold Gradio worker threads waiting on a lock; the rest wait in the queue, where the page shows their place.
        # One group per endpoint, so the nine triggers of the library page (and the first paint) share its two slots.
        LIB = dict(concurrency_id="library_page", concurrency_limit=2)
        SEARCH = dict(concurrency_id="search", concurrency_limit=2)
        # An A/B test writes its arms' library files and starts an evaluator process that plays hundreds of episodes,
        # and an import writes up to the upload cap in one transaction (SQLite has one writer): one at a time each.
        # A demo start may load a policy model: two at once at most.
        AB_CREATE = dict(concurrency_id="create_ab_test", concurrency_limit=1)
        IMPORT = dict(concurrency_id="import_library", concurrency_limit=1)
        DEMO_START = dict(concurrency_id="demo_start", concurrency_limit=2)

        # Runs
        table_timer.tick(wb.runs_table, outputs=runs_df, show_progress=hidden, api_name="runs_table")
        table_timer.tick(wb.overview_md, outputs=header, show_progress=hidden, **PRIVATE)
        table_timer.tick(lambda: (wb.build_html(),) * 2, outputs=[build_runs, build_curves], show_progress=hidden, **PRIVATE)
        table_timer.tick(lambda rid: wb.run_details(rid or wb.live_run_id()) if rid or wb.live_run_id() else gr.skip(),
                         inputs=run_id, outputs=run_details, show_progress=hidden, **PRIVATE)
        # With no run chosen, the log and details of the running run (a new user's first run) are shown.
        table_timer.tick(lambda rid: wb.log_tail(rid) if rid else (wb.log_tail(live) if (live := wb.live_run_id()) else gr.skip()),
                         inputs=run_id, outputs=run_log, show_progress=hidden, **PRIVATE)
        table_timer.tick(wb.launch_log_tail, outputs=launch_log, show_progress=hidden, **PRIVATE)
        runs_df.select(_row_first_cell, outputs=run_id, **PRIVATE).then(
            lambda rid: (wb.log_tail(rid), wb.run_details(rid)), inputs=run_id, outputs=[run_log, run_details], **PRIVATE)
        run_id.submit(wb.run_details, inputs=run_id, outputs=run_details, api_name="run_details")
        run_id.submit(wb.log_tail, inputs=run_id, outputs=run_log, api_name="run_log")

        def pause_run(run_id: str) -> str:
            """Ask a run to pause; it acts on it at its next step."""
            return wb.run_command(run_id, "pause")

        def resume_run(run_id: str) -> str:
            """Ask a paused run to go on."""
            return wb.run_command(run_id, "resume")

        def stop_run(run_id: str) -> str:
            """Ask a run to stop; it acts on it at its next step."""
            return wb.run_command(run_id, "stop")

        pause_btn.click(pause_run, inputs=run_id, outputs=run_msg, api_name="pause_run")
        resume_btn.click(resume_run, inputs=run_id, outputs=run_msg, api_name="resume_run")
        stop_btn.click(stop_run, inputs=run_id, outputs=run_msg, api_name="stop_run")
        fork_btn.click(wb.resume_run, inputs=[run_id, fork_steps], outputs=run_msg, api_name="resume_checkpoint")
        fork_new_btn.click(wb.fork_run, inputs=[run_id, fork_steps], outputs=run_msg, api_name="fork_run")
        cfg_choice.change(wb.config_text, inputs=cfg_choice, outputs=cfg_editor, api_name="shipped_config")
        validate_btn.click(wb.validate_config, inputs=cfg_editor, outputs=cfg_msg, api_name="validate_config")
        launch_btn.click(wb.launch_run, inputs=[cfg_editor, launch_steps], outputs=cfg_msg, api_name="launch_run")

        # Live curves
        curve_inputs = [curve_token, curve_runs, smoothing, x_axis]
        curve_outputs = [curve_token, curve_status, *plots]

        def curves(token: str | None, run_ids: list[int] | None, smoothing: float, x_axis: str) -> tuple:
            """The live curves of the chosen runs; each call fetches only the points newer than the session's cursor."""
            return _curves_out(wb.refresh_curves(token, run_ids, smoothing, x_axis))

        curve_timer.tick(curves, inputs=curve_inputs, outputs=curve_outputs, show_progress=hidden, concurrency_limit=8,
                         trigger_mode="once", **PRIVATE)
        curve_runs.change(curves, inputs=curve_inputs, outputs=curve_outputs, show_progress=hidden, api_name="curves")
        for comp in (smoothing, x_axis):
            comp.change(curves, inputs=curve_inputs, outputs=curve_outputs, show_progress=hidden, **PRIVATE)
        # Log boxes follow the end of their log (Gradio's autoscroll does not, for a value set by the server).
        for box in ("run-log", "launch-log", "ab-log"):
            {"run-log": run_log, "launch-log": launch_log, "ab-log": ab_log}[box].change(
                None, js=FOLLOW_END_JS.replace("BOX", box))
        csv_btn.click(wb.curves_csv, inputs=[curve_runs, csv_panel], outputs=[csv_file, csv_msg], api_name="curves_csv")
        table_timer.tick(lambda old: _choices(wb.run_choices(), old), inputs=curve_choices,
                         outputs=[curve_runs, curve_choices], show_progress=hidden, **PRIVATE)

        # Library table
        page_inputs = [f_env, f_source, f_status, f_text, f_sort, f_desc, f_page, f_size]
        refresh_table = dict(fn=wb.library_page, inputs=page_inputs, outputs=[lib_df, page_md], **LIB)
        refresh_btn.click(**refresh_table, api_name="library_page")
        for ev in (f_text.submit, f_env.change, f_source.change, f_status.change, f_sort.change, f_desc.change,
                   f_size.change, f_page.submit):
            ev(**refresh_table, **PRIVATE)
        prev_btn.click(lambda p: max(1, int(p or 1) - 1), inputs=f_page, outputs=f_page, **PRIVATE).then(
            **refresh_table, **PRIVATE)
        next_btn.click(lambda p: int(p or 1) + 1, inputs=f_page, outputs=f_page, **PRIVATE).then(**refresh_table, **PRIVATE)
        search = dict(fn=wb.semantic_search, inputs=[q_text, f_env, q_k], outputs=[q_df, q_md], **SEARCH)
        q_btn.click(**search, api_name="semantic_search")
        q_text.submit(**search, **PRIVATE)

        # One entry
        full_outputs = [e_loaded, e_meta, e_text, e_version, e_lineage, e_usage, e_history, v_from, v_to, v_revert, e_usage_note,
                        e_src_btn]
        panel_outputs = [e_loaded, e_meta, e_lineage, e_usage, e_history, v_from, v_to, v_revert, e_usage_note, e_src_btn]
        e_src_btn.click(wb.source_episode_html, inputs=e_id, outputs=e_src_html, api_name="source_episode")

        def open_entry(entry_id: str) -> tuple:
            """One entry: its text, version, metadata, lineage, usage and version history."""
            return _entry_out(wb.open_entry(entry_id), with_text=True)

        def refresh_panel(eid: Any) -> tuple:
            return _entry_out(wb.open_entry(eid), with_text=False)

        def archive_entry(entry_id: str, loaded_version: int) -> tuple[str, int | None]:
            """Archive an entry (retrieval stops returning it); refused if it changed since `loaded_version`."""
            return wb.set_entry_status(entry_id, loaded_version, "archived")

        def restore_entry(entry_id: str, loaded_version: int) -> tuple[str, int | None]:
            """Make an archived entry active again; refused if it changed since `loaded_version`."""
            return wb.set_entry_status(entry_id, loaded_version, "active")

        reopen = dict(fn=open_entry, inputs=e_id, outputs=full_outputs, **PRIVATE)
        repanel = dict(fn=refresh_panel, inputs=e_id, outputs=panel_outputs, **PRIVATE)
        e_open.click(open_entry, inputs=e_id, outputs=full_outputs, api_name="open_entry")
        e_id.submit(**reopen)
        for table in (lib_df, q_df):
            table.select(_row_first_cell, outputs=e_id, **PRIVATE).then(**reopen)
        e_save.click(wb.save_entry, inputs=[e_id, e_text, e_version], outputs=[e_msg, e_version], api_name="edit_entry"
                     ).then(**repanel)
        e_archive.click(archive_entry, inputs=[e_id, e_version], outputs=[e_msg, e_version], api_name="archive_entry"
                        ).then(**repanel)
        e_restore.click(restore_entry, inputs=[e_id, e_version], outputs=[e_msg, e_version], api_name="restore_entry"
                        ).then(**repanel)
        diff_btn.click(wb.diff_versions, inputs=[e_id, v_from, v_to], outputs=diff_html, api_name="diff_versions")
        revert_btn.click(wb.revert_entry, inputs=[e_id, v_revert, e_version], outputs=[e_msg, e_version],
                         api_name="revert_entry").then(**reopen)
        e_to_merge.click(lambda ids, i: f"{ids}, {str(i).strip()}".strip(", ") if str(i or "").strip() else ids,
                         inputs=[m_ids, e_id], outputs=m_ids, **PRIVATE)
        c_btn.click(wb.create_entry, inputs=[c_title, c_desc, c_content, c_env, c_task], outputs=[c_msg, e_id],
                    api_name="create_entry").then(**reopen).then(**refresh_table, **PRIVATE)
        for ev in (e_save.click, e_archive.click, e_restore.click, revert_btn.click):
            ev(**refresh_table, **PRIVATE)

        # Merge
        m_propose.click(wb.propose_merge, inputs=m_ids, outputs=[m_text, m_note], api_name="propose_merge")
        m_preview.click(wb.merge_preview, inputs=[m_ids, m_text], outputs=m_diff, api_name="merge_preview")
        m_accept.click(wb.accept_merge, inputs=[m_ids, m_text], outputs=[m_msg, e_id], api_name="accept_merge"
                       ).then(**reopen).then(**refresh_table, **PRIVATE)
        m_undo.click(wb.undo_merge, inputs=m_undo_id, outputs=m_msg, api_name="undo_merge").then(**refresh_table, **PRIVATE)
        d_btn.click(wb.duplicate_clusters, inputs=[d_threshold, d_across], outputs=[d_df, d_msg], api_name="duplicate_clusters",
                    **SEARCH)

        def cluster_to_merge(table: Any, evt: gr.SelectData) -> str:
            return wb.cluster_ids(table, evt.index[0])

        d_df.select(cluster_to_merge, inputs=d_df, outputs=m_ids, **PRIVATE)

        # Import / export
        i_btn.click(wb.import_file, inputs=[i_file, i_fresh], outputs=i_msg, api_name="import_library", **IMPORT
                    ).then(**refresh_table, **PRIVATE)
        x_btn.click(wb.export_library, inputs=x_status, outputs=[x_file, x_msg], api_name="export_library")

        # A/B tests
        ab_create.click(wb.create_ab_test,
                        inputs=[ab_name, ab_env, ab_seeds, ab_ckpt, ab_turns, a_kind, a_arg, a_file, b_kind, b_arg, b_file, ab_task_ids,
                                ab_reps, ab_decoding, ab_constrain],
                        outputs=[ab_msg, ab_id], api_name="create_ab_test", **AB_CREATE)
        # The checkbox names a recurring task in the chosen env's words ("Household N" on ALFWorld)
        ab_env.change(lambda e: gr.update(label=task_id_label(e, plural=True)), inputs=ab_env, outputs=ab_task_ids,
                      show_progress=hidden, **PRIVATE)
        ab_details_out = [ab_summary, ab_progress, ab_results, ab_tasks, ab_eps]
        ab_open.click(wb.ab_details, inputs=ab_id, outputs=ab_details_out, api_name="ab_details")
        ab_open.click(wb.ab_log_tail, inputs=ab_id, outputs=ab_log, api_name="ab_log")
        ab_df.select(_row_first_cell, outputs=ab_id, **PRIVATE).then(wb.ab_details, inputs=ab_id, outputs=ab_details_out,
                                                                     **PRIVATE)
        table_timer.tick(wb.ab_tests_table, outputs=ab_df, show_progress=hidden, api_name="ab_tests")
        table_timer.tick(lambda i: wb.ab_details(i) if i else (gr.skip(),) * 5, inputs=ab_id, outputs=ab_details_out,
                         show_progress=hidden, **PRIVATE)
        table_timer.tick(lambda i: wb.ab_log_tail(i) if i else gr.skip(), inputs=ab_id, outputs=ab_log, show_progress=hidden,
                         **PRIVATE)
        ab_eps.select(_row_first_cell, outputs=r_id, **PRIVATE).then(wb.replay, inputs=r_id, outputs=ab_episode, **PRIVATE)

        # Agent demo
        def demo_step(token: str | None) -> tuple[str, str]:
            """One more turn of the session's episode: (episode HTML, status)."""
            return wb.demo_step(token)[:2]

        d_start.click(wb.demo_start, inputs=[demo_token, d_mode, d_env, d_seed, d_ckpt, d_lib, d_task_ids, d_turns, d_constrain],
                      outputs=[demo_token, d_html, d_status], api_name="demo_start", **DEMO_START
                      ).then(lambda: gr.Timer(active=False), outputs=play_timer, **PRIVATE)
        d_env.change(lambda e: gr.update(label=task_id_label(e)), inputs=d_env, outputs=d_task_ids, show_progress=hidden,
                     **PRIVATE)
        d_step.click(demo_step, inputs=demo_token, outputs=[d_html, d_status], api_name="demo_step")
        d_play.click(lambda: gr.Timer(active=True), outputs=play_timer, **PRIVATE)
        d_pause.click(lambda: gr.Timer(active=False), outputs=play_timer, **PRIVATE)
        play_timer.tick(lambda tok: _play_tick(wb.demo_step(tok)), inputs=demo_token, outputs=[d_html, d_status, play_timer],
                        show_progress=hidden, **PRIVATE)
        r_list.click(wb.episodes, inputs=[r_run, r_ab], outputs=r_df, api_name="episodes")
        r_df.select(_row_first_cell, outputs=r_id, **PRIVATE).then(wb.replay, inputs=r_id, outputs=r_html, **PRIVATE)
        r_btn.click(wb.replay, inputs=r_id, outputs=r_html, api_name="replay")

        # First paint of every new page: the running run(s) on the curves (else the newest), the library as it is now
        # (not as it was when the app started), the build's progress. In the library page's group: that is its weight.
        def first_paint(*page_args: Any) -> tuple:
            choices = wb.run_choices()
            table, info = wb.library_page(*page_args)
            facets = wb.library_facets()
            return (gr.update(choices=choices, value=wb.default_curve_runs()), [list(c) for c in choices], table, info,
                    gr.update(choices=[""] + facets["env"]), wb.build_html(), wb.build_html(), wb.runs_table(), wb.overview_md())

        demo.load(first_paint, inputs=page_inputs, outputs=[curve_runs, curve_choices, lib_df, page_md, f_env, build_runs,
                                                             build_curves, runs_df, header], **LIB, **PRIVATE)

        def demo_first_paint() -> tuple:
            d = wb.demo_defaults()
            return (d["note"], d["mode"], gr.update(value=d["env"] or None), d["seed"], d["task_ids"], d["max_turns"],
                    d["checkpoint"], d["library"], d["constrain_actions"])

        demo.load(demo_first_paint, outputs=[d_note, d_mode, d_env, d_seed, d_task_ids, d_turns, d_ckpt, d_lib, d_constrain],
                  **PRIVATE)

        def ab_first_paint() -> tuple:
            a = wb.ab_defaults()
            if a["env"] is None or a == ad:  # nothing new since the tab was built: leave it (and what was typed) alone
                return (gr.skip(),) * 6
            return (a["note"], gr.update(value=a["env"]), a["seeds"],
                    gr.update(value=a["task_ids"], label=task_id_label(a["env"], plural=True)), a["max_turns"],
                    a["constrain_actions"])

        demo.load(ab_first_paint, outputs=[ab_note, ab_env, ab_seeds, ab_task_ids, ab_turns, ab_constrain], **PRIVATE)
    return demo

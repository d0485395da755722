"""Pure formatting for the workbench: figure builders, downsampling, smoothing, tables, HTML.

Nothing here touches the store, a process or Gradio (DESIGN.md habit 7): values in, values out,
tested without a browser. Figures are Plotly figure specs as plain dicts (`figure_json` turns one
into the JSON the browser's Plotly.react draws); tables are pandas DataFrames.

By job: `curves` (live curves), `tables` (Runs and Library tabs), `abtests` (the A/B tab), `episodes` (demo and
replay HTML). Every name is importable from `app.views`.
"""
from __future__ import annotations

from app.views.curves import (  # noqa: F401
    _ci,
    _hex_rgba,
    _step_ticks,
    _xs,
    _ys,
    at_steps,
    curve_figure,
    CURVE_KEYS,
    CurveKey,
    curves_csv,
    edit_positions,
    ema,
    figure_json,
    gap_series,
    MARKER_SYMBOLS,
    MAX_EDIT_MARKS,
    MAX_RAW_POINTS,
    MAX_SMOOTH_POINTS,
    minmax_indices,
    Panel,
    PANELS,
    run_color,
    RUN_COLORS,
    SeriesView,
    SPARSE_POINTS,
    stride_indices,
)
from app.views.tables import (  # noqa: F401
    _one_line,
    _success_rate,
    build_progress_html,
    CLAIM_LABELS,
    CONTENT_CHARS,
    clusters_table,
    diff_html,
    entries_table,
    ENTRY_COLUMN_WIDTHS,
    ENTRY_COLUMNS,
    entry_meta_md,
    fmt_bytes,
    fmt_rate,
    fmt_short_time,
    fmt_time,
    history_table,
    lineage_md,
    page_info,
    RUN_COLUMN_WIDTHS,
    RUN_COLUMNS,
    run_details_md,
    run_status,
    runs_table,
    short,
    usage_note,
    usage_table,
)
from app.views.abtests import (  # noqa: F401
    ab_episodes_label,
    ab_per_task_table,
    ab_results_table,
    ab_summary_md,
    ab_tests_table,
    arm_label,
    episodes_table,
    progress_bar_html,
)
from app.views.episodes import (  # noqa: F401
    _pre,
    CSS,
    experience_html,
    live_episode_html,
    stepper_html,
    STEPPER_JS,
    trajectory_html,
    turn_html,
)

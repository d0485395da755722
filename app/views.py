"""Pure formatting for the workbench: figure builders, downsampling, smoothing, tables, HTML.

Nothing here touches the store, a process or Gradio (DESIGN.md habit 7): values in, values out,
tested without a browser. Figures are Plotly figure specs as plain dicts (`figure_json` turns one
into the JSON the browser's Plotly.react draws); tables are pandas DataFrames.
"""
from __future__ import annotations

import html
import math
import textwrap
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import orjson
import pandas as pd
from scipy.signal import lfilter

from core.metrics import wilson_interval
from core.types import Experience, entry_title

# -- live curves ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CurveKey:
    key: str  # metric name in the store
    label: str  # legend text
    dash: str = "solid"  # line style: tells the keys of one panel apart, while colour tells runs apart
    axis: int = 1  # 2 = the right-hand y axis (a different scale, e.g. loss next to reward)
    ci: tuple[str, str] | None = None  # keys of the stored 95% interval (low, high), drawn as error bars
    gap: tuple[str, str] | None = None  # a derived series: the first key minus the second, at the steps both have


@dataclass(frozen=True)
class Panel:
    id: str
    title: str
    keys: tuple[CurveKey, ...]
    y2_title: str = ""


def _ci(key: str) -> tuple[str, str]:
    return f"{key}_ci_low", f"{key}_ci_high"


PANELS: tuple[Panel, ...] = (
    Panel("reward", "Policy reward", (CurveKey("policy/reward_with_exp", "with exp"),
                                      CurveKey("policy/reward_without_exp", "without exp", "dash"))),
    Panel("success", "Policy success rate", (CurveKey("policy/success_with_exp", "with exp"),
                                             CurveKey("policy/success_without_exp", "without exp", "dash"))),
    Panel("actions", "Mean actions per episode", (CurveKey("policy/actions_with_exp", "with exp"),
                                                  CurveKey("policy/actions_without_exp", "without exp", "dash"))),
    Panel("heldout", "Held-out success (evaluations, Wilson 95% intervals)", (
        CurveKey("eval/success_without_exp", "greedy, without exp", "dash", ci=_ci("eval/success_without_exp")),
        CurveKey("eval/success_with_exp", "greedy, with exp", ci=_ci("eval/success_with_exp")),
        CurveKey("eval/success_without_exp_sampled", "sampled, without exp", "dot", ci=_ci("eval/success_without_exp_sampled")),
        CurveKey("eval/success_with_exp_sampled", "sampled, with exp", "dashdot", ci=_ci("eval/success_with_exp_sampled")))),
    # Recurring task sets (env.task_set): the held-out panel above plays the seen tasks, this one tasks never trained on.
    Panel("unseen", "Unseen tasks (evaluations, Wilson 95% intervals)", (
        CurveKey("eval/success_unseen_without_exp", "greedy, without exp", "dash", ci=_ci("eval/success_unseen_without_exp")),
        CurveKey("eval/success_unseen_with_exp", "greedy, with exp", ci=_ci("eval/success_unseen_with_exp")))),
    # What experience adds: with minus without, at the steps both were measured.
    Panel("gap", "Gap: with minus without experience", (
        CurveKey("gap/policy_success", "training success", gap=("policy/success_with_exp", "policy/success_without_exp")),
        CurveKey("gap/policy_reward", "training reward", "dot", gap=("policy/reward_with_exp", "policy/reward_without_exp")),
        CurveKey("gap/eval_success", "held-out success (greedy)", "dash", gap=("eval/success_with_exp", "eval/success_without_exp")),
        CurveKey("gap/eval_unseen_success", "unseen success (greedy)", "dashdot",
                 gap=("eval/success_unseen_with_exp", "eval/success_unseen_without_exp")))),
    # Beside the extractor's reward, whether its lessons are true (envs/entry_check.py; recurring MiniHack tasks).
    Panel("extractor", "Extractor reward, loss and entry correctness", (
        CurveKey("extractor/reward_mean", "reward"),
        CurveKey("library/entry_correct_share", "library entries right", "dashdot"),
        CurveKey("extractor/new_entry_correct_share", "new entries right", "dash"),
        CurveKey("extractor/loss", "loss", "dot", axis=2)), "loss"),
    Panel("library", "Library size and churn", (CurveKey("library/size", "size"),
                                                CurveKey("library/adds", "adds", "dash", axis=2),
                                                CurveKey("library/merges", "merges", "dot", axis=2)), "adds / merges"),
    Panel("latency", "Retrieval latency (ms)", (CurveKey("retrieval/latency_p50_ms", "p50"),
                                                CurveKey("retrieval/latency_p99_ms", "p99", "dash"))),
    Panel("retrieval", "Retrieval: hits and same-task rate", (CurveKey("retrieval/hit_rate", "hit rate"),
                                                              CurveKey("retrieval/same_task_rate", "entry of the episode's own task", "dash"))),
    Panel("search", "Search-and-ask calls", (CurveKey("search_and_ask/calls", "calls"),)),
)
# Every key the curves read from the store: the plotted ones, their intervals, and the sources of the gaps.
CURVE_KEYS: tuple[str, ...] = tuple(dict.fromkeys(
    [k for p in PANELS for c in p.keys for k in ((c.key,) if c.gap is None else ()) + (c.ci or ()) + (c.gap or ())]))
MARKER_SYMBOLS = {"solid": "circle", "dash": "square-open", "dot": "triangle-up", "dashdot": "diamond-open"}  # keys of a panel
SPARSE_POINTS = 20  # a series with at most this many points is drawn with markers (one point is no line at all)
RUN_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
MAX_RAW_POINTS = 1200  # per raw trace after downsampling (min/max pairs keep the spikes)
MAX_SMOOTH_POINTS = 600  # per smoothed trace (already smooth: fewer points suffice)
MAX_EDIT_MARKS = 300  # most recent human edits drawn on the time axis


def ema(values: np.ndarray, weight: float, state: tuple[float, int] = (0.0, 0)) -> tuple[np.ndarray, tuple[float, int]]:
    """Debiased exponential moving average (TensorBoard's smoothing), resumable.

    b_t = w·b_{t−1} + (1 − w)·x_t with b_{−1} = 0, shown as b_t / (1 − w^(t+1)). `state` is
    (b of the last point, points seen so far), so new points are smoothed without redoing the
    history. weight 0 returns the values unchanged.
    """
    values = np.asarray(values, dtype=np.float64)
    last, count = state
    if len(values) == 0:
        return values.copy(), state
    if weight <= 0.0:
        return values.copy(), (float(values[-1]), count + len(values))
    biased, _ = lfilter([1.0 - weight], [1.0, -weight], values, zi=[weight * last])
    # 1 − w^t is 1 to double precision once w^t < 1e-17: divide only the first points (cheap on 100k).
    horizon = int(math.ceil(math.log(1e-17) / math.log(weight))) if weight < 1.0 else len(values) + count
    k = max(0, min(len(values), horizon - count))
    debiased = biased.copy()
    if k:
        t = np.arange(count + 1, count + k + 1, dtype=np.float64)
        debiased[:k] /= 1.0 - np.power(weight, t)
    return debiased, (float(biased[-1]), count + len(values))


def minmax_indices(n: int, y: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of a min/max-per-bucket downsampling of y (n points) to about `max_points`.

    Each of max_points/2 equal buckets keeps its lowest and highest point, so spikes survive (a
    mean would hide a collapse); the first and last points are always kept. Vectorised: 100k
    points take about a millisecond.
    """
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, max_points // 2)
    size = n // buckets
    m = size * buckets
    block = y[:m].reshape(buckets, size)
    base = np.arange(buckets) * size
    idx = [base + block.argmin(axis=1), base + block.argmax(axis=1)]
    if m < n:
        tail = y[m:]
        idx.append(np.array([m + int(tail.argmin()), m + int(tail.argmax())]))
    idx.append(np.array([0, n - 1]))
    return np.unique(np.concatenate(idx))


def stride_indices(n: int, max_points: int) -> np.ndarray:
    """Evenly spaced indices (always the last one) for series that are already smooth."""
    if n <= max_points:
        return np.arange(n)
    idx = np.linspace(0, n - 1, max_points).astype(np.int64)
    return np.unique(idx)


@dataclass
class SeriesView:
    """One (run, key) series ready to draw: x (step or epoch seconds), raw y and smoothed y."""

    run_id: int
    key: str
    x: np.ndarray
    y: np.ndarray
    y_smooth: np.ndarray
    lo: np.ndarray | None = None  # the stored 95% interval at each point (NaN where none was stored)
    hi: np.ndarray | None = None


def _hex_rgba(color: str, alpha: float) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def run_color(run_id: int) -> str:
    return RUN_COLORS[run_id % len(RUN_COLORS)]


def _ys(y: np.ndarray, digits: int = 9) -> np.ndarray:
    """Round to `digits` significant figures of the trace's largest value. The EMA of a constant comes
    back with 1e-15 noise, which Plotly's autorange would blow up into full-height swings."""
    top = float(np.max(np.abs(y))) if len(y) else 0.0
    if top == 0.0 or not np.isfinite(top):
        return y
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(top)))
    return np.round(y * scale) / scale


def _xs(x: np.ndarray, x_axis: str) -> np.ndarray:
    # Plotly reads epoch milliseconds on a date axis.
    return x * 1000.0 if x_axis == "time" else x


def curve_figure(panel: Panel, series: Sequence[SeriesView], *, run_names: dict[int, str], x_axis: str = "step",
                 smoothing: float = 0.6, edit_marks: Sequence[float] = (), empty_text: str = "") -> dict[str, Any]:
    """One panel: per (run, key) the raw series faint behind its smoothed line; edits as vertical lines.

    `edit_marks` are x positions (steps or epoch seconds, matching `x_axis`). `uirevision` stays
    constant so that Plotly.react keeps the person's zoom and hidden traces across refreshes.
    """
    keys = {k.key: k for k in panel.keys}
    data: list[dict[str, Any]] = []
    for s in series:
        ck = keys.get(s.key)
        if ck is None or len(s.x) == 0:
            continue
        color = run_color(s.run_id)
        name = f"{run_names.get(s.run_id, f'run {s.run_id}')} · {ck.label}"
        yaxis = "y2" if ck.axis == 2 else "y"
        if len(s.x) <= SPARSE_POINTS:
            # Sparse (evaluations, a value logged once): every point as a marker on the raw values, with its
            # interval where one is stored. Smoothing a handful of points would only draw a made-up line.
            tr: dict[str, Any] = {"type": "scatter", "mode": "lines+markers" if len(s.x) > 1 else "markers",
                                  "x": _xs(s.x, x_axis), "y": _ys(s.y), "name": name, "yaxis": yaxis, "legendgroup": name,
                                  "line": {"color": color, "width": 2, "dash": ck.dash},
                                  "marker": {"color": color, "size": 8, "symbol": MARKER_SYMBOLS.get(ck.dash, "circle")}}
            if s.lo is not None and s.hi is not None and np.isfinite(s.lo).any():
                tr["error_y"] = {"type": "data", "symmetric": False, "array": np.nan_to_num(s.hi - s.y),
                                 "arrayminus": np.nan_to_num(s.y - s.lo), "color": _hex_rgba(color, 0.6), "thickness": 1.5,
                                 "width": 4}
            data.append(tr)
            continue
        if smoothing > 0:
            ri = minmax_indices(len(s.x), s.y, MAX_RAW_POINTS)
            data.append({"type": "scattergl" if len(ri) > 2000 else "scatter", "mode": "lines",
                         "x": _xs(s.x[ri], x_axis), "y": _ys(s.y[ri]), "name": name + " (raw)", "yaxis": yaxis,
                         "legendgroup": name, "showlegend": False, "hoverinfo": "skip",
                         "line": {"color": _hex_rgba(color, 0.22), "width": 1, "dash": ck.dash}})
            si = stride_indices(len(s.x), MAX_SMOOTH_POINTS)
            ys = s.y_smooth[si]
        else:
            si = minmax_indices(len(s.x), s.y, MAX_RAW_POINTS)
            ys = s.y[si]
        data.append({"type": "scatter", "mode": "lines", "x": _xs(s.x[si], x_axis), "y": _ys(ys), "name": name,
                     "yaxis": yaxis, "legendgroup": name, "line": {"color": color, "width": 2, "dash": ck.dash}})
    marks = list(edit_marks)[-MAX_EDIT_MARKS:]
    shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": m, "x1": m, "y0": 0, "y1": 1,
               "line": {"color": "rgba(255,140,0,0.55)", "width": 1, "dash": "dot"}}
              for m in (_xs(np.asarray(marks, dtype=np.float64), x_axis) if marks else [])]
    layout: dict[str, Any] = {
        "title": {"text": panel.title, "font": {"size": 14}},
        "uirevision": f"curves-{panel.id}",
        "height": 360,
        "margin": {"l": 50, "r": 50 if panel.y2_title else 20, "t": 40, "b": 100},
        "xaxis": {"title": {"text": "wall time" if x_axis == "time" else "step", "standoff": 4},
                  "type": "date" if x_axis == "time" else "linear", "showgrid": True, "gridcolor": "#eee",
                  "zeroline": False, **(_step_ticks(series) if x_axis == "step" else {})},
        "yaxis": {"showgrid": True, "gridcolor": "#eee", "zeroline": panel.id == "gap"},
        # Below the axis title, anchored by its top, with room kept for it: never over the labels.
        "legend": {"orientation": "h", "x": 0, "y": -0.3, "yanchor": "top", "font": {"size": 10}},
        "shapes": shapes,
        "plot_bgcolor": "white",
        "paper_bgcolor": "white",
    }
    if panel.y2_title:
        layout["yaxis2"] = {"title": {"text": panel.y2_title}, "overlaying": "y", "side": "right", "showgrid": False}
    if marks:
        layout["annotations"] = [{"xref": "paper", "yref": "paper", "x": 1, "y": 1.08, "showarrow": False,
                                  "text": f"┆ {len(marks)} human edit{'s' if len(marks) != 1 else ''}",
                                  "font": {"size": 10, "color": "darkorange"}}]
    if not data:
        layout["annotations"] = layout.get("annotations", []) + [
            {"xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5, "showarrow": False,
             "text": empty_text or "no data yet for the chosen runs", "font": {"color": "#888"}}]
    return {"data": data, "layout": layout}


def _step_ticks(series: Sequence[SeriesView]) -> dict[str, Any]:
    """Whole-number step ticks (1, 2, 5 × 10^k apart, about 8 of them): never "0.5" on a step axis."""
    top = max((float(np.max(s.x)) for s in series if len(s.x)), default=1.0)
    raw = max(1.0, top / 8)
    base = 10 ** math.floor(math.log10(raw))
    dtick = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    return {"tickmode": "linear", "tick0": 0, "dtick": max(1, int(dtick)), "tickformat": "d"}


def gap_series(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, a − b) at the steps both series have (the last value logged at a step counts)."""
    da = dict(zip(a[0].tolist(), a[1].tolist()))
    db = dict(zip(b[0].tolist(), b[1].tolist()))
    steps = sorted(set(da) & set(db))
    return np.asarray(steps, dtype=np.float64), np.asarray([da[x] - db[x] for x in steps], dtype=np.float64)


def at_steps(steps: np.ndarray, src: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """`src`'s values at `steps` (NaN where it has none): a stored interval beside the value it belongs to."""
    if src is None:
        return np.full(len(steps), np.nan)
    d = dict(zip(src[0].tolist(), src[1].tolist()))
    return np.asarray([d.get(x, np.nan) for x in steps.tolist()], dtype=np.float64)


def curves_csv(rows: Sequence[tuple[int, str, str, float, float, float]]) -> str:
    """(run id, run name, key, step, time, value) rows as CSV text with a header."""
    df = pd.DataFrame(list(rows), columns=["run_id", "run_name", "key", "step", "time", "value"])
    return df.to_csv(index=False)


def figure_json(fig: dict[str, Any]) -> str:
    """The figure as JSON for Plotly.react; numpy arrays are written directly (orjson: ~50x json's speed)."""
    return orjson.dumps(fig, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def edit_positions(edit_times: Sequence[float], x_axis: str, times: np.ndarray | None, steps: np.ndarray | None) -> list[float]:
    """Where human edits go on the x axis: their time, or the step a run was at then (interpolated)."""
    if x_axis == "time":
        return list(edit_times)
    if times is None or steps is None or len(times) == 0:
        return []
    et = np.asarray(edit_times, dtype=np.float64)
    inside = et[(et >= times[0]) & (et <= times[-1])]
    return np.interp(inside, times, steps).tolist()


# -- tables -------------------------------------------------------------------------------------------


def fmt_time(t: float | None) -> str:
    return "" if not t else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def fmt_bytes(n: float) -> str:
    """Binary units, as the cap is set: 20 MiB is "20 MiB", not "21 MB"."""
    for unit, size in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f} {unit}"
    return f"{int(n)} bytes"


def fmt_rate(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def short(text: str, width: int = 80) -> str:
    return textwrap.shorten(entry_title(text) or text, width=width, placeholder="…") if text else ""


RUN_COLUMNS = ["id", "name", "variant", "env", "status", "step", "success with exp", "success without exp", "started",
               "device"]
RUN_COLUMN_WIDTHS = ["4%", "15%", "10%", "14%", "19%", "5%", "8%", "8%", "12%", "5%"]


def _one_line(text: str, width: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def run_status(r: dict[str, Any], build: dict[str, Any] | None) -> str:
    """The status cell: a running run that has not logged a step yet is building the models, or waiting for them."""
    status = r["status"]
    if build is None or status not in ("created", "starting", "running") or r.get("step"):
        return status
    pct = 100.0 * min(int(build.get("done") or 0), int(build.get("total") or 1)) / max(1, int(build.get("total") or 1))
    if r.get("pid") == build.get("pid"):
        return f"building models {pct:.0f}%"
    return f"waiting for model build ({pct:.0f}%)"


def runs_table(runs: Sequence[dict[str, Any]], latest: dict[int, dict[str, float]],
               build: dict[str, Any] | None = None) -> pd.DataFrame:
    """One line per run (click a row for its details: back end, parent, log, error)."""
    rows = []
    for r in runs:
        m = latest.get(r["id"], {})
        rows.append([r["id"], _one_line(r["name"], 40), r["variant"], _one_line(r["env"], 36), run_status(r, build), r["step"],
                     fmt_rate(m.get("policy/success_with_exp")), fmt_rate(m.get("policy/success_without_exp")),
                     fmt_time(r["started_at"]), _one_line(r.get("device") or "", 8)])
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def run_details_md(r: dict[str, Any], children: Sequence[int], build: dict[str, Any] | None) -> str:
    lines = [f"**run #{r['id']} {html.escape(r['name'])}** · {r['variant']} · `{html.escape(r['env'])}` · **{r['status']}** "
             f"at step {r['step']}"]
    if r.get("parent_run_id") is not None:
        lines.append(f"fork of run **#{r['parent_run_id']}** (started from its latest checkpoint)")
    if children:
        lines.append("forked into " + ", ".join(f"**#{c}**" for c in children))
    if r.get("device") or r.get("backend"):
        lines.append(f"device `{html.escape(r.get('device') or '?')}` · back end {html.escape(r.get('backend') or '?')}")
    if build is not None and build.get("run_id") == r["id"]:
        from core.build_progress import describe

        lines.append(describe(build))
    when = " · ".join(x for x in (f"started {fmt_time(r.get('started_at'))}" if r.get("started_at") else "",
                                  f"ended {fmt_time(r.get('ended_at'))}" if r.get("ended_at") else "") if x)
    if when:
        lines.append(when)
    if r.get("log_path"):
        lines.append(f"log `{html.escape(r['log_path'])}`")
    if r.get("error"):
        lines.append(f"error: `{html.escape(r['error'].strip().splitlines()[-1][:300])}`")
    return "  \n".join(lines)


def build_progress_html(p: dict[str, Any] | None) -> str:
    """The model build as a phase of the run: a bar with the stage, the time so far and the time left."""
    if p is None:
        return ""
    from core.build_progress import describe

    total = max(1, int(p.get("total") or 1))
    pct = 100.0 * min(int(p.get("done") or 0), total) / total
    state = p.get("state")
    who = (f"for run #{p['run_id']}" if p.get("run_id") is not None else "for the workbench's policy demo" if p.get("is_app")
           else f"by process {p.get('pid')}")
    if state == "building":
        text = (f"{describe(p)} · {who} · built once, then reused; runs, evaluations, A/B tests and the policy demo wait "
                "for it (one build at a time)")
        cls = "building"
    elif state == "done":
        text, cls, pct = f"{describe(p)}: the default models are ready; curves start with the first training step", "done", 100.0
    else:
        text, cls = describe(p), "failed"
    return (f"<div class='comprl-build {cls}' id='build-state' data-state='{html.escape(str(state))}'>"
            f"<div class='comprl-progress'><div class='bar' style='width:{pct:.1f}%'></div>"
            f"<span>{html.escape(text)}</span></div></div>")


# "claim": on recurring tasks with a checker (envs/entry_check.py), whether what the entry says of its task's level
# is right, wrong, or no claim at all; "–" where nothing can be checked.
ENTRY_COLUMNS = ["id", "title", "env", "task", "source", "status", "v", "retrieved", "trained", "successes", "failures",
                 "success rate", "updated", "claim"]
ENTRY_COLUMN_WIDTHS = ["4%", "18%", "10%", "15%", "6%", "6%", "3%", "6%", "5%", "6%", "5%", "6%", "6%", "4%"]
CLAIM_LABELS = {"right": "right", "wrong": "WRONG", "no_claim": "no claim", "unknown": "–"}


def _success_rate(e: Experience) -> str:
    n = e.successes + e.failures
    return f"{e.successes / n:.2f} ({n})" if n else ""


def entries_table(entries: Sequence[Experience], scores: Sequence[float] | None = None,
                  verdicts: Sequence[str] | None = None, task_scores: Sequence[float] | None = None) -> pd.DataFrame:
    """`scores`: a search's score of each entry's text; `task_scores`: of its task key (shown beside it)."""
    rows = []
    for i, e in enumerate(entries):
        row = [e.id, short(e.text, 70), e.env, short(e.task, 50), e.source.value, e.status.value, e.version,
               e.retrieved_count, e.trained_count, e.successes, e.failures, _success_rate(e), fmt_time(e.updated_at),
               CLAIM_LABELS.get(verdicts[i], "–") if verdicts is not None else "–"]
        if scores is not None:
            row.insert(1, round(float(scores[i]), 3))
            if task_scores is not None:
                row.insert(2, "" if math.isnan(task_scores[i]) else round(float(task_scores[i]), 3))
        rows.append(row)
    extra = ([] if scores is None else ["score"]) + (["task score"] if scores is not None and task_scores is not None else [])
    cols = ENTRY_COLUMNS[:1] + extra + ENTRY_COLUMNS[1:]
    return pd.DataFrame(rows, columns=cols)


def page_info(offset: int, shown: int, total: int, page: int, page_size: int) -> str:
    pages = max(1, math.ceil(total / page_size)) if page_size else 1
    if not total:
        return "no entries match"
    return f"entries {offset + 1}–{offset + shown} of {total:,} · page {page} of {pages:,}"


def history_table(versions: Sequence[Any]) -> pd.DataFrame:
    rows = [[v.version, v.action, v.actor, v.status, v.library_version, fmt_time(v.created_at), v.note] for v in versions]
    return pd.DataFrame(rows, columns=["version", "action", "by", "status", "library v", "when", "note"])


def usage_table(usage: Sequence[dict[str, Any]]) -> pd.DataFrame:
    rows = [[u["episode_id"] if u["episode_id"] is not None else "", u["run_id"] if u["run_id"] is not None else "", u["step"],
             "success" if u["success"] else "failure", u["reward"], fmt_time(u["time"])] for u in usage]
    return pd.DataFrame(rows, columns=["episode", "run", "step", "outcome", "reward", "when"])


def usage_note(e: Experience, rows: int) -> str:
    """Why "retrieved N×" and the table of episodes can differ: every lookup counts (training, evaluations, the demo,
    A/B tests), while an outcome is recorded only for a training episode whose result reached the extractor."""
    if not e.retrieved_count and not rows:
        return "not retrieved yet"
    return (f"retrieved {e.retrieved_count}× in all (every lookup counts: training, evaluations, A/B tests, the demo); "
            f"{e.successes + e.failures} outcomes recorded from training episodes, the latest {rows} listed here"
            + ("" if rows else " — none yet: the retrievals so far were evaluations, A/B tests, the demo, or training "
               "episodes whose outcome has not reached the extractor"))


def entry_meta_md(e: Experience) -> str:
    return (f"**#{e.id}** · version **{e.version}** · {e.status.value} · {e.source.value} · env `{e.env or '-'}` · "
            f"created step {e.created_step}{f' · run {e.run_id}' if e.run_id is not None else ''}  \n"
            f"task: {html.escape(short(e.task, 160)) or '-'}  \n"
            f"retrieved {e.retrieved_count}× · trained {e.trained_count}× · successes {e.successes} · failures {e.failures}"
            f"{f' · last retrieved {fmt_time(e.last_retrieved_at)}' if e.last_retrieved_at else ''}")


def lineage_md(e: Experience, parents: dict[int, Experience], children: dict[int, Experience]) -> str:
    def line(x: Experience) -> str:
        return f"- #{x.id} ({x.source.value}, {x.status.value}): {html.escape(short(x.text, 90))}"

    out = ["**Lineage**"]
    if e.parent_ids:
        out.append(f"Parents ({len(e.parent_ids)}):")
        out += [line(parents[p]) if p in parents else f"- #{p} (not in the library)" for p in e.parent_ids]
    else:
        out.append("No parents (an original entry).")
    if children:
        out.append(f"Children ({len(children)}):")
        out += [line(c) for c in children.values()]
    if e.source_episode_id is not None:
        out.append(f"Source episode: #{e.source_episode_id} (\"Replay the source episode\" below shows it)")
    if e.generation is not None:
        out.append(f"Generation: extractor model version {e.generation.model_version}, "
                   f"{len(e.generation.response_ids)} response tokens")
    return "\n".join(out)


def diff_html(diff: str, empty: str = "(no difference)") -> str:
    """A unified diff as coloured HTML lines."""
    if not diff.strip():
        return f"<div class='comprl-diff'><em>{html.escape(empty)}</em></div>"
    lines = []
    for ln in diff.splitlines():
        cls = ("add" if ln.startswith("+") and not ln.startswith("+++") else
               "del" if ln.startswith("-") and not ln.startswith("---") else
               "hunk" if ln.startswith("@@") else "ctx")
        lines.append(f"<span class='d-{cls}'>{html.escape(ln) or '&nbsp;'}</span>")
    return "<pre class='comprl-diff'>" + "".join(lines) + "</pre>"  # each line a block: no newline between them


def clusters_table(clusters: Sequence[Sequence[int]], entries: dict[int, Experience]) -> pd.DataFrame:
    rows = []
    for n, c in enumerate(clusters, start=1):
        titles = " | ".join(short(entries[i].text, 40) for i in c if i in entries)
        rows.append([n, ", ".join(str(i) for i in c), len(c), entries[c[0]].task[:60] if c[0] in entries else "", titles])
    return pd.DataFrame(rows, columns=["cluster", "ids", "size", "task", "titles"])


# -- A/B tests -----------------------------------------------------------------------------------------


def arm_label(arm: dict[str, Any]) -> str:
    kind = arm.get("kind", "")
    if kind == "version":
        return f"library version {arm.get('version')}"
    if kind == "file":
        return f"file {arm.get('path', '').rsplit('/', 1)[-1]}"
    if kind in ("minus", "plus"):
        return f"current {'−' if kind == 'minus' else '+'} {', '.join(f'#{i}' for i in arm.get('ids', []))}"
    return {"current": "current library", "none": "no experience"}.get(kind, kind)


def ab_tests_table(tests: Sequence[dict[str, Any]], paired_p: dict[int, float] | None = None) -> pd.DataFrame:
    """One row per test; the p-value is the paired test's (McNemar's) where the episodes pair up, else marked unpaired."""
    paired_p = paired_p or {}
    rows = []
    for t in tests:
        c, r = t["config"], t["results"] or {}
        arms = r.get("arms", {})
        rows.append([t["id"], t["name"], t["status"], f"{100 * t['progress']:.0f}%", c.get("env", ""),
                     arm_label(c.get("arms", {}).get("A", {})), arm_label(c.get("arms", {}).get("B", {})),
                     fmt_rate(arms.get("A", {}).get("rate")), fmt_rate(arms.get("B", {}).get("rate")),
                     f"{paired_p[t['id']]:.3g}" if t["id"] in paired_p else
                     f"{r['p_value']:.3g} (unpaired)" if "p_value" in r else "", fmt_time(t["created_at"])])
    return pd.DataFrame(rows, columns=["id", "name", "status", "progress", "env", "arm A", "arm B", "rate A", "rate B",
                                       "p-value", "created"])


def ab_results_table(results: dict[str, Any]) -> pd.DataFrame:
    """Per arm: episodes, successes, rate with its Wilson 95% interval, mean actions.

    The interval is recomputed from (successes, n) when the evaluator did not store it."""
    rows = []
    for name, a in sorted((results or {}).get("arms", {}).items()):
        n, s = int(a.get("n", 0)), int(a.get("successes", 0))
        lo, hi = (a["ci_low"], a["ci_high"]) if "ci_low" in a and "ci_high" in a else wilson_interval(s, n)
        rate = a.get("rate", s / n if n else float("nan"))
        rows.append([name, n, s, fmt_rate(rate), f"[{lo:.2f}, {hi:.2f}]", fmt_rate(a.get("mean_actions"))])
    return pd.DataFrame(rows, columns=["arm", "episodes", "successes", "success rate", "Wilson 95% CI", "mean actions"])


def ab_per_task_table(results: dict[str, Any]) -> pd.DataFrame:
    rows = [[task, fmt_rate(v.get("A")), fmt_rate(v.get("B"))] for task, v in sorted((results or {}).get("per_task", {}).items())]
    return pd.DataFrame(rows, columns=["task", "rate A", "rate B"])


def progress_bar_html(progress: float, status: str) -> str:
    pct = max(0.0, min(1.0, float(progress))) * 100
    return (f"<div class='comprl-progress'><div class='bar' style='width:{pct:.0f}%'></div>"
            f"<span>{html.escape(status)} · {pct:.0f}%</span></div>")


def ab_episodes_label(c: dict[str, Any]) -> str:
    """"16 seeds per arm, greedy" or "16 seeds × 8 sampled episodes = 128 per arm"."""
    n, reps = len(c.get("seeds", [])), int(c.get("episodes_per_task", 1))
    what = "task ids" if c.get("task_ids") else "seeds"
    if c.get("decoding", "greedy") == "greedy":
        return f"{n} {what} per arm, greedy"
    return f"{n} {what} × {reps} sampled episode{'s' if reps > 1 else ''} = {n * reps} per arm"


def ab_summary_md(test: dict[str, Any], paired: dict[str, Any] | None = None) -> str:
    c, r = test["config"], test["results"] or {}
    arms = c.get("arms", {})
    lines = [f"**A/B test #{test['id']} — {html.escape(test['name'])}** · status **{test['status']}**",
             f"env `{c.get('env', '')}` · {ab_episodes_label(c)} · checkpoint "
             f"`{c.get('checkpoint') or 'default policy'}` · max turns {c.get('max_turns') or 'env default'}",
             f"A: {arm_label(arms.get('A', {}))} · B: {arm_label(arms.get('B', {}))}"]
    if "diff" in r:
        lines.append(f"difference A − B: **{r['diff']:+.3f}**")
    if paired is not None:
        p = paired["p_value"]
        what = ("both arms play the same " + f"{paired['pairs']} tasks" if int(c.get("episodes_per_task", 1)) == 1 else
                f"{paired['pairs']} pairs: each task's k-th sampled episode in A and in B")
        lines.append(f"paired test ({what}): McNemar's, {paired['method']}, p-value "
                     f"**{p:.3g}**{' (significant at 0.05)' if p < 0.05 else ''}")
        lines.append(f"discordant pairs: **{paired['a_only']}** solved by A only, **{paired['b_only']}** by B only "
                     f"(both solved {paired['both']}, neither {paired['neither']}); only these tell the arms apart")
    elif "p_value" in r:
        lines.append(f"unpaired two-proportion p-value {r['p_value']:.3g} (the episodes to pair are not all stored)")
    if test.get("error"):
        lines.append(f"error: `{html.escape(test['error'][-500:])}`")
    return "  \n".join(lines)


def episodes_table(items: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Episodes; an "arm" column (A/B tests: which library an episode played with) when they carry one."""
    rows = [[t["id"], t.get("run_id") or "", t.get("ab_test_id") or "", t["step"], t["env"], short(t["task"], 50), t["seed"],
             "yes" if t["with_experience"] else "no", "success" if t["success"] else "failure", round(t["reward"], 3),
             t["num_actions"]] for t in items]
    cols = ["episode", "run", "A/B", "step", "env", "task", "seed", "with exp", "outcome", "reward", "actions"]
    if any("arm" in t for t in items):
        for row, t in zip(rows, items):
            row.insert(3, t.get("arm", ""))
        cols.insert(3, "arm")
    return pd.DataFrame(rows, columns=cols)


# -- episodes (agent demo, replay) ---------------------------------------------------------------------


def _pre(text: str) -> str:
    return f"<pre class='comprl-obs'>{html.escape(text)}</pre>"


def turn_html(turn: dict[str, Any]) -> str:
    """One turn of a live episode: the action taken (if any), then what the agent saw."""
    parts = [f"<div class='comprl-turn'><div class='turn-head'>turn {turn.get('turn', 0)}"]
    if turn.get("action"):
        parts.append(f" · action <code>{html.escape(str(turn['action']))}</code> · reward {float(turn.get('reward', 0.0)):+.2f}")
    if turn.get("done"):
        ok = turn.get("success")
        parts.append(f" · <b>episode over: {'success' if ok else 'failure' if ok is not None else 'ended'}</b>")
    parts.append("</div>")
    if turn.get("tool_query"):
        parts.append(f"<div class='tool'>search-and-ask: <i>{html.escape(turn['tool_query'])}</i><br>"
                     f"answer: {html.escape(turn.get('tool_answer', ''))}</div>")
    parts.append(_pre(str(turn.get("observation", ""))))
    parts.append("</div>")
    return "".join(parts)


def experience_html(text: str, note: str = "") -> str:
    if not text:
        return "<div class='comprl-exp'><em>no experience shown</em></div>"
    return (f"<div class='comprl-exp'><div class='turn-head'>experience shown{' · ' + html.escape(note) if note else ''}</div>"
            f"{_pre(text)}</div>")


def stepper_html(turns: Sequence[dict[str, Any]], at: int | None = None, dom_id: str = "ep") -> str:
    """Turn-by-turn, oldest first, one turn at a time with a step slider (a 50-turn episode is one screen, not a
    7,400-px page). The turns are all in the page; the slider shows one (no round trip). `at`: the turn shown first
    (default: the last)."""
    if not turns:
        return ""
    n = len(turns)
    at = n - 1 if at is None else max(0, min(n - 1, at))
    sid = html.escape(dom_id)
    # Gradio's HTML component drops <script>: the slider works through an inline handler.
    on = ("const r=this.closest('.comprl-stepper');const v=+this.value;"
          "r.querySelectorAll('.comprl-step').forEach((e,i)=>{e.style.display=i===v?'block':'none'});"
          "r.querySelector('.comprl-step-label').textContent='turn '+v+' of '+(r.querySelectorAll('.comprl-step').length-1);")
    parts = [f"<div class='comprl-stepper' id='{sid}-stepper'>",
             f"<div class='comprl-step-controls'><input type='range' class='comprl-step-slider' id='{sid}-slider' min='0' "
             f"max='{n - 1}' step='1' value='{at}' oninput=\"{on}\" onchange=\"{on}\">"
             f"<span class='comprl-step-label'>turn {at} of {n - 1}</span></div>"]
    for i, t in enumerate(turns):
        parts.append(f"<div class='comprl-step' data-turn='{i}' style='display:{'block' if i == at else 'none'}'>"
                     f"{turn_html(t)}</div>")
    parts.append("</div>")
    return "".join(parts)


# The step slider of an episode view, wired once per gr.HTML (js_on_load): Gradio may drop inline handlers, and the
# component's content is replaced on every update while its element stays.
STEPPER_JS = """
const show = (slider) => {
  const root = slider.closest('.comprl-stepper'); if (!root) return;
  const steps = root.querySelectorAll('.comprl-step'); const v = +slider.value;
  steps.forEach((e, i) => { e.style.display = i === v ? 'block' : 'none'; });
  const label = root.querySelector('.comprl-step-label');
  if (label) label.textContent = 'turn ' + v + ' of ' + (steps.length - 1);
};
element.addEventListener('input', (ev) => { if (ev.target.classList && ev.target.classList.contains('comprl-step-slider')) show(ev.target); });
element.addEventListener('change', (ev) => { if (ev.target.classList && ev.target.classList.contains('comprl-step-slider')) show(ev.target); });
"""


def live_episode_html(turns: Sequence[dict[str, Any]], experience: str = "", note: str = "") -> str:
    """The episode so far: the experience block the agent was given, then a step slider over the turns, oldest
    first, showing the newest (each new turn moves the slider to it)."""
    if not turns:
        return "<em>press Start to begin an episode</em>"
    return experience_html(experience, note) + stepper_html(turns, dom_id="live")


def trajectory_html(traj: dict[str, Any]) -> str:
    """A stored episode (trajectories row with its steps) for replay, in order."""
    head = (f"<div class='turn-head'>episode #{traj['id']} · {html.escape(traj['env'])} · seed {traj['seed']} · "
            f"{'with' if traj['with_experience'] else 'without'} experience · "
            f"<b>{'success' if traj['success'] else 'failure'}</b> · reward {traj['reward']:+.2f} · "
            f"{traj['num_actions']} actions</div><div>task: {html.escape(traj['task'])}</div>")
    body = [head, experience_html(traj.get("experience_text", ""),
                                  ", ".join(f"#{i}" for i in traj.get("experience_ids", [])))]
    turns = [{"turn": n, "observation": st.get("observation", ""), "action": st.get("action", ""),
              "reward": st.get("reward", 0.0), "tool_query": st.get("tool_query", ""), "tool_answer": st.get("tool_answer", ""),
              "done": n == len(traj["steps"]), "success": traj["success"]} for n, st in enumerate(traj.get("steps", []), start=1)]
    body.append(stepper_html(turns, at=0, dom_id=f"episode-{traj['id']}"))
    return "".join(body)


CSS = """
.comprl-diff{font-family:monospace;font-size:12px;white-space:pre-wrap;background:#fafafa;padding:6px;border-radius:4px}
.comprl-diff .d-add{color:#116329;background:#dafbe1;display:block}
.comprl-diff .d-del{color:#82071e;background:#ffebe9;display:block}
.comprl-diff .d-hunk{color:#0550ae;display:block}
.comprl-diff .d-ctx{display:block}
.comprl-obs{font-family:monospace;font-size:12px;line-height:1.15;background:#f6f8fa;padding:6px;border-radius:4px;
  white-space:pre;overflow-x:auto}
.comprl-turn{border-left:3px solid #1f77b4;padding-left:8px;margin:6px 0}
.comprl-exp{border-left:3px solid #ff7f0e;padding-left:8px;margin:6px 0}
.turn-head{font-size:13px;color:#444;margin-bottom:2px}
.comprl-turn .tool{font-size:12px;background:#fff7e6;padding:4px}
.comprl-progress{position:relative;height:22px;background:#eee;border-radius:4px;overflow:hidden}
.comprl-progress .bar{position:absolute;left:0;top:0;bottom:0;background:#8fd18f}
.comprl-progress span{position:relative;padding-left:8px;font-size:13px;line-height:22px}
.comprl-error{color:#b00020}
.comprl-build{margin:4px 0 8px 0}
.comprl-build.done .comprl-progress .bar{background:#b9e4b9}
.comprl-build.failed .comprl-progress .bar{background:#f3b3b3}
.comprl-step-controls{display:flex;align-items:center;gap:10px;margin:4px 0}
.comprl-step-slider{flex:1}
.comprl-step-label{font-size:13px;color:#444;min-width:110px}
#runs-table td{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
"""

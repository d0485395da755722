"""Live curves: panels and their keys, downsampling (min/max per bucket), the debiased EMA, Plotly figure specs,
the gap series, CSV export and human-edit marks."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import orjson
import pandas as pd
from scipy.signal import lfilter


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
    # The extractor's skill apart from the policy (trainers/probe.py): a fixed held-out set distilled greedily.
    Panel("probe", "Extractor probe: its entries on held-out trajectories", (
        CurveKey("extractor/probe_correct", "entries right"),
        CurveKey("extractor/probe_wrong", "entries wrong", "dash"),
        CurveKey("extractor/probe_unverifiable", "entries unverifiable", "dot"),
        CurveKey("extractor/probe_valid", "answers that parse", "dashdot"))),
    Panel("library", "Library size and churn", (CurveKey("library/size", "size"),
                                                CurveKey("library/adds", "adds", "dash", axis=2),
                                                CurveKey("library/merges", "merges", "dot", axis=2)), "adds / merges"),
    Panel("latency", "Retrieval latency (ms)", (CurveKey("retrieval/latency_p50_ms", "p50"),
                                                CurveKey("retrieval/latency_p99_ms", "p99", "dash"))),
    Panel("retrieval", "Retrieval: hits and same-task rate", (CurveKey("retrieval/hit_rate", "hit rate"),
                                                              CurveKey("retrieval/same_task_rate", "entry of the episode's own task", "dash"))),
    Panel("search", "Search-and-ask calls", (CurveKey("search_and_ask/calls", "calls"),)),
    # After each weight sync, the rollout engine (vLLM, or the hf rollout copy) against the learner on the same tokens:
    # float noise when the sync took; a jump means rollouts no longer come from the trained policy.
    Panel("sync", "Weight sync: rollout engine vs learner log-probs (nats)", (
        CurveKey("sync/logprob_gap_max", "actor, largest gap"),
        CurveKey("sync/logprob_gap_mean", "actor, mean gap", "dash"),
        CurveKey("sync/extractor_logprob_gap_max", "extractor, largest gap", "dot"))),
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



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


@dataclass(frozen=True)
class Panel:
    id: str
    title: str
    keys: tuple[CurveKey, ...]
    y2_title: str = ""


PANELS: tuple[Panel, ...] = (
    Panel("reward", "Policy reward", (CurveKey("policy/reward_with_exp", "with exp"),
                                      CurveKey("policy/reward_without_exp", "without exp", "dash"))),
    Panel("success", "Policy success rate", (CurveKey("policy/success_with_exp", "with exp"),
                                             CurveKey("policy/success_without_exp", "without exp", "dash"))),
    Panel("actions", "Mean actions per episode", (CurveKey("policy/actions_with_exp", "with exp"),
                                                  CurveKey("policy/actions_without_exp", "without exp", "dash"))),
    Panel("heldout", "Held-out success (evaluations)", (CurveKey("eval/success_without_exp", "greedy, without exp", "dash"),
                                                         CurveKey("eval/success_with_exp", "greedy, with exp"),
                                                         CurveKey("eval/success_without_exp_sampled", "sampled, without exp", "dot"),
                                                         CurveKey("eval/success_with_exp_sampled", "sampled, with exp", "dashdot"))),
    # Recurring task sets (env.task_set): the held-out panel above plays the seen tasks, this one tasks never trained on.
    Panel("unseen", "Unseen tasks (evaluations)", (CurveKey("eval/success_unseen_without_exp", "greedy, without exp", "dash"),
                                                   CurveKey("eval/success_unseen_with_exp", "greedy, with exp"))),
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
CURVE_KEYS: tuple[str, ...] = tuple(k.key for p in PANELS for k in p.keys)
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
                 smoothing: float = 0.6, edit_marks: Sequence[float] = ()) -> dict[str, Any]:
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
        "height": 300,
        "margin": {"l": 50, "r": 50 if panel.y2_title else 20, "t": 40, "b": 40},
        "xaxis": {"title": {"text": "wall time" if x_axis == "time" else "step"},
                  "type": "date" if x_axis == "time" else "linear", "showgrid": True, "gridcolor": "#eee",
                  "zeroline": False},
        "yaxis": {"showgrid": True, "gridcolor": "#eee", "zeroline": False},
        "legend": {"orientation": "h", "y": -0.25, "font": {"size": 10}},
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
             "text": "no data yet for the chosen runs", "font": {"color": "#888"}}]
    return {"data": data, "layout": layout}


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


def fmt_rate(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def short(text: str, width: int = 80) -> str:
    return textwrap.shorten(entry_title(text) or text, width=width, placeholder="…") if text else ""


RUN_COLUMNS = ["id", "name", "variant", "env", "status", "step", "success with exp", "success without exp", "started",
               "device / back end"]
RUN_COLUMN_WIDTHS = ["5%", "12%", "10%", "13%", "8%", "6%", "9%", "9%", "13%", "15%"]


def runs_table(runs: Sequence[dict[str, Any]], latest: dict[int, dict[str, float]]) -> pd.DataFrame:
    rows = []
    for r in runs:
        m = latest.get(r["id"], {})
        rows.append([r["id"], r["name"], r["variant"], r["env"], r["status"], r["step"],
                     fmt_rate(m.get("policy/success_with_exp")), fmt_rate(m.get("policy/success_without_exp")),
                     fmt_time(r["started_at"]), " / ".join(x for x in (r.get("device"), r.get("backend")) if x)])
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


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
                  verdicts: Sequence[str] | None = None) -> pd.DataFrame:
    rows = []
    for i, e in enumerate(entries):
        row = [e.id, short(e.text, 70), e.env, short(e.task, 50), e.source.value, e.status.value, e.version,
               e.retrieved_count, e.trained_count, e.successes, e.failures, _success_rate(e), fmt_time(e.updated_at),
               CLAIM_LABELS.get(verdicts[i], "–") if verdicts is not None else "–"]
        if scores is not None:
            row.insert(1, round(float(scores[i]), 3))
        rows.append(row)
    cols = ENTRY_COLUMNS if scores is None else ENTRY_COLUMNS[:1] + ["score"] + ENTRY_COLUMNS[1:]
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
        out.append(f"Source episode: #{e.source_episode_id}")
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
    return "<pre class='comprl-diff'>" + "\n".join(lines) + "</pre>"


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


def ab_tests_table(tests: Sequence[dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for t in tests:
        c, r = t["config"], t["results"] or {}
        arms = r.get("arms", {})
        rows.append([t["id"], t["name"], t["status"], f"{100 * t['progress']:.0f}%", c.get("env", ""),
                     arm_label(c.get("arms", {}).get("A", {})), arm_label(c.get("arms", {}).get("B", {})),
                     fmt_rate(arms.get("A", {}).get("rate")), fmt_rate(arms.get("B", {}).get("rate")),
                     f"{r['p_value']:.3g}" if "p_value" in r else "", fmt_time(t["created_at"])])
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


def ab_summary_md(test: dict[str, Any]) -> str:
    c, r = test["config"], test["results"] or {}
    arms = c.get("arms", {})
    lines = [f"**A/B test #{test['id']} — {html.escape(test['name'])}** · status **{test['status']}**",
             f"env `{c.get('env', '')}` · {len(c.get('seeds', []))} seeds per arm · checkpoint "
             f"`{c.get('checkpoint') or 'default policy'}` · max turns {c.get('max_turns') or 'env default'}",
             f"A: {arm_label(arms.get('A', {}))} · B: {arm_label(arms.get('B', {}))}"]
    if "diff" in r:
        lines.append(f"difference A − B: **{r['diff']:+.3f}** · two-proportion test p-value **{r['p_value']:.3g}**"
                     f"{' (significant at 0.05)' if r['p_value'] < 0.05 else ''}")
    if test.get("error"):
        lines.append(f"error: `{html.escape(test['error'][-500:])}`")
    return "  \n".join(lines)


def episodes_table(items: Sequence[dict[str, Any]]) -> pd.DataFrame:
    rows = [[t["id"], t.get("run_id") or "", t.get("ab_test_id") or "", t["step"], t["env"], short(t["task"], 50), t["seed"],
             "yes" if t["with_experience"] else "no", "success" if t["success"] else "failure", round(t["reward"], 3),
             t["num_actions"]] for t in items]
    return pd.DataFrame(rows, columns=["episode", "run", "A/B", "step", "env", "task", "seed", "with exp", "outcome", "reward",
                                       "actions"])


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


def live_episode_html(turns: Sequence[dict[str, Any]], experience: str = "", note: str = "") -> str:
    """The episode so far, newest turn first, with the experience block the agent was given on top."""
    if not turns:
        return "<em>press Start to begin an episode</em>"
    return experience_html(experience, note) + "".join(turn_html(t) for t in reversed(turns))


def trajectory_html(traj: dict[str, Any]) -> str:
    """A stored episode (trajectories row with its steps) for replay, in order."""
    head = (f"<div class='turn-head'>episode #{traj['id']} · {html.escape(traj['env'])} · seed {traj['seed']} · "
            f"{'with' if traj['with_experience'] else 'without'} experience · "
            f"<b>{'success' if traj['success'] else 'failure'}</b> · reward {traj['reward']:+.2f} · "
            f"{traj['num_actions']} actions</div><div>task: {html.escape(traj['task'])}</div>")
    body = [head, experience_html(traj.get("experience_text", ""),
                                  ", ".join(f"#{i}" for i in traj.get("experience_ids", [])))]
    for n, st in enumerate(traj.get("steps", []), start=1):
        body.append(turn_html({"turn": n, "observation": st.get("observation", ""), "action": st.get("action", ""),
                               "reward": st.get("reward", 0.0), "tool_query": st.get("tool_query", ""),
                               "tool_answer": st.get("tool_answer", ""),
                               "done": n == len(traj["steps"]), "success": traj["success"]}))
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
"""

"""The A/B tab: arms, the tests table, results per arm and per task, the summary with the paired test, and the
episodes table (shared with replay)."""
from __future__ import annotations

import html
import re
from typing import Any, Sequence

import pandas as pd

from app.views.tables import fmt_rate, fmt_time, short
from core.metrics import wilson_interval


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


def _natural(text: str) -> list[Any]:
    """Sort key that orders "Dungeon 2" before "Dungeon 10" (and "Household 2" before "Household 10": any env's
    recurring task ids, envs/base.py instance_task)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def ab_per_task_table(results: dict[str, Any]) -> pd.DataFrame:
    """Success per task and arm, tasks in natural order, each shortened so the rates stay in view."""
    items = sorted((results or {}).get("per_task", {}).items(), key=lambda kv: _natural(kv[0]))
    rows = [[short(task, 70), fmt_rate(v.get("A")), fmt_rate(v.get("B"))] for task, v in items]
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
        if int(c.get("episodes_per_task", 1)) == 1:
            what = f"both arms play the same {paired['pairs']} tasks"
        else:
            what = f"{paired['pairs']} pairs: each task's k-th sampled episode in A and in B"
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



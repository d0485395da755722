"""Tables and text of the Runs and Library tabs: formatting helpers, the runs table and a run's details, the build's
progress, entries, versions, usage, lineage, diffs and clusters."""
from __future__ import annotations

import html
import math
import textwrap
import time
from typing import Any, Sequence

import pandas as pd

from core.metrics import sync_warning
from core.types import Experience, entry_content, entry_title


def fmt_time(t: float | None) -> str:
    return "" if not t else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def fmt_bytes(n: float) -> str:
    """Binary units, as the cap is set: 20 MiB is "20 MiB", not "21 MB"."""
    for unit, size in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f} {unit}"
    return f"{int(n)} bytes"


def fmt_short_time(t: float | None) -> str:
    """A table cell's time: month-day hour:minute (the full time is in the details)."""
    return "" if not t else time.strftime("%m-%d %H:%M", time.localtime(t))


def fmt_rate(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def short(text: str, width: int = 80) -> str:
    return textwrap.shorten(entry_title(text) or text, width=width, placeholder="…") if text else ""


RUN_COLUMNS = ["id", "name", "variant", "env", "status", "step", "success with exp", "success without exp", "started",
               "device"]
# Sized on a 1400-pixel page (a 1215-pixel table, 14-pixel monospace: 8.4 pixels a character): "complementary" and
# "minihack/Room-Ultimate-5x5" whole, the figures whole, headers wrapped between words (views.CSS), never cut.
RUN_COLUMN_WIDTHS = ["4%", "15%", "10.5%", "19.5%", "13%", "5%", "8%", "8%", "10%", "7%"]


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
        status = run_status(r, build) + (" · sync warning" if sync_warning(m) else "")  # the details say which
        rows.append([r["id"], _one_line(r["name"], 40), r["variant"], _one_line(r["env"], 36), status, r["step"],
                     fmt_rate(m.get("policy/success_with_exp")), fmt_rate(m.get("policy/success_without_exp")),
                     fmt_short_time(r["started_at"]), _one_line(r.get("device") or "", 8)])
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def run_details_md(r: dict[str, Any], children: Sequence[int], build: dict[str, Any] | None,
                   latest: dict[str, float] | None = None) -> str:
    lines = [f"**run #{r['id']} {html.escape(r['name'])}** · {r['variant']} · `{html.escape(r['env'])}` · **{r['status']}** "
             f"at step {r['step']}"]
    warning = sync_warning(latest or {})
    if warning:
        lines.append(f"⚠ {html.escape(warning)}")
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


# "content": what the entry says (its `## Content:`, shortened): a run's entries share one title ("Where the staircase
# is"), so the claim a curator reads is here. "success rate": successes of the outcomes recorded ("0.75 (3 of 4)").
# "claim": on recurring tasks with a checker (envs/entry_check.py), whether what the entry says of its task's level
# is right, wrong, or no claim at all; "–" where nothing can be checked.
ENTRY_COLUMNS = ["id", "title", "content", "env", "task", "source", "status", "v", "retrieved", "trained", "success rate",
                 "updated", "claim"]
# At 13 pixels (views.CSS) on a 1400-pixel page, each header's longest word and each short cell ("extracted",
# "archived", "WRONG") whole; the rest to the texts.
ENTRY_COLUMN_WIDTHS = ["4.5%", "9%", "17.5%", "10%", "10%", "8.5%", "6.5%", "3.5%", "7.5%", "6%", "6%", "6%", "5%"]
CONTENT_CHARS = 110
CLAIM_LABELS = {"right": "right", "wrong": "WRONG", "no_claim": "no claim", "unknown": "–"}


def _success_rate(e: Experience) -> str:
    n = e.successes + e.failures
    return f"{e.successes / n:.2f} ({e.successes} of {n})" if n else ""


def _content(text: str) -> str:
    c = entry_content(text or "")
    return textwrap.shorten(c, width=CONTENT_CHARS, placeholder="…") if c else ""


def entries_table(entries: Sequence[Experience], scores: Sequence[float] | None = None,
                  verdicts: Sequence[str] | None = None, task_scores: Sequence[float] | None = None) -> pd.DataFrame:
    """`scores`: a search's score of each entry's text; `task_scores`: of its task key (shown beside it)."""
    rows = []
    for i, e in enumerate(entries):
        row = [e.id, short(e.text, 60), _content(e.text), e.env, short(e.task, 50), e.source.value, e.status.value,
               e.version, e.retrieved_count, e.trained_count, _success_rate(e), fmt_short_time(e.updated_at),
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



"""The study's tables: per variant mean ± sd over seeds with pooled Wilson intervals, the extractor probe at start
and end, and paired (McNemar) tests of two variants on the same held-out tasks (benchmarks/study.py writes them)."""
from __future__ import annotations

import argparse
import statistics

PROBE_KEYS = ("probe_correct", "probe_wrong", "probe_unverifiable", "probe_valid")


def mean_sd(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def mean_of(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    return f"{statistics.mean(xs):.2f}" if xs else "–"


def pooled_ci(runs: list[dict], key: str, fallback_n: int) -> str:
    """Pooled end success over seeds (successes / episodes) with its Wilson 95% interval."""
    from core.metrics import wilson_interval

    k = n = 0
    for r in runs:
        rate = r["end"].get(key)
        if rate is None:
            continue
        m = int(r.get("eval_n") or fallback_n)
        k, n = k + round(rate * m), n + m
    if not n:
        return "–"
    lo, hi = wilson_interval(k, n)
    return f"{k}/{n} [{lo:.2f}, {hi:.2f}]"


def table(results: list[dict], args: argparse.Namespace, commit: str) -> str:
    """Per label: mean ± sd over seeds of the start and end eval, pooled end success with its CI, and the commit."""
    labels = list(dict.fromkeys(r["label"] for r in results))
    lines = [f"Budget: {args.steps} steps per run; eval on {args.eval_episodes} held-out seeds per condition, greedy, and "
             f"sampled at the rollout temperature where the run measured it (runs before the sampled eval show –). "
             f"Study written at commit {commit}; the commit column is the one each run was made with.", "",
             "| variant | seeds | success without exp (start → end) | without, end pooled [95% CI] | success with exp (start → end) "
             "| with, end pooled [95% CI] | sampled without (start → end) | sampled with (start → end) "
             "| actions without (start → end) | actions with (start → end) | unseen without (start → end) | unseen with (start → end) "
             "| library entries right (first → end) | library | extractor updates | hours per run | commit |",
             "|---|---:|---|---|---|---|---|---|---|---|---|---|---|---:|---:|---:|---|"]
    for lab in labels:
        rs = [r for r in results if r["label"] == lab]
        col = lambda when, k: [r[when].get(k) for r in rs]  # noqa: E731
        commits = ", ".join(dict.fromkeys(r.get("commit") or "?" for r in rs))
        lines.append(
            f"| {lab} | {len(rs)} | {mean_sd(col('start', 'success_without_exp'))} → {mean_sd(col('end', 'success_without_exp'))} | "
            f"{pooled_ci(rs, 'success_without_exp', args.eval_episodes)} | "
            f"{mean_sd(col('start', 'success_with_exp'))} → {mean_sd(col('end', 'success_with_exp'))} | "
            f"{pooled_ci(rs, 'success_with_exp', args.eval_episodes)} | "
            f"{mean_sd(col('start', 'success_without_exp_sampled'))} → {mean_sd(col('end', 'success_without_exp_sampled'))} | "
            f"{mean_sd(col('start', 'success_with_exp_sampled'))} → {mean_sd(col('end', 'success_with_exp_sampled'))} | "
            f"{mean_of(col('start', 'actions_without_exp'))} → {mean_of(col('end', 'actions_without_exp'))} | "
            f"{mean_of(col('start', 'actions_with_exp'))} → {mean_of(col('end', 'actions_with_exp'))} | "
            f"{mean_sd(col('start', 'success_unseen_without_exp'))} → {mean_sd(col('end', 'success_unseen_without_exp'))} | "
            f"{mean_sd(col('start', 'success_unseen_with_exp'))} → {mean_sd(col('end', 'success_unseen_with_exp'))} | "
            f"{mean_sd([r.get('entry_correct_first') for r in rs])} → {mean_sd([r.get('entry_correct_end') for r in rs])} | "
            f"{mean_sd([r.get('library_size') for r in rs])} | {mean_sd([r.get('extractor_updates') for r in rs])} | "
            f"{mean_of([r['seconds'] / 3600 if r.get('seconds') else None for r in rs])} | {commits} |")
    return "\n".join(lines)


PAIRED = (("complementary", "with_exp", "static", "with_exp"), ("complementary", "with_exp", "grpo", "without_exp"),
          ("static", "with_exp", "grpo", "without_exp"),
          ("complementary", "unseen_with_exp", "static", "unseen_with_exp"),
          ("complementary", "unseen_with_exp", "grpo", "unseen_without_exp"))


def paired_tests(results: list[dict]) -> list[dict]:
    """McNemar's test of two variants' end outcomes, paired by (seed, task): the same held-out task played greedily by
    both variants' runs of one seed (the tasks of a recurring set are the same for every run). Each pair is one task
    played once per run (greedy); a task played more than once in a run is left out."""
    from core.metrics import mcnemar_test, paired_outcomes

    def outcomes(variant: str, cond: str) -> dict:
        out = {}
        for r in results:
            if r.get("variant") != variant or r.get("extra"):
                continue
            for task, (wins, n) in ((r.get("eval_by_task") or {}).get("end", {}).get(cond, {})).items():
                if n == 1:
                    out[(r["seed"], task)] = bool(wins)
        return out

    rows = []
    for va, ca, vb, cb in PAIRED:
        a, b = outcomes(va, ca), outcomes(vb, cb)
        if not a or not b:
            continue
        t = paired_outcomes(a, b)
        p, method = mcnemar_test(t["a_only"], t["b_only"])
        rows.append({"a": f"{va} {ca}", "b": f"{vb} {cb}", **t, "a_rate": (t["both"] + t["a_only"]) / max(1, t["pairs"]),
                     "b_rate": (t["both"] + t["b_only"]) / max(1, t["pairs"]), "p": p, "method": method})
    return rows


def paired_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    lines = ["Paired (McNemar) at the end, greedy: each pair is one held-out task of one seed, played by both runs.", "",
             "| A | B | pairs | A solved | B solved | only A | only B | p |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['a']} | {r['b']} | {r['pairs']} | {r['both'] + r['a_only']} | {r['both'] + r['b_only']} | "
                     f"{r['a_only']} | {r['b_only']} | {r['p']:.3g} ({r['method']}) |")
    return "\n".join(lines)


CREDIT_KEYS = (("extractor/rewarded_right_share", "rewarded entries right"),
               ("extractor/reward_gap", "reward, right minus wrong entries"),
               ("extractor/relative_reward_gap", "the same, relative reward (not trained on)"),
               ("extractor/episodes_per_entry_reward", "episodes per entry's reward"))


def credit_table(results: list[dict]) -> str:
    """Does the extractor's reward tell a right lesson from a wrong one? Per variant, each curve's mean over its run's
    steps, then mean ± sd over seeds (trainers/cotrain.py EntryAudit.credit_metrics)."""
    def run_mean(r: dict, key: str) -> float | None:
        pts = [p[1] for p in (r.get("curves") or {}).get(key, []) if p[1] is not None]
        return sum(pts) / len(pts) if pts else None

    labels = [lab for lab in dict.fromkeys(r["label"] for r in results)
              if any(run_mean(r, "extractor/rewarded_right_share") is not None for r in results if r["label"] == lab)]
    if not labels:
        return ""
    lines = ["The extractor's reward against the truth of the entries it rewards (per step over the run, mean ± sd over "
             "seeds; a right entry's reward should exceed a wrong one's).", "",
             "| variant | seeds | " + " | ".join(name for _, name in CREDIT_KEYS) + " |",
             "|---|---:|" + "---|" * len(CREDIT_KEYS)]
    for lab in labels:
        rs = [r for r in results if r["label"] == lab]
        lines.append(f"| {lab} | {len(rs)} | " + " | ".join(mean_sd([run_mean(r, k) for r in rs]) for k, _ in CREDIT_KEYS) + " |")
    return "\n".join(lines)


def probe_table(results: list[dict]) -> str:
    """The extractor probe at each run's start and end, per variant (mean over seeds)."""
    labels = [lab for lab in dict.fromkeys(r["label"] for r in results)
              if any(r["start"].get("extractor_probe_correct") is not None for r in results if r["label"] == lab)]
    if not labels:
        return ""
    lines = ["The extractor probe (64 held-out trajectories of the seen dungeons, distilled greedily; trainers/probe.py), "
             "mean ± sd over seeds, start → end.", "",
             "| variant | seeds | entries right | entries wrong | unverifiable | answers that parse |", "|---|---:|---|---|---|---|"]
    for lab in labels:
        rs = [r for r in results if r["label"] == lab]
        cells = [f"{mean_sd([r['start'].get('extractor_' + k) for r in rs])} → {mean_sd([r['end'].get('extractor_' + k) for r in rs])}"
                 for k in PROBE_KEYS]
        lines.append(f"| {lab} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

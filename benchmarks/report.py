"""The results page: benchmarks/results/*.json -> docs/results.md and figures in docs/img/results/.

    python benchmarks/report.py                                   # after benchmarks/study.py and the bench_* scripts
    python benchmarks/report.py --results-dir R --out D           # D/results.md, D/img/results/*.png

Study files (study*.json, written by benchmarks/study.py): their table, one figure per variant of the
training curves with and without experience (policy/success_*; mean over seeds, a light line per
seed) and of the held-out eval curves (eval/success_*), and the command and commit that made them.
Studies are listed newest first. Held-out comparisons (heldout*.json, experiments/heldout.py) and entry
probes (entry_probe*.json, benchmarks/entry_probe.py) follow.
Benchmark files (bench_*.json): their .md table with the command and commit. The section
"Comparison with the paper" is read from <out>/results_discussion.md, written by a person, so a
regeneration keeps it. Deterministic: the same results give the same markdown.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DISCUSSION = "results_discussion.md"
TRAIN_KEYS = (("policy/success_with_exp", "with experience", "tab:blue"),
              ("policy/success_without_exp", "without experience", "tab:orange"))
EVAL_KEYS = (("eval/success_with_exp", "with experience, greedy", "tab:blue"),
             ("eval/success_without_exp", "without experience, greedy", "tab:orange"),
             ("eval/success_with_exp_sampled", "with experience, sampled", "tab:cyan"),
             ("eval/success_without_exp_sampled", "without experience, sampled", "tab:red"),
             # recurring task sets: tasks never trained on
             ("eval/success_unseen_with_exp", "unseen tasks, with experience, greedy", "tab:purple"),
             ("eval/success_unseen_without_exp", "unseen tasks, without experience, greedy", "tab:brown"))
# Recurring task sets: is what the library says true (envs/entry_check.py), and is it retrieved for its own task?
TRUTH_KEYS = (("library/entry_correct_share", "library entries right", "tab:green"),
              ("extractor/new_entry_correct_share", "new entries right (per step)", "tab:olive"),
              ("retrieval/same_task_rate", "retrievals of the task's own entry", "tab:gray"))


def study_command(d: dict) -> str:
    """The command as recorded (argv), or rebuilt from the parsed args of an older file."""
    if d.get("argv"):
        return shlex.join(d["argv"])
    a = d.get("args", {})
    parts = ["python", "benchmarks/study.py"]
    if a.get("quick"):
        parts.append("--quick")
    else:
        for k in ("variants", "seeds", "steps", "eval_episodes"):
            if k in a:
                parts += [f"--{k.replace('_', '-')}", str(a[k])]
        parts += [x for s in a.get("set", []) for x in ("--set", s)]
        if a.get("ablations"):
            parts.append("--ablations")
    if a.get("out"):
        parts += ["--out", a["out"]]
    return shlex.join(parts)


def bench_command(name: str, d: dict) -> str:
    """The command as recorded (argv, e.g. a bench filed under another name with --out), else rebuilt."""
    if d.get("argv"):
        return shlex.join(["python", *d["argv"]])
    return f"python benchmarks/{name}.py" + (" --quick" if d.get("quick") else "")


def _plot_panel(ax, runs: list[dict], keys, title: str, ylabel: str = "success") -> bool:
    drawn = False
    for key, label, color in keys:
        series = [np.asarray(r.get("curves", {}).get(key, []), dtype=float) for r in runs]
        series = [s for s in series if s.size]
        if not series:
            continue
        for s in series:  # one light line per seed
            ax.plot(s[:, 0], s[:, 1], color=color, alpha=0.25, linewidth=0.8)
        steps = sorted(set().union(*(s[:, 0].tolist() for s in series)))
        mean = [np.mean([s[s[:, 0] == st, 1][-1] for s in series if (s[:, 0] == st).any()]) for st in steps]
        ax.plot(steps, mean, color=color, linewidth=2, marker="o" if len(steps) < 12 else None, markersize=3,
                label=f"{label} (mean of {len(series)})")
        drawn = True
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    return drawn


def study_figures(stem: str, d: dict, img_dir: Path) -> list[tuple[str, Path]]:
    """One PNG per variant label: training success (left) and held-out eval success (right)."""
    out = []
    labels = list(dict.fromkeys(r.get("label", r.get("variant", "?")) for r in d.get("runs", [])))
    for lab in labels:
        runs = [r for r in d["runs"] if r.get("label", r.get("variant")) == lab]
        truth = any(k in r.get("curves", {}) for r in runs for k, _, _ in TRUTH_KEYS)
        fig, axes = plt.subplots(1, 3 if truth else 2, figsize=(15 if truth else 10, 3.6))
        _plot_panel(axes[0], runs, TRAIN_KEYS, f"{lab}: training rollouts")
        _plot_panel(axes[1], runs, EVAL_KEYS, f"{lab}: evaluation (seen tasks, with a task set)")
        if truth:
            _plot_panel(axes[2], runs, TRUTH_KEYS, f"{lab}: entry correctness", ylabel="share")
        fig.suptitle(f"{stem} / {lab} ({len(runs)} seed{'s' if len(runs) != 1 else ''})", fontsize=11)
        fig.tight_layout()
        path = img_dir / f"{stem}-{lab}.png"
        fig.savefig(path, dpi=90, metadata={"Software": None})  # no version stamp: same input, same file
        plt.close(fig)
        out.append((lab, path))
    return out


VARIANT_COLORS = {"grpo": "tab:gray", "static": "tab:orange", "exp_only": "tab:purple", "complementary": "tab:blue"}


def study_probe_figure(stem: str, d: dict, img_dir: Path) -> Path | None:
    """The extractor across variants (where the runs measured the probe, trainers/probe.py): the probe's entries right
    (left) and the library's entries right (right), one line per variant, the mean of its seeds."""
    runs = [r for r in d.get("runs", []) if "extractor/probe_correct" in r.get("curves", {})]
    if not runs:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, title in ((axes[0], "extractor/probe_correct", "extractor probe: entries right (held-out, greedy)"),
                           (axes[1], "library/entry_correct_share", "library: entries right")):
        keys = []
        for lab in dict.fromkeys(r.get("label", r.get("variant")) for r in runs):
            keys.append((lab, [r for r in runs if r.get("label", r.get("variant")) == lab]))
        for lab, rs in keys:
            _plot_panel(ax, rs, ((key, lab, VARIANT_COLORS.get(lab, "tab:green")),), title, ylabel="share")
    fig.suptitle(f"{stem}: the extractor's skill by variant", fontsize=11)
    fig.tight_layout()
    path = img_dir / f"{stem}-probe.png"
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path


def _strip_title(md: str) -> str:
    """A results .md starts with '# name' and often a 'commit ...' line; the page gives its own heading and commit."""
    lines = md.strip().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
        while lines and not lines[0].strip():
            lines = lines[1:]
        if lines and lines[0].startswith("commit "):
            lines = lines[1:]
    return "\n".join(lines).strip()


def _argv_section(results_dir: Path, pattern: str, finished, title: str, intro: str) -> list[str]:
    """A section of result files that record their own argv (held-out comparisons, entry probes), newest
    first: each with its command, commit and .md table. Empty when there is none."""
    paths = sorted(results_dir.glob(pattern), key=lambda p: (finished(p), p.name), reverse=True)
    md = [f"## {title}", "", intro, ""] if paths else []
    for path in paths:
        d = json.loads(path.read_text())
        env = d.get("environment", {})
        table_md = path.with_suffix(".md")
        md += [f"### {path.stem}", "", f"Command: `{shlex.join(d.get('argv', []))}`  ",
               f"Commit: `{env.get('commit', '?')}`, finished {env.get('time', '?')}.", "",
               _strip_title(table_md.read_text()) if table_md.exists() else "(no table: the .md file is missing)", ""]
    return md


def build(results_dir: Path, out: Path) -> Path:
    img_dir = out / "img" / "results"
    img_dir.mkdir(parents=True, exist_ok=True)
    rel_img = img_dir.relative_to(out)
    md = ["# Results", "",
          "Generated by `python benchmarks/report.py` from `benchmarks/results/*.json`; do not edit by hand "
          f"(the discussion lives in `{DISCUSSION}`).", ""]
    def finished(path: Path) -> str:
        try:
            return json.loads(path.read_text()).get("environment", {}).get("time", "")
        except (OSError, json.JSONDecodeError):
            return ""

    studies = sorted(results_dir.glob("study*.json"), key=lambda p: (finished(p), p.name), reverse=True)  # newest first
    md += ["## Studies", "", "Newest first.", ""]
    if not studies:
        md += ["No study results yet: run `python benchmarks/study.py`.", ""]
    for path in studies:
        d = json.loads(path.read_text())
        env = d.get("environment", {})
        md += [f"### {path.stem}", "",
               f"Command: `{study_command(d)}`" + ("" if d.get("argv") else " (rebuilt from the recorded args)") + "  ", f"Commit: `{env.get('commit', '?')}`, {env.get('cpus', '?')} CPUs, "
               f"torch {env.get('torch', '?')}, finished {env.get('time', '?')}.", ""]
        table_md = path.with_suffix(".md")
        md += [_strip_title(table_md.read_text()) if table_md.exists() else "(no table: the .md file is missing)", ""]
        probe_fig = study_probe_figure(path.stem, d, img_dir)
        if probe_fig is not None:
            md += [f"![{path.stem} extractor probe]({rel_img.as_posix()}/{probe_fig.name})", ""]
        for lab, fig in study_figures(path.stem, d, img_dir):
            md += [f"![{path.stem} {lab}]({rel_img.as_posix()}/{fig.name})", ""]
    md += _argv_section(results_dir, "heldout*.json", finished, "Held-out comparisons",
                        "Policies side by side on the same held-out seeds (`experiments/heldout.py`), with more episodes "
                        "than a run's periodic evaluation.")
    md += _argv_section(results_dir, "entry_probe*.json", finished, "Does the policy read an entry?",
                        "The same held-out seeds with no entry, the warm-start teacher's correct entry and a wrong one "
                        "(`benchmarks/entry_probe.py`).")
    md += _argv_section(results_dir, "copy_probe*.json", finished, "Can a tiny policy learn to copy the task's object?",
                        "A synthetic ALFWorld-like turn where only copying the task's object into \"take\" is right, "
                        "trained three ways from the same start (`experiments/copy_probe.py`).")
    md += ["## Benchmarks", ""]
    for path in sorted(results_dir.glob("bench_*.json")):
        d = json.loads(path.read_text())
        env = d.get("environment") or {}
        table_md = path.with_suffix(".md")
        md += [f"### {path.stem}", "", f"Command: `{bench_command(path.stem, d)}`  ",
               f"Commit: `{env.get('commit', 'not recorded')}`" + (f", {env['time']}" if env.get("time") else "") + ".", "",
               _strip_title(table_md.read_text()) if table_md.exists() else "(no table: the .md file is missing)", ""]
    md += ["## Comparison with the paper", ""]
    disc = out / DISCUSSION
    md += [disc.read_text().strip() if disc.exists() else f"_Missing: write `{DISCUSSION}` next to this file; it is included here._", ""]
    page = out / "results.md"
    page.write_text("\n".join(md))
    return page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--out", default=str(ROOT / "docs"), help="writes <out>/results.md and <out>/img/results/")
    args = ap.parse_args(argv)
    page = build(Path(args.results_dir), Path(args.out))
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())

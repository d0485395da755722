"""The results page: docs/results_template.md filled in from benchmarks/results/ -> docs/results.md, and the figures it
names in docs/img/results/.

    python benchmarks/report.py                                   # after a study, a probe or a bench_* script
    python benchmarks/report.py --results-dir R --out D           # D/results.md (and D/img/results/*.png)

The page is <out>/results_template.md with its directives replaced; each directive stands alone on a line:

    {{source NAME}}                         where NAME.md / NAME.json come from: the link, the commit it ran at and the
                                            command that made it (`script=PATH` names the script of a file that
                                            recorded only its parsed args)
    {{table NAME [N] [; cols: H | H => LABEL ...] [; rows: PREFIX | ...]}}
                                            the N-th table (1 = the first) of NAME.md as written by the script that
                                            made it: only the columns named (in that order, => renames one) and the
                                            rows whose first cell starts with a prefix given
    {{curves NAME: KEY | KEY ...}}          a study's runs, one row each: first -> last value of each curve key
    {{series NAME [from=S]}}                a run's series file (NAME.json with "series" and "ab_tests", e.g. the
                                            demo's): training success with and without experience (mean of the steps
                                            from S on), the last evaluation, the library, and each A/B test
    {{figure NAME LABEL}}                   a study's figure for one variant label (or `probe`: the extractor probe by
                                            variant), drawn into <out>/img/results/

Everything else is prose written by hand: it states the claim and quotes figures from the files its section names,
which tests/test_results_page.py checks. A results folder without a template (your own runs) gets a catalogue
instead: every study, probe and benchmark file in it, newest first, with its table, command and commit. Both are
deterministic: the same files give the same markdown and the same PNGs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = "results_template.md"
DISCUSSION = "results_discussion.md"  # the catalogue's hand-written closing section, where <out> has one
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
VARIANT_COLORS = {"grpo": "tab:gray", "static": "tab:orange", "exp_only": "tab:purple", "complementary": "tab:blue"}


# -- commands and commits ---------------------------------------------------------------------------------------------


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


def args_command(script: str, args: dict) -> str:
    """`python SCRIPT --key value ...` from an argparse namespace saved as a dict (lists repeat the flag, True is a bare
    flag; False, None and '' are left out, as the defaults they were)."""
    parts = ["python", script]
    for k, v in args.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            parts.append(flag)
        elif v is not False and v is not None and v != "":
            parts += [x for item in (v if isinstance(v, list) else [v]) for x in (flag, str(item))]
    return shlex.join(parts)


def command_of(name: str, d: dict, script: str | None = None) -> str:
    """How a results file was made, as the page prints it: the command it recorded, or one rebuilt (and said so)."""
    if d.get("argv"):
        argv = list(d["argv"])
        return f"`{shlex.join(argv if argv[0].startswith('python') else ['python', *argv])}`"
    if isinstance(d.get("command"), str):
        return f"`{d['command']}`"
    if name.startswith("study"):
        return f"`{study_command(d)}` (rebuilt from the recorded arguments)"
    if script and isinstance(d.get("args"), dict):
        return f"`{args_command(script, d['args'])}` (rebuilt from the recorded arguments)"
    if isinstance(d.get("what"), str):
        return f"the steps its `what` field records: {d['what']}"
    if script:
        return f"`python {script}` (the file records no arguments)"
    return f"`{bench_command(name, d)}` (the benchmark's default run: the file records no command)"


def commit_of(d: dict) -> str:
    return (d.get("environment") or {}).get("commit") or d.get("commit") or ""


# -- figures ----------------------------------------------------------------------------------------------------------


def _pyplot():
    """matplotlib only where a figure is drawn: filling in the page's text needs none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    return plt, MaxNLocator


def _plot_panel(ax, runs: list[dict], keys, title: str, ylabel: str = "success") -> bool:
    _, MaxNLocator = _pyplot()
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


def _labels(d: dict) -> list[str]:
    return list(dict.fromkeys(r.get("label", r.get("variant", "?")) for r in d.get("runs", [])))


def study_figures(stem: str, d: dict, img_dir: Path, labels: list[str] | None = None) -> list[tuple[str, Path]]:
    """One PNG per variant label: training success (left) and held-out eval success (right)."""
    plt, _ = _pyplot()
    out = []
    for lab in labels if labels is not None else _labels(d):
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


def study_probe_figure(stem: str, d: dict, img_dir: Path) -> Path | None:
    """The extractor across variants (where the runs measured the probe, trainers/probe.py): the probe's entries right
    (left) and the library's entries right (right), one line per variant, the mean of its seeds."""
    runs = [r for r in d.get("runs", []) if "extractor/probe_correct" in r.get("curves", {})]
    if not runs:
        return None
    plt, _ = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, title in ((axes[0], "extractor/probe_correct", "extractor probe: entries right (held-out, greedy)"),
                           (axes[1], "library/entry_correct_share", "library: entries right")):
        for lab in dict.fromkeys(r.get("label", r.get("variant")) for r in runs):
            rs = [r for r in runs if r.get("label", r.get("variant")) == lab]
            _plot_panel(ax, rs, ((key, lab, VARIANT_COLORS.get(lab, "tab:green")),), title, ylabel="share")
    fig.suptitle(f"{stem}: the extractor's skill by variant", fontsize=11)
    fig.tight_layout()
    path = img_dir / f"{stem}-probe.png"
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path


# -- markdown tables --------------------------------------------------------------------------------------------------


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


def md_tables(text: str) -> list[list[list[str]]]:
    """Every table of a markdown text, each a list of rows of cells (the header first, then the alignment row)."""
    tables, cur = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cur.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip().removeprefix("|").removesuffix("|"))])
        elif cur:
            tables.append(cur)
            cur = []
    return tables


def pick_table(table: list[list[str]], cols: list[str] | None, rows: list[str] | None, where: str) -> str:
    header, align, body = table[0], table[1], table[2:]
    idx, names = list(range(len(header))), list(header)
    if cols:
        idx, names = [], []
        for spec in cols:
            col, _, label = (s.strip() for s in spec.partition("=>"))
            if col not in header:
                raise ValueError(f"{where}: no column {col!r} (columns: {header})")
            idx.append(header.index(col))
            names.append(label or col)
    if rows:
        body = [r for r in body if any(r[0].replace("**", "").startswith(p) for p in rows)]
        if not body:
            raise ValueError(f"{where}: no row starts with any of {rows}")
    line = lambda cells: "| " + " | ".join(cells) + " |"  # noqa: E731
    return "\n".join([line(names), line([align[i] if i < len(align) else "---" for i in idx])]
                     + [line([r[i] if i < len(r) else "" for i in idx]) for r in body])


# -- the page from its template ---------------------------------------------------------------------------------------

DIRECTIVE = re.compile(r"^\{\{\s*(source|table|curves|series|figure)\s+(.*?)\s*\}\}$")


class Page:
    def __init__(self, results_dir: Path, out: Path, draw: bool):
        self.results, self.out, self.draw = results_dir, out, draw
        self.rel = Path(os.path.relpath(results_dir, out)).as_posix()
        self.img_dir = out / "img" / "results"

    def _json(self, name: str) -> dict:
        path = self.results / f"{name}.json"
        if not path.is_file():
            raise FileNotFoundError(f"the template names {name}, but {path} does not exist")
        return json.loads(path.read_text())

    def _md(self, name: str) -> str:
        path = self.results / f"{name}.md"
        if not path.is_file():
            raise FileNotFoundError(f"the template names {name}.md, but {path} does not exist")
        return path.read_text()

    def source(self, arg: str) -> str:
        name, *opts = arg.split()
        script = next((o.split("=", 1)[1] for o in opts if o.startswith("script=")), None)
        d = self._json(name)
        link = (f"[`{name}.md`]({self.rel}/{name}.md) ([json]({self.rel}/{name}.json))"
                if (self.results / f"{name}.md").is_file() else f"[`{name}.json`]({self.rel}/{name}.json)")
        commit, when = commit_of(d), (d.get("environment") or {}).get("time")
        runs = sorted({r.get("commit") for r in d.get("runs", []) if r.get("commit")} - {commit})
        made = f"commit `{commit}`" if commit else "commit not recorded in the file"
        if runs:
            made += " (its runs at " + ", ".join(f"`{c}`" for c in runs) + ")"
        if when:
            made += f", finished {when}"
        return f"*Source:* {link}, {made}; made by {command_of(name, d, script)}."

    def table(self, arg: str) -> str:
        head, *parts = [p.strip() for p in arg.split(";")]
        name, *n = head.split()
        cols = rows = None
        for p in parts:
            key, _, val = p.partition(":")
            vals = [v.strip() for v in val.split("|") if v.strip()]
            if key.strip() == "cols":
                cols = vals
            elif key.strip() == "rows":
                rows = vals
            else:
                raise ValueError(f"table {name}: unknown option {p!r}")
        tables = md_tables(self._md(name))
        i = int(n[0]) if n else 1
        if not 1 <= i <= len(tables):
            raise ValueError(f"{name}.md has {len(tables)} tables, not {i}")
        return pick_table(tables[i - 1], cols, rows, f"{name}.md table {i}")

    def curves(self, arg: str) -> str:
        name, _, keys = arg.partition(":")
        keys = [k.strip() for k in keys.split("|") if k.strip()]
        d = self._json(name.strip())
        lines = ["| run | " + " | ".join(f"{k} (first → last)" for k in keys) + " |",
                 "|---|" + "---|" * len(keys)]
        for r in d.get("runs", []):
            cells = []
            for k in keys:
                s = r.get("curves", {}).get(k)
                cells.append(f"{s[0][1]:.2f} → {s[-1][1]:.2f}" if s else "–")
            if any(c != "–" for c in cells):
                lines.append(f"| {r.get('label', r.get('variant'))} seed {r.get('seed')} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def series(self, arg: str) -> str:
        name, *opts = arg.split()
        start = int(next((o.split("=", 1)[1] for o in opts if o.startswith("from=")), 1))
        d = self._json(name)
        s = d["series"]
        last = lambda k: s[k][-1] if s.get(k) else None  # noqa: E731
        rows = ["| measure | with experience | without experience |", "|---|---|---|"]
        w = {st: v for st, v in s.get("policy/success_with_exp", []) if st >= start}
        wo = {st: v for st, v in s.get("policy/success_without_exp", []) if st >= start}
        both = sorted(set(w) & set(wo))
        if both:
            above = sum(w[st] > wo[st] for st in both)
            mean_w, mean_wo = statistics.mean(w[st] for st in both), statistics.mean(wo[st] for st in both)
            rows.append(f"| training rollouts, mean success of steps {both[0]}–{both[-1]} | {mean_w:.2f} "
                        f"(above without on {above} of {len(both)} steps) | {mean_wo:.2f} |")
        for pre, suf, label in (("", "", "held-out, seen tasks, greedy"),
                                ("", "_sampled", "held-out, seen tasks, sampled"),
                                ("unseen_", "", "held-out, unseen tasks, greedy"),
                                ("unseen_", "_sampled", "held-out, unseen tasks, sampled")):
            cells = []
            for arm in ("with_exp", "without_exp"):
                k = f"eval/success_{pre}{arm}{suf}"
                v, lo, hi = last(k), last(k + "_ci_low"), last(k + "_ci_high")
                cells.append(f"{v[1]:.3f} [{lo[1]:.2f}, {hi[1]:.2f}] (step {v[0]})" if v and lo and hi
                             else f"{v[1]:.3f} (step {v[0]})" if v else "–")
            if any(c != "–" for c in cells):
                rows.append(f"| {label} | {cells[0]} | {cells[1]} |")
        lib, size = s.get("library/entry_correct_share"), last("library/size")
        if lib:
            rows.append(f"| library entries right, step {lib[0][0]} → {lib[-1][0]} | {lib[0][1]:.2f} → {lib[-1][1]:.2f}"
                        + (f" ({size[1]:.0f} entries)" if size else "") + " | – |")
        for t in d.get("ab_tests", []):
            res, cfg = t.get("results") or {}, t.get("config") or {}
            arms = res.get("arms", {})
            if not arms:
                continue
            fmt = lambda a: (f"{a['successes']}/{a['n']} = {a['rate']:.2f} "  # noqa: E731
                             f"[{a['ci_low']:.2f}, {a['ci_high']:.2f}]")
            rows.append(f"| A/B test \"{t.get('name')}\" ({cfg.get('decoding')}, {cfg.get('episodes_per_task')} "
                        f"episodes × {len(cfg.get('seeds', []))} tasks): A vs B, diff {res.get('diff', 0):+.2f}, unpaired p = "
                        f"{res.get('p_value', float('nan')):.2g} | A {fmt(arms['A'])} | B {fmt(arms['B'])} |")
        return "\n".join(rows)

    def figure(self, arg: str) -> str:
        name, label = arg.split()
        file = f"{name}-{label}.png"
        if self.draw:
            self.img_dir.mkdir(parents=True, exist_ok=True)
            d = self._json(name)
            if label == "probe":
                if study_probe_figure(name, d, self.img_dir) is None:
                    raise ValueError(f"{name}: no run measured the extractor probe")
            elif label not in _labels(d):
                raise ValueError(f"{name}: no variant {label!r} (variants: {_labels(d)})")
            else:
                study_figures(name, d, self.img_dir, [label])
        return f"![{name} {label}](img/results/{file})"

    def render(self, template: str) -> str:
        out = []
        for line in template.splitlines():
            m = DIRECTIVE.match(line.strip())
            out.append(getattr(self, m.group(1))(m.group(2)) if m else line)
        return "\n".join(out).rstrip() + "\n"


def render_page(results_dir: Path, out: Path, draw: bool = True, template: Path | None = None) -> str:
    """The page's markdown from its template (draw: also write the figures it names)."""
    return Page(results_dir, out, draw).render((template or out / TEMPLATE).read_text())


# -- a catalogue of every result file (a results folder without a template) ------------------------------------------


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


def build_catalogue(results_dir: Path, out: Path) -> str:
    img_dir = out / "img" / "results"
    img_dir.mkdir(parents=True, exist_ok=True)
    rel_img = img_dir.relative_to(out)
    md = ["# Results", "",
          "Generated by `python benchmarks/report.py` from every result file in the folder, newest first; do not edit "
          f"by hand (the closing discussion lives in `{DISCUSSION}`).", ""]

    def finished(path: Path) -> str:
        try:
            return json.loads(path.read_text()).get("environment", {}).get("time", "")
        except (OSError, json.JSONDecodeError):
            return ""

    studies = sorted(results_dir.glob("study*.json"), key=lambda p: (finished(p), p.name), reverse=True)
    md += ["## Studies", "", "Newest first.", ""]
    if not studies:
        md += ["No study results yet: run `python benchmarks/study.py`.", ""]
    for path in studies:
        d = json.loads(path.read_text())
        env = d.get("environment", {})
        md += [f"### {path.stem}", "",
               f"Command: `{study_command(d)}`" + ("" if d.get("argv") else " (rebuilt from the recorded args)") + "  ",
               f"Commit: `{env.get('commit', '?')}`, {env.get('cpus', '?')} CPUs, "
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
    return "\n".join(md)


def build(results_dir: Path, out: Path) -> Path:
    """<out>/results.md: the template filled in where <out> has one, else the catalogue."""
    page = out / "results.md"
    text = render_page(results_dir, out) if (out / TEMPLATE).is_file() else build_catalogue(results_dir, out)
    page.write_text(text)
    return page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--out", default=str(ROOT / "docs"),
                    help=f"writes <out>/results.md (from <out>/{TEMPLATE} where it exists) and <out>/img/results/")
    args = ap.parse_args(argv)
    try:
        page = build(Path(args.results_dir), Path(args.out))
    except (FileNotFoundError, ValueError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Behaviour unchanged? Deterministic 2-step runs of the code at a git revision and of the working tree, compared.

    python experiments/refactor_check.py --before HEAD~3                 # learn, eval, tools
    python experiments/refactor_check.py --before main --cases learn,ray --keep /tmp/check
    python experiments/refactor_check.py --before HEAD --after TREE --cases learn   # two revisions or trees

Each case is a real `comprl train` (run.deterministic, 2 steps) on the same tiny untrained models and the same seeded
library, run once in a `git archive` of REV and once in the working tree. Every logged (key, step) value must be
equal, except wall-clock ones (`TIMED`, printed), with the same keys, the same library rows (text, status, counters)
and the same final policy and extractor weights. Exit status 0 when all are identical. A refactor that is meant to
change nothing (issue 27) shows it with this; the same code against itself compares identical.

Cases: learn (actor step, CISPO on retrieved entries, merge), eval (held-out evaluation, merge, retrieval),
tools (learn plus search-and-ask and the actor as critic), ray (eval on the Ray executor: env actors, rollout engine).
The untrained policy fails every episode, so every CISPO sample's reward is -1 (0 with the critic) and its advantage 0:
the extractor's update runs but moves nothing, and a change to its loss or log-probs shows in no number here.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENV = "minihack/Room-5x5"
LEARNING = ["rollout.constrain_actions=true", "env.max_turns=8", "extractor.buffer_size=2", "run.eval_episodes=0"]
CASES = {
    "learn": LEARNING,
    "eval": [],
    "tools": LEARNING + ["rollout.search_and_ask=2", "rollout.actor_critic=true"],
    "ray": ["run.executor=ray", "ray.num_cpus=2", "ray.env_actors=2", "ray.rollout_engine=true"],
}
TIMED = ("time/", "latency", "_per_s", "rollout/seconds", "rollout/retrieval_s")  # wall-clock metrics: not compared


def build_models(d: Path) -> Path:
    from trainers import prompts as P
    from trainers.tiny import build_tiny_qwen2, build_tokenizer, save_model_folder

    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, P.EXTRACTOR_USER, "north east south west"] * 30, vocab_size=400)
    for name in ("policy", "extractor"):
        save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=1), tok, d / name)
    return d


def seed_library(url: str, models: Path, n: int = 4) -> None:
    """Entries as the extractor writes them (with its generations), so retrieved ones become CISPO samples."""
    from core.library_io import import_library
    from core.store import ExperienceStore
    from core.types import format_entry_text
    from trainers import prompts as P
    from trainers.backends.hf import HFBackend

    backend = HFBackend(models / "extractor", device="cpu", num_threads=1)
    tasks = [f"Reach the stairs in room {i}." for i in range(n)]
    prompts = [list(backend.apply_chat_template([{"role": "system", "content": P.EXTRACTOR_SYSTEM}, {"role": "user", "content": t}],
                                                add_generation_prompt=True, tokenize=True)) for t in tasks]
    outs = backend.generate(prompts, max_new_tokens=8, temperature=1.0, seed=0)
    lines = [{"text": format_entry_text(f"Tip {i}", "MiniHack rooms", f"Move {d} first, then look for the > sign."),
              "env": ENV, "task": t, "source": "extracted",
              "generation": {"prompt": t, "response": o.text, "prompt_ids": p, "response_ids": list(o.token_ids),
                             "response_logprobs": list(o.logprobs)}}
             for i, (d, t, p, o) in enumerate(zip(["north", "east", "south", "west"] * n, tasks, prompts, outs))]
    store = ExperienceStore(url)
    imported = import_library(store, lines=[json.dumps(x) for x in lines]).imported
    store.close()
    if imported != n:
        raise RuntimeError(f"seeded {imported} of {n} library entries")


def run_case(code: Path, work: Path, models: Path, case: str) -> dict:
    """One deterministic 2-step run of `comprl train` from the code in `code`: its metrics, library and run status."""
    from core.store import ExperienceStore

    work.mkdir(parents=True)
    url = f"sqlite:///{work / 'workbench.db'}"
    seed_library(url, models)
    cfg = work / "run.yaml"
    cfg.write_text(f"""
run: {{name: refactor-check, variant: complementary, max_steps: 2, eval_episodes: 2, checkpoint_every: 1, threads: 1, deterministic: true}}
env: {{names: {{{ENV}: 1.0}}, max_turns: 3}}
actor: {{path: {models / 'policy'}, max_new_tokens: 4}}
rollout: {{tasks_per_step: 1, group_size: 4, with_experience: 2}}
extractor: {{model: {{path: {models / 'extractor'}, max_new_tokens: 24}}, buffer_size: 4, merge_every: 2}}
""")
    sets = [a for s in CASES[case] for a in ("--set", s)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(code)}
    p = subprocess.run([sys.executable, "-m", "app.cli", "train", str(cfg), *sets, "--data-dir", str(work / "data"), "--db", url],
                       cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{case} in {code}: comprl train failed:\n{p.stdout[-3000:]}")
    store = ExperienceStore(url)
    run = store.list_runs()[0]
    rows = store.metrics_since(run["id"])
    entries = [[e.id, e.text, e.status.value, e.retrieved_count, e.successes, e.failures]
               for e in store.list_entries(status=None, limit=1000).entries]
    store.close()
    return {"status": run["status"], "metrics": sorted([k, s, v] for _, k, s, v, _ in rows), "entries": entries}


def final_weights(work: Path) -> dict[str, dict]:
    from safetensors.torch import load_file

    marks = sorted((work / "data").rglob("latest"))
    if len(marks) != 1:
        raise RuntimeError(f"expected one checkpoint folder under {work / 'data'}, found {len(marks)}")
    last = marks[0].parent / marks[0].read_text().strip()
    return {m: load_file(str(last / m / "model.safetensors")) for m in ("policy", "extractor")}


def compare(case: str, a: dict, b: dict, wa: dict, wb: dict) -> bool:
    import torch

    ma, mb = ({(k, s): v for k, s, v in x["metrics"]} for x in (a, b))
    timed = sorted({k for k, _ in ma if any(t in k for t in TIMED)})
    keys_differ = sorted(set(ma) ^ set(mb))
    values_differ = sorted(x for x in set(ma) & set(mb) if not any(t in x[0] for t in TIMED) and ma[x] != mb[x])
    compared = sum(1 for x in ma if not any(t in x[0] for t in TIMED))
    same_library = a["entries"] == b["entries"]
    same_weights = {m: wa[m].keys() == wb[m].keys() and all(torch.equal(wa[m][k], wb[m][k]) for k in wa[m]) for m in wa}
    ok = not keys_differ and not values_differ and same_library and a["status"] == b["status"] and all(same_weights.values())
    print(f"[{case}] {compared} (key, step) values compared exactly; wall-clock keys skipped: {', '.join(timed) or 'none'}")
    print(f"[{case}] keys in one run only: {keys_differ or 'none'}; values that differ: {values_differ or 'none'}; "
          f"library identical: {same_library}; weights identical: {same_weights}; {'IDENTICAL' if ok else 'DIFFERENT'}")
    for k, s in values_differ:  # how far apart: rounding, or a real change?
        d = abs(ma[k, s] - mb[k, s])
        print(f"[{case}]   {k} @ step {s}: {ma[k, s]!r} -> {mb[k, s]!r} (abs {d:.3g}, rel {d / max(abs(ma[k, s]), 1e-30):.3g})")
    for m, same in same_weights.items():
        if not same and wa[m].keys() == wb[m].keys():
            d = max(float((wa[m][k].double() - wb[m][k].double()).abs().max()) for k in wa[m])
            scale = max(float(wa[m][k].double().abs().max()) for k in wa[m])
            print(f"[{case}]   {m} weights: largest abs difference {d:.3g} (largest abs weight {scale:.3g})")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="HEAD", help="the git revision to compare the working tree with (default HEAD)")
    ap.add_argument("--after", default="", help="a git revision or tree to compare instead of the working tree (e.g. one "
                                                "change alone while others edit the tree: `git write-tree` of a temporary index)")
    ap.add_argument("--cases", default="learn,eval,tools", help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--keep", default="", help="keep the runs' folders here (default: a temporary folder, removed)")
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case {unknown[0]}; choose from {', '.join(CASES)}")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        before = base / "before-tree"
        before.mkdir(parents=True, exist_ok=False)
        archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, stdout=subprocess.PIPE, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        after = ROOT
        if args.after:
            after = base / "after-tree"
            after.mkdir(parents=True, exist_ok=False)
            archive = subprocess.run(["git", "archive", args.after], cwd=ROOT, stdout=subprocess.PIPE, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(after)], input=archive, check=True)
        models = build_models(base / "models")
        ok = True
        for case in cases:
            a = run_case(before, base / "before" / case, models, case)
            b = run_case(after, base / "after" / case, models, case)
            ok &= compare(case, a, b, final_weights(base / "before" / case), final_weights(base / "after" / case))
    print(f"{args.before} vs {args.after or 'the working tree'}: {'IDENTICAL' if ok else 'DIFFERENT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

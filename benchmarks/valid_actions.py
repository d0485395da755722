"""Does a model answer with actions the env accepts? Valid-action rate by model x env x prompt style.

    python benchmarks/valid_actions.py --policy smollm2=comprl_data/models/smollm2-135m-instruct \
        --env minihack/Room-5x5 --env alfworld/pick_and_place --styles compact,chat --seeds 32 --turns 3
    python benchmarks/valid_actions.py --policy smollm2=… --env … --styles chat --decoding free,constrained \
        --temperatures 0,1 --out valid_actions_smollm2_constrained

Each (model, env, style) plays the same held-out seeds greedily through the real Roller (the prompts,
parsing and back end a run uses) for `--turns` turns. Reported per cell: actions sent, the share the
env accepted (not `invalid_action`: the rate the issue's target is about), and the share whose reply
was an admissible action as it stood (after stripping quotes, "Action:" and a final period), i.e.
without the tolerant parser picking an action out of extra words; also the episodes that succeeded within the
turns played and the mean reward. `--decoding constrained` plays the same cells with rollout.constrain_actions on
(replies decoded constrained to the env's admissible actions). Writes benchmarks/results/<out>.json and .md after
every cell, so a run cut short keeps what it measured.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import environment, write_results  # noqa: E402

SEED_OFFSET = 2_000_000  # held out from every training seed range of the shipped configs


def run_cell(actor, env: str, style: str, *, seeds: int, turns: int, batch: int, max_new_tokens: int,
             temperature: float = 0.0, templates_file: str = "", constrain: bool = False) -> dict:
    from envs.pool import EnvPool
    from trainers.config import ModelSection, RolloutSection
    from trainers.prompts import load_templates
    from trainers.parsing import _clean, _norm
    from trainers.rollout import EpisodeSpec, Roller

    rc = RolloutSection(prompt_style=style, history_turns=4 if style == "chat" else 2, history_chars=3000 if style == "chat" else 1200,
                        constrain_actions=constrain)
    ac = ModelSection(temperature=temperature, max_new_tokens=max_new_tokens)
    pool = EnvPool([env] * batch, num_workers=1)  # env names: the pool builds each in its worker
    sent = accepted = exact = succeeded = 0
    reward = 0.0
    by_turn: dict[int, list[int]] = {}  # turn index -> [valid, sent]
    samples: list[dict] = []
    t0 = time.perf_counter()
    prefill = 0.0
    try:
        roller = Roller(actor, pool, None, rollout_cfg=rc, actor_cfg=ac, max_turns=turns, seed=0,
                        templates=load_templates(templates_file or None))
        for s in range(0, seeds, batch):
            specs = [EpisodeSpec(env, SEED_OFFSET + i, False, -1 - i) for i in range(s, min(seeds, s + batch))]
            stats: dict[str, float] = {}
            eps = roller.collect(specs, step=0, retrieval=False, metrics=stats)
            prefill += stats.get("rollout/prefill_tokens", 0.0)
            for e in eps:
                succeeded += e.success
                reward += e.reward
                for k, (st, turn) in enumerate(zip(e.traj.steps, e.turns)):
                    reply = actor.tokenizer.decode(turn.response_ids, skip_special_tokens=True)
                    sent += 1
                    ok = st.kind != "invalid"
                    accepted += ok
                    bt = by_turn.setdefault(k + 1, [0, 0])
                    bt[0] += ok
                    bt[1] += 1
                    first = next((ln for ln in reply.splitlines() if ln.strip()), "")
                    exact += ok and _norm(_clean(first)) == _norm(st.action)
                    if len(samples) < 12:
                        samples.append({"seed": e.spec.seed, "reply": reply[:120], "action": st.action, "valid": ok})
    finally:
        pool.close()
    dt = time.perf_counter() - t0
    return {"env": env, "style": style, "decoding": "constrained" if constrain else "free", "temperature": temperature,
            "episodes": seeds, "actions": sent, "valid": accepted, "successes": succeeded, "mean_reward": reward / max(1, seeds),
            "valid_rate": accepted / max(1, sent), "exact_rate": exact / max(1, sent), "seconds": dt,
            "prefill_tokens": prefill, "samples": samples,
            "valid_rate_by_turn": {t: v / max(1, n) for t, (v, n) in sorted(by_turn.items())}}


def table(rows: list[dict], turns: int, seeds: int) -> str:
    lines = ["| model | env | prompt style | decoding | temperature | episodes | actions | valid | valid rate | by turn (1, 2, …) "
             "| exact-reply rate | successes | mean reward | seconds |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        by_turn = ", ".join(f"{v:.2f}" for v in r["valid_rate_by_turn"].values())
        lines.append(f"| {r['model']} | {r['env']} | {r['style']} | {r.get('decoding', 'free')} | {r.get('temperature', 0.0):g} | "
                     f"{r['episodes']} | {r['actions']} | {r['valid']} | {r['valid_rate']:.3f} | {by_turn} | {r['exact_rate']:.3f} | "
                     f"{r.get('successes', '')} | {r.get('mean_reward', 0.0):.3f} | {r['seconds']:.0f} |")
    lines.append("")
    lines.append(f"{turns} turns per episode, seeds {SEED_OFFSET}..{SEED_OFFSET + seeds - 1}; temperature 0 is greedy, 1 samples as "
                 "the rollouts do (seeded). Valid: the env accepted the action. Exact reply: the reply's first line, stripped of "
                 "quotes, 'Action:' and a final period, was the admissible action itself (no words picked out of a longer reply). "
                 "Constrained: rollout.constrain_actions, each reply decoded constrained to the env's admissible actions "
                 "(trainers/models.py ActionChoice). Successes: episodes won within the turns played.")
    for r in rows:
        lines.append(f"\n{r['model']} / {r['env']} / {r['style']} / {r.get('decoding', 'free')} / T={r.get('temperature', 0.0):g}, "
                     "first replies:\n")
        for smp in r["samples"][:6]:
            lines.append(f"- seed {smp['seed']}: {smp['reply']!r} -> {smp['action']!r} ({'valid' if smp['valid'] else 'invalid'})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", action="append", required=True, metavar="NAME=FOLDER")
    ap.add_argument("--env", action="append", required=True)
    ap.add_argument("--styles", default="compact,chat")
    ap.add_argument("--decoding", default="free", help="comma-separated arms: free, constrained")
    ap.add_argument("--seeds", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="episodes played in lockstep")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--templates", default="", help="a YAML file overriding prompt templates (trainers/prompts.py names)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; 1: as the rollouts sample (seeded)")
    ap.add_argument("--temperatures", default="", help="comma-separated temperatures, each a cell (overrides --temperature)")
    ap.add_argument("--out", default="valid_actions")
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.decoding.split(",") if a.strip()]
    bad = [a for a in arms if a not in ("free", "constrained")]
    if bad or not arms:
        ap.error(f"--decoding takes free and/or constrained, not {args.decoding!r}")
    temps = [float(t) for t in args.temperatures.split(",") if t.strip()] if args.temperatures else [args.temperature]
    from trainers.models import HFBackend

    rows = []
    for spec in args.policy:
        name, _, folder = spec.partition("=")
        actor = HFBackend(folder, device="cpu", num_threads=args.threads)
        for env in args.env:
            for style in [s.strip() for s in args.styles.split(",") if s.strip()]:
                for temp in temps:
                    for arm in arms:
                        r = run_cell(actor, env, style, seeds=args.seeds, turns=args.turns, batch=args.batch,
                                     max_new_tokens=args.max_new_tokens, temperature=temp, templates_file=args.templates,
                                     constrain=arm == "constrained")
                        r["model"] = name
                        rows.append(r)
                        print(f"{name} {env} {style} {arm} T={temp:g}: {r['valid']}/{r['actions']} valid ({r['valid_rate']:.3f}), "
                              f"exact {r['exact_rate']:.3f}, {r['successes']} successes, {r['seconds']:.0f} s", flush=True)
                        write_results(args.out, {"environment": environment(), "args": vars(args), "rows": rows},
                                      table(rows, args.turns, args.seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

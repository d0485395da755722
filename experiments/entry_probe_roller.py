"""Does a model read an experience entry, with any prompt style and back end? No / correct / wrong entry
on the same held-out MiniHack seeds, played through the Roller.

    python experiments/entry_probe_roller.py --policy smollm2=comprl_data/models/smollm2-135m-instruct \
        --prompt-style chat --seeds 16 --out entry_probe_smollm2_chat

benchmarks/entry_probe.py probes the warm-started tiny models through the warm start's own compact
prompt builder and teacher; this one plays through trainers/rollout.py (the prompts, parsing and sessions
a run uses), so it probes a pretrained chat model with the chat prompts. The entry is the one a lesson
about the level would carry, in the extractor's layout: where the staircase was from the start and the
first heading (envs/minihack.py `stairs_sentence`, the offset from the scripted expert's own play of the
seed, `envs/experts.py minihack_facts`). A wrong entry is another seed's, with a different offset.
Greedy. Reported per condition: success, mean actions, invalid share, and the share of first moves that
follow the shown entry's heading (for `none`: the correct entry's). Writes benchmarks/results/<out>.*.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import environment, write_results  # noqa: E402

SEED_OFFSET = 3_000_000


class _Given:
    """A manager stand-in for the probe only: hands each episode the entry chosen for it, in spec order."""

    def __init__(self, texts: list[str]):
        self.texts = texts

    def search_sync(self, queries, **kw):
        from core.types import Hit

        if len(queries) != len(self.texts):
            raise RuntimeError("an env failed to start: the probe's entries no longer line up with its episodes")
        return [[Hit(entry_id=i + 1, text=t, score=1.0, rank_score=1.0, task=q, env="")] for i, (q, t) in enumerate(zip(queries, self.texts))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", required=True, metavar="NAME=FOLDER")
    ap.add_argument("--env", default="minihack/Room-Ultimate-5x5")
    ap.add_argument("--prompt-style", default="chat", choices=["compact", "chat"])
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--out", default="entry_probe_roller")
    args = ap.parse_args(argv)

    from core.metrics import wilson_interval
    from core.types import format_entry_text
    from envs.experts import minihack_facts
    from envs.minihack import first_heading, stairs_sentence
    from envs.pool import EnvPool
    from envs.registry import make_env
    from trainers.config import ModelSection, RolloutSection
    from trainers.models import load_backend
    from trainers.rollout import EpisodeSpec, Roller

    name, _, folder = args.policy.partition("=")
    seeds = [SEED_OFFSET + i for i in range(args.seeds)]
    env = make_env(args.env)
    try:
        offsets = {s: minihack_facts(env, s)["offset"] for s in seeds}
    finally:
        env.close()
    seeds = [s for s in seeds if offsets[s] not in (None, (0, 0))]  # the expert saw the stairs: there is a lesson to give

    def entry(off) -> str:
        return format_entry_text("Where the staircase is", "this dungeon's staircase down, from the start",
                                 f"In this dungeon {stairs_sentence(*off)}.")

    wrong = {}
    for i, s in enumerate(seeds):  # the next seed with another offset
        other = next((seeds[(i + j) % len(seeds)] for j in range(1, len(seeds)) if offsets[seeds[(i + j) % len(seeds)]] != offsets[s]), s)
        wrong[s] = offsets[other]
    actor = load_backend("hf", folder, device="cpu", num_threads=1)
    rc = RolloutSection(prompt_style=args.prompt_style, history_turns=4 if args.prompt_style == "chat" else 2,
                        history_chars=3000 if args.prompt_style == "chat" else 1200)
    ac = ModelSection(temperature=0.0, max_new_tokens=args.max_new_tokens)
    pool = EnvPool([args.env] * args.batch, num_workers=1)
    rows = {}
    try:
        for cond in ("none", "correct", "wrong"):
            eps = []
            for b in range(0, len(seeds), args.batch):
                chunk = seeds[b:b + args.batch]
                given = None if cond == "none" else _Given([entry(offsets[s] if cond == "correct" else wrong[s]) for s in chunk])
                roller = Roller(actor, pool, given, rollout_cfg=rc, actor_cfg=ac, max_turns=args.max_turns, seed=0)
                eps += roller.collect([EpisodeSpec(args.env, s, cond != "none", -1 - i) for i, s in enumerate(chunk)], step=0)
            shown = {s: (offsets[s] if cond != "wrong" else wrong[s]) for s in seeds}
            firsts = [e for e in eps if e.traj.steps]
            wins = sum(e.success for e in eps)
            lo, hi = wilson_interval(wins, len(eps))
            n_act = sum(e.traj.num_actions for e in eps)
            rows[cond] = {"n": len(eps), "successes": wins, "rate": wins / max(1, len(eps)), "ci_low": lo, "ci_high": hi,
                          "mean_actions": n_act / max(1, len(eps)),
                          "invalid_share": sum(e.invalid_actions for e in eps) / max(1, n_act),
                          "first_move_follows_entry": sum(e.traj.steps[0].action == first_heading(*shown[e.spec.seed]) for e in firsts)
                          / max(1, len(firsts)),
                          "first_moves": [e.traj.steps[0].action for e in firsts]}
            print(cond, {k: v for k, v in rows[cond].items() if k != "first_moves"}, flush=True)
    finally:
        pool.close()
    lines = ["| entry | n | success | 95% CI | mean actions | invalid share | first move = the shown entry's heading |",
             "|---|---:|---:|---|---:|---:|---:|"]
    for cond, r in rows.items():
        lines.append(f"| {cond} | {r['n']} | {r['rate']:.3f} | [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {r['mean_actions']:.2f} | "
                     f"{r['invalid_share']:.3f} | {r['first_move_follows_entry']:.3f} |")
    lines += ["", f"{name} ({folder}), {args.prompt_style} prompts, {args.env}, greedy, turn limit {args.max_turns}, "
              f"seeds {SEED_OFFSET}.. where the scripted expert saw the stairs ({len(seeds)} of {args.seeds}). "
              "For `none` the last column is the share of first moves that happen to match the correct entry's heading."]
    write_results(args.out, {"environment": environment(), "args": vars(args), "conditions": rows}, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

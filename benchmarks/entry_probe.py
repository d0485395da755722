"""Does a policy read an experience entry? The same held-out seeds played with no entry, with the
warm-start teacher's correct entry and with a wrong one, side by side.

    python benchmarks/entry_probe.py --policy default=comprl_data/models/policy \
        --env minihack/Room-Ultimate-5x5 --episodes 64 --out entry_probe_default

    python benchmarks/entry_probe.py --policy alf=alf_data/models/policy \
        --env alfworld/pick_and_place --episodes 32 --max-turns 20 --out entry_probe_alfworld

Every condition plays the same seeds (held out from every warm-start demonstration and DAgger seed).
The entries are the warm start's own (trainers/warmstart/: for MiniHack where the stairs lie from the
start, for ALFWorld where the object is usually found; a wrong entry names another goal or object). Each
state is also labelled with the scripted expert's action for that condition, so besides success the
probe measures how often the policy does what an expert who reads the entry would do. With greedy
decoding, "same episode as none" is the share of seeds on which the entry changed no action at all
(1.0: the policy ignores the entry) and "first move as none" the share on which it left the first
move alone. Success is compared with the no-entry condition of the same
policy and mode (two-proportion z-test). Writes benchmarks/results/<out>.json and .md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import environment, write_results  # noqa: E402

CONDITIONS = ("none", "correct", "wrong")


def warm_start_config(folder: Path, env: str) -> tuple[Any, str]:
    """The prompt settings the policy was built with (its warmstart.json), playing `env`; else the defaults."""
    from trainers import warmstart as W

    known = {f.name for f in dataclasses.fields(W.WarmStartConfig)}
    try:
        saved = json.loads((folder / W.MARKER).read_text())["config"]
        fields = {k: v for k, v in saved.items() if k in known}
        source = f"{folder / W.MARKER}"
    except (OSError, json.JSONDecodeError, KeyError):
        fields, source = {}, "WarmStartConfig defaults (the folder has no warmstart.json)"
    fields["envs"] = [env]
    return W.WarmStartConfig(**fields), source


def action_kind(action: str) -> str:
    """The kind of an action for the per-kind agreement: its verb ("go to", "take", "move", "open" in
    ALFWorld; the compass word in MiniHack). Kinds differ in what the policy must read: "open X" after
    "go to X" only repeats a name, "take watch 1 from shelf 1" copies the task's object from the
    observation."""
    words = action.split()
    if not words:
        return "(empty)"
    return " ".join(words[:2]) if words[0] == "go" and words[1:2] == ["to"] else words[0]


def expert_state_agreement(backend: Any, cfg: Any, env_name: str, seeds: list[int], condition: str,
                           max_new_tokens: int) -> tuple[float, int, dict[str, list[int]]]:
    """(share of the scripted expert's own states, on `seeds` under `condition`, where the greedy policy
    picks the expert's action; number of states; {expert's action kind: [agreed, states]}). On the
    expert's path, not the policy's: a low share here means the policy has not learned to imitate, a
    high one with a low rollout agreement means its own mistakes lead it to states it never saw."""
    from trainers import prompts as P
    from trainers import warmstart as W
    from trainers.warmstart.teachers import CONSTRAINED_ENVS

    demos = W.play_episodes(cfg, [(env_name, s, condition, 0.0) for s in seeds], source="expert", seed=0)
    states = [(d, t) for d in demos for t in d.turns]
    # Where the policy plays within the env's admissible commands (ALFWorld, teachers.CONSTRAINED_ENVS), it picks
    # among the same commands here: each expert state's list, from a replay of the expert's episode
    choices = expert_state_choices(cfg, env_name, demos) if env_name.startswith(CONSTRAINED_ENVS) else None
    hits = 0
    kinds: dict[str, list[int]] = {}
    for i in range(0, len(states), cfg.rollout_batch):
        chunk = states[i : i + cfg.rollout_batch]
        prompts = [backend.apply_chat_template(W._actor_prompt(cfg, d, t), add_generation_prompt=True, tokenize=True) for d, t in chunk]
        extra = {"choices": choices[i : i + cfg.rollout_batch]} if choices is not None else {}
        outs = backend.generate(prompts, max_new_tokens=max_new_tokens, temperature=0.0, stop=["\n"], seed=0, **extra)
        for o, (_, t) in zip(outs, chunk):
            agreed = P.parse_actor_reply(o.text)[1] == t.label
            hits += agreed
            k = kinds.setdefault(action_kind(t.label), [0, 0])
            k[0] += agreed
            k[1] += 1
    return hits / max(1, len(states)), len(states), dict(sorted(kinds.items()))


def expert_state_choices(cfg: Any, env_name: str, demos: list) -> list[list[str]]:
    """The env's admissible commands in each state of `demos` (in order), replayed on a fresh env: what a
    constrained reply may be there."""
    from envs.base import task_seed
    from trainers import warmstart as W

    env = W._make_env(cfg, env_name)
    out: list[list[str]] = []
    try:
        for d in demos:
            _, info = env.reset(seed=task_seed(env_name, d.seed) if cfg.task_ids else d.seed)
            for t in d.turns:
                out.append(list(info.get("admissible_actions") or []))
                _, _, term, trunc, info = env.step(t.taken)
                if term or trunc:
                    break
    finally:
        env.close()
    return out


def summarise(demos: list, none_by_seed: dict[int, Any], greedy: bool) -> dict[str, Any]:
    from core.metrics import wilson_interval

    n = len(demos)
    wins = sum(d.success for d in demos)
    lo, hi = wilson_interval(wins, n)
    turns = [t for d in demos for t in d.turns]
    firsts = [d for d in demos if d.turns]
    row = {"n": n, "successes": wins, "rate": wins / max(1, n), "ci_low": lo, "ci_high": hi,
           "mean_actions": statistics.mean(len(d.turns) for d in demos) if demos else 0.0,
           "mean_actions_success": statistics.mean(len(d.turns) for d in demos if d.success) if wins else None,
           # the scripted expert's action for this condition (trainers/warmstart/ _Teacher)
           "agreement_with_expert": sum(t.taken == t.label for t in turns) / max(1, len(turns)),
           "invalid_share": sum(d.invalid_actions for d in demos) / max(1, len(turns)),
           "first_move_agreement": sum(d.turns[0].taken == d.turns[0].label for d in firsts) / max(1, len(firsts))}
    if greedy:  # sampled episodes differ from the no-entry ones by chance alone: these say nothing there
        row["first_move_as_none"] = sum(d.turns[0].taken == none_by_seed[d.seed].turns[0].taken for d in firsts
                                        if none_by_seed[d.seed].turns) / max(1, len(firsts))
        row["same_episode_as_none"] = sum([t.taken for t in d.turns] == [t.taken for t in none_by_seed[d.seed].turns]
                                          for d in demos) / max(1, n)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", action="append", default=[], metavar="NAME=FOLDER", help="a policy model folder (repeat)")
    ap.add_argument("--env", default="minihack/Room-Ultimate-5x5", help="a minihack/* or alfworld/* env (the warm start's teacher writes the entries)")
    ap.add_argument("--episodes", type=int, default=64, help="held-out seeds per condition")
    ap.add_argument("--modes", default="greedy,sampled", help="comma-separated: greedy, sampled (temperature 1)")
    ap.add_argument("--max-turns", type=int, default=8, help="an episode still running after this many actions is a failure")
    ap.add_argument("--seed", type=int, default=7, help="sampling seed (the same for every policy)")
    ap.add_argument("--out", default="entry_probe")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"greedy", "sampled"}:
        ap.error("--modes takes greedy and/or sampled")
    if not args.env.startswith(("minihack/", "alfworld/")):
        ap.error(f"--env {args.env!r}: only minihack/* and alfworld/* envs have a teacher that writes entries")
    if args.episodes < 1 or args.max_turns < 1:
        ap.error("--episodes and --max-turns must be at least 1")
    policies = []
    for item in args.policy:
        name, sep, folder = item.partition("=")
        if not sep or not name or not (Path(folder) / "config.json").is_file():
            ap.error(f"--policy wants NAME=MODEL_FOLDER (a folder with config.json), got {item!r}")
        policies.append((name, Path(folder)))
    if not policies:
        ap.error("give at least one --policy NAME=MODEL_FOLDER")
    if len({n for n, _ in policies}) < len(policies):
        ap.error("policy names must differ")

    from envs.registry import list_envs

    if args.env not in list_envs():
        ap.error(f"unknown env {args.env!r}; `comprl envs` lists them")

    import torch

    from core.metrics import two_proportion_test
    from trainers import warmstart as W
    from trainers.models import load_backend
    from trainers.warmstart.teachers import CONSTRAINED_ENVS

    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    sources: dict[str, Any] = {}
    example_entries: dict[str, str] = {}
    for name, folder in policies:
        cfg, source = warm_start_config(folder, args.env)
        backend = load_backend("hf", folder, device="cpu", quiet=True)
        # enough tokens for the env's longest expert action (as the warm start's own rollouts)
        budget = W.action_token_budget(backend.tokenizer, W.collect_demos(dataclasses.replace(cfg, demo_episodes=8, noisy_share=0.0)), cfg)
        sources[name] = {"folder": str(folder), "prompt_settings": source, "history_turns": cfg.history_turns,
                         "history_chars": cfg.history_chars, "max_new_tokens": budget}
        # A policy built on task ids plays recurring tasks 0..episodes-1: the default config's seen (and unseen) dungeons,
        # never a demonstrated one (those are 1000 on); otherwise held-out seeds.
        tasks = list(range(args.episodes)) if cfg.task_ids else [W._eval_seed(0, i) for i in range(args.episodes)]
        specs = [(args.env, t, c) for c in CONDITIONS for t in tasks]
        for mode in modes:
            t0 = time.time()
            demos = W._rollouts(backend, cfg, specs, temperature=0.0 if mode == "greedy" else 1.0, seed=args.seed,
                                source="probe", max_turns=args.max_turns, max_new_tokens=budget)
            none = {d.seed: d for d in demos if d.condition == "none"}
            for cond in CONDITIONS:
                ds = [d for d in demos if d.condition == cond]
                example_entries.setdefault(cond, next((d.entry for d in ds if d.entry), ""))
                row = {"policy": name, "mode": mode, "condition": cond, **summarise(ds, none, mode == "greedy")}
                if mode == "greedy":
                    row["expert_state_agreement"], row["expert_states"], row["expert_state_kinds"] = expert_state_agreement(
                        backend, cfg, args.env, [s for _, s, c in specs if c == cond], cond, budget)
                rows.append({**row, "seconds": round(time.time() - t0, 1)})
            print(f"{name} {mode}: {time.time() - t0:.0f} s", flush=True)
        del backend
    for r in rows:
        base = next(b for b in rows if (b["policy"], b["mode"], b["condition"]) == (r["policy"], r["mode"], "none"))
        r["diff_vs_none"], r["p_vs_none"] = two_proportion_test(r["successes"], r["n"], base["successes"], base["n"])

    lines = [f"{args.episodes} held-out seeds (or, for a policy built on task ids, recurring tasks 0..{args.episodes - 1}: "
             f"the seen tasks of an env.task_set config: the default's dungeons, ALFWorld's households; never demonstrated) of {args.env} per condition, the same in every row; an episode "
             f"still running after {args.max_turns} actions fails. Sampled at temperature 1 with sampling seed {args.seed}. "
             "Invalid: share of actions the env refused. Agreement: share of the policy's actions equal to the "
             "scripted expert's for that condition in the same state (on MiniHack it walks an entry's heading, right or "
             "wrong, until the staircase is in view; on ALFWorld it walks to the receptacle an entry names, right or wrong, "
             "then searches the rest in the order the room lists them); on the expert's states (greedy only): the same share on the states of the expert's own episodes "
             "on these seeds, where the policy's earlier mistakes cannot have led it astray. Greedy only, same as none: share of seeds whose first move, or whole "
             "episode, is the one played without an entry (sampled episodes differ by chance alone)."
             + (" Mean actions: every episode (a failure counts its turn limit); of successes: the solved ones only."
                " ALFWorld is played within the env's admissible commands (constrained decoding, rollout.constrain_actions)."
                if args.env.startswith(CONSTRAINED_ENVS) else ""), "",
             "| policy | mode | entry | success | 95% CI | mean actions | of successes | invalid | agreement | on the expert's states | first move agrees | first move as none | same episode as none | diff vs none | p |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        expert = f"{r['expert_state_agreement']:.3f}" if "expert_state_agreement" in r else "–"
        first, same = ((f"{r['first_move_as_none']:.2f}", f"{r['same_episode_as_none']:.2f}") if "same_episode_as_none" in r
                       else ("–", "–"))
        lines.append(f"| {r['policy']} | {r['mode']} | {r['condition']} | {r['successes']}/{r['n']} = {r['rate']:.3f} | "
                     f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {r['mean_actions']:.2f} | "
                     f"{'–' if r.get('mean_actions_success') is None else format(r['mean_actions_success'], '.2f')} | {r['invalid_share']:.3f} | "
                     f"{r['agreement_with_expert']:.3f} | {expert} | "
                     f"{r['first_move_agreement']:.2f} | {first} | {same} | {r['diff_vs_none']:+.3f} | "
                     f"{r['p_vs_none']:.3g} |")
    kinds = sorted({k for r in rows for k in r.get("expert_state_kinds", {})})
    if kinds:
        lines += ["", "Greedy agreement on the expert's states by the kind of the expert's action (agreed/states): "
                  "which part of the task the policy has not learned.", "",
                  "| policy | entry | " + " | ".join(kinds) + " |", "|---|---|" + "---:|" * len(kinds)]
        for r in rows:
            if "expert_state_kinds" in r:
                cells = [f"{r['expert_state_kinds'][k][0]}/{r['expert_state_kinds'][k][1]}" if k in r["expert_state_kinds"]
                         else "–" for k in kinds]
                lines.append(f"| {r['policy']} | {r['condition']} | " + " | ".join(cells) + " |")
    lines += ["", "Example entries:", ""] + [f"- {c}: {json.dumps(e)}" for c, e in example_entries.items() if e]
    args_given = list(sys.argv[1:] if argv is None else argv)
    result = {"environment": environment(), "argv": ["python", "benchmarks/entry_probe.py", *args_given], "env": args.env,
              "episodes": args.episodes, "max_turns": args.max_turns, "seed": args.seed, "policies": sources, "rows": rows,
              "example_entries": example_entries}
    write_results(args.out, result, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Training speed of the embedded default on this CPU: rollouts, the learner, a full step, memory,
and the ExperienceManager's cost to rollouts.

    python benchmarks/bench_training.py [--quick] [--rounds N] [--data-dir ./comprl_data]
    python benchmarks/bench_training.py --modes fixed,nodedupe --no-learner --rounds 3 --out NAME   # one comparison

Six rollouts per round are interleaved, same model, same seeds, and timed side by side:
  manager  K/2 of each group get the top entry of a real library through the ExperienceManager;
  fixed    the same episodes are handed the very entries the manager returned, with no retrieval
           work at all (the control: identical prompts and, with seeded sampling, identical tokens,
           so only the manager's cost differs);
  fixed2   the control again: fixed2 / fixed is the machine's noise floor for a paired ratio;
  none     no experience (shorter prompts);
  plain    the control with the prompts' shared prefix (system prompt and task) recomputed for every
           row instead of run once as a repeated cache (HFBackend.prefix_cache off): the prefix cache's gain;
  nodedupe the control with identical prompts (a group's first turn) prefilled once per row instead of
           once per distinct prompt (HFBackend.dedupe_prompts off): the dedupe's gain.
  nosession the control without episode sessions (rollout.reuse_cache off): every turn prefills its whole
           prompt again, as before issue 24; fixed keeps each episode's KV cache across its turns.
With --model FOLDER --prompt-style chat the same comparison runs on another model (SmolLM2-135M-Instruct,
`comprl models import-gguf`) with the chat prompts, whose turns extend each other.
manager / fixed is the paper's "rollout time with the ExperienceManager vs the baseline" (0.98–1.00×
at their scale; target <= 1.02), reported as the median of the per-round paired ratios with their
range, next to the same statistic for fixed2 / fixed; manager / none adds the cost of reading longer
prompts. The learner is timed in the first 3 rounds, on the same episodes two ways, side by side: as
trained (reply-only output projection, shared prefix run once) and plain (one forward over every
position of every row), with a ~zero learning rate so that both see the same model.
Writes benchmarks/results/bench_training.json and .md.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.common import environment, median, write_results  # noqa: E402


class _Fixed:
    """The control: hands over hits recorded from the manager for the same queries, doing no work."""

    def __init__(self, hits):
        self.hits = hits

    def search_sync(self, queries, **kw):
        if len(queries) != len(self.hits):
            raise ValueError("the control replays one recorded batch; the query count changed")
        return self.hits


MODES = ("manager", "none", "fixed", "fixed2", "plain", "nodedupe", "nosession")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data-dir", default=str(ROOT / "comprl_data"))
    ap.add_argument("--rounds", type=int, default=0, help="interleaved rounds (default 3 with --quick, else 6)")
    ap.add_argument("--env", default="", help="default: the CPU default config's (first) env")
    ap.add_argument("--modes", default=",".join(MODES), help=f"rollouts to time, from {','.join(MODES)} (fixed is always in: the control)")
    ap.add_argument("--no-learner", action="store_true", help="time rollouts only")
    ap.add_argument("--tasks", type=int, default=0, help="tasks per step (default: the config's; fewer for a smoke run)")
    ap.add_argument("--model", default="", help="a model folder instead of the embedded default policy")
    ap.add_argument("--prompt-style", default="", choices=["", "compact", "chat"], help="default: the config's (compact)")
    ap.add_argument("--max-turns", type=int, default=0, help="turn limit per episode (default: the config's)")
    ap.add_argument("--group-size", type=int, default=0, help="K (default: the config's)")
    ap.add_argument("--out", default="bench_training", help="results name (a partial run should not replace bench_training, which study.py --plan reads)")
    args = ap.parse_args()
    modes = list(dict.fromkeys(["fixed", *[m for m in args.modes.split(",") if m]]))
    if bad := [m for m in modes if m not in MODES]:
        raise SystemExit(f"unknown mode(s) {bad}; choose from {','.join(MODES)}")
    full = set(modes) == set(MODES) and not args.no_learner and not args.tasks and not args.model
    if args.out == "bench_training" and not full:
        raise SystemExit("a run with --modes, --no-learner or --tasks must be filed under another name: give --out")
    torch.set_num_threads(1)

    from core.config import LibraryConfig
    from core.embedding import Embedder
    from core.manager import ExperienceManager, OpContext
    from core.store import ExperienceStore
    from core.types import Operation, format_entry_text
    from envs.pool import EnvPool
    from trainers.actor_step import actor_update
    from trainers.config import load_run_config, resolve_model_path
    from trainers.models import HFBackend
    from trainers.rollout import EpisodeSpec, Roller
    from trainers.warmstart import ensure_models

    cfg = load_run_config(ROOT / "configs" / "minihack_room_cpu.yaml")
    if args.prompt_style:
        cfg.rollout.prompt_style = args.prompt_style
        if args.prompt_style == "chat":  # the chat configs' window: 4 turns, moved 2 at a time
            cfg.rollout.history_turns, cfg.rollout.history_chars = 4, 3000
    if args.max_turns:
        cfg.env.max_turns = args.max_turns
    if args.group_size:
        cfg.rollout.group_size = args.group_size
    if not args.model:
        ensure_models(args.data_dir)
    args.env = args.env or next(iter(cfg.env.names))
    actor = HFBackend(args.model or resolve_model_path(cfg.actor.path, args.data_dir), device="cpu", num_threads=1)
    rounds = args.rounds or (3 if args.quick else 6)
    k, tasks = cfg.rollout.group_size, args.tasks or cfg.rollout.tasks_per_step
    prefill: dict[str, list[float]] = {m: [] for m in MODES}
    gen_tokens: dict[str, list[float]] = {m: [] for m in MODES}
    t: dict[str, list[float]] = {m: [] for m in MODES}
    ret_s, eps_s, tok_s, learn, learn_plain = [], [], [], [], []
    env_errors: dict[int, int] = {}  # round -> episodes whose env failed (they end at once: the round's times are void)
    with tempfile.TemporaryDirectory() as d:
        store = ExperienceStore(f"sqlite:///{d}/bench.db")
        lib = LibraryConfig()
        mgr = ExperienceManager(store, Embedder(lib.embedding), lib.manager, lib.index)
        # a realistic library: entries for this env's task, as the extractor writes them
        pool = EnvPool([args.env] * (k * tasks), num_workers=2)
        task = pool.reset_many([(0, 0, None)])[0].task
        mgr.apply_operations([Operation("add", text=format_entry_text(f"Tip {i}", "how to reach the goal",
                                                                      f"Head towards the > diagonally; tip variant {i}."))
                              for i in range(200)], OpContext(env=args.env, task=task))
        roller = Roller(actor, pool, mgr, rollout_cfg=cfg.rollout, actor_cfg=cfg.actor, max_turns=cfg.env.max_turns, seed=0)
        opt = torch.optim.AdamW(actor.trainable_parameters(), lr=1e-9)
        still = dataclasses.replace(cfg.actor, lr=1e-12, lr_warmup=0)  # ~no-op steps: speed only, the model stays put
        for r in range(rounds):
            specs = [EpisodeSpec(args.env, 1000 * r + g, i < k // 2, g) for g in range(tasks) for i in range(k)]
            base = [EpisodeSpec(s.env, s.seed, False, s.group_id) for s in specs]
            want = [s for s in specs if s.with_experience]
            recorded = mgr.search_sync([task] * len(want), task=[s.env for s in want])  # untimed: what the control replays
            order = modes[r % len(modes):] + modes[:r % len(modes)]  # rotate the order: no systematic warm-cache bias
            for mode in order if r % 2 == 0 else order[::-1]:
                roller.manager = mgr if mode == "manager" else None if mode == "none" else _Fixed(recorded)
                actor.prefix_cache = mode != "plain"
                actor.dedupe_prompts = mode != "nodedupe"
                roller.rc = dataclasses.replace(cfg.rollout, reuse_cache=mode != "nosession")
                stats: dict[str, float] = {}
                t0 = time.perf_counter()
                eps_r = roller.collect(base if mode == "none" else specs, step=r, metrics=stats)
                t[mode].append(time.perf_counter() - t0)
                prefill[mode].append(stats.get("rollout/prefill_tokens", 0.0))
                gen_tokens[mode].append(sum(len(tn.response_ids) for e in eps_r for tn in e.turns))
                roller.rc = cfg.rollout
                failed = sum(1 for e in eps_r if e.error)
                if failed:
                    env_errors[r] = env_errors.get(r, 0) + failed
                    print(f"round {r}, {mode}: {failed} episodes ended with an env error; the round is left out", file=sys.stderr)
                actor.prefix_cache = actor.dedupe_prompts = True
                if mode == "manager":
                    ret_s.append(stats["rollout/retrieval_s"])
                if mode == "fixed":
                    eps = eps_r
                    eps_s.append(stats["rollout/episodes_per_s"])
                    tok_s.append(stats["rollout/tokens_per_s"])
            if r < 3 and not args.no_learner:
                for fast in ((True, False) if r % 2 == 0 else (False, True)):
                    actor.supports_logits_to_keep = actor.prefix_cache = fast
                    t0 = time.perf_counter()
                    st = actor_update(actor, opt, eps, cfg.loss, still)
                    (learn if fast else learn_plain).append((time.perf_counter() - t0, st["policy/tokens"] if "policy/tokens" in st else 0.0, r))
                actor.supports_logits_to_keep = actor.prefix_cache = True
        mgr.close()
        pool.close()

    # A round in which an env failed timed episodes that ended at once: leave it out of every statistic.
    raw = {m: list(v) for m, v in t.items()}
    keep = [r for r in range(rounds) if r not in env_errors]
    t = {m: [v[r] for r in keep if r < len(v)] for m, v in t.items()}
    ret_s, eps_s, tok_s = ([xs[r] for r in keep if r < len(xs)] for xs in (ret_s, eps_s, tok_s))
    learn = [(a, b) for a, b, r in learn if r in keep]
    learn_plain = [(a, b) for a, b, r in learn_plain if r in keep]

    def med(xs: list[float]) -> float | None:
        return median(xs) if xs else None

    def ratio(a: str, b: str) -> float | None:
        return med([x / y for x, y in zip(t[a], t[b])])

    learn_s = med([a for a, _ in learn])
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    paired = [a / b for a, b in zip(t["manager"], t["fixed"])]  # manager / control, same round
    noise = [a / b for a, b in zip(t["fixed2"], t["fixed"])]    # control / control, same round
    res = {"benchmark": "training", "environment": environment(), "argv": sys.argv, "env": args.env, "episodes_per_step": k * tasks,
           "modes": modes, "rollout_episodes_per_s": med(eps_s), "rollout_tokens_per_s": med(tok_s),
           "learner_tokens_per_s": med([b / a for a, b in learn if a > 0]),
           "learner_s": learn_s, "learner_s_plain": med([a for a, _ in learn_plain]),
           "ratio_learner_to_plain": med([a / b for (a, _), (b, _) in zip(learn, learn_plain)]),
           "rollout_s_without_prefix_cache": med(t["plain"]), "ratio_prefix_cache_to_plain": ratio("fixed", "plain"),
           "rollout_s_without_dedupe": med(t["nodedupe"]), "ratio_dedupe_to_nodedupe": ratio("fixed", "nodedupe"),
           "rollout_s_without_sessions": med(t["nosession"]), "ratio_sessions_to_nosession": ratio("fixed", "nosession"),
           "ratio_sessions_to_nosession_per_round": [a / b for a, b in zip(t["fixed"], t["nosession"])],
           "prefill_tokens_fixed": med(prefill["fixed"]), "prefill_tokens_nosession": med(prefill["nosession"]),
           "generated_tokens_fixed": med(gen_tokens["fixed"]), "generated_tokens_nosession": med(gen_tokens["nosession"]),
           "same_tokens_sessions_vs_not": gen_tokens["fixed"] == gen_tokens["nosession"] if t["nosession"] else None,
           "rollout_tokens_per_s_nosession": med([g / x for g, x in zip(gen_tokens["nosession"], t["nosession"])]),
           "prompt_style": cfg.rollout.prompt_style, "max_turns": cfg.env.max_turns,
           "ratio_dedupe_to_nodedupe_per_round": [a / b for a, b in zip(t["fixed"], t["nodedupe"])],
           "step_s": (med(t["manager"]) + learn_s) if t["manager"] and learn_s is not None else None, "peak_rss_mb": peak_mb,
           "rollout_s_with_manager": med(t["manager"]), "rollout_s_without": med(t["none"]),
           "ratio_with_to_without": ratio("manager", "none"), "rollout_s_fixed_entries": med(t["fixed"]),
           "ratio_manager_to_fixed": med(paired), "ratio_manager_to_fixed_per_round": paired,
           "ratio_control_to_control": med(noise), "ratio_control_to_control_per_round": noise,
           "retrieval_share_of_rollout": med(ret_s) / med(t["manager"]) if ret_s else None, "rounds": rounds,
           "rounds_left_out_env_errors": sorted(env_errors), "times_s": raw,
           "model": actor.describe()}
    rng = lambda xs: f"{min(xs):.3f}–{max(xs):.3f}" if xs else "–"  # noqa: E731
    f = lambda x, spec=".2f": "–" if x is None else format(x, spec)  # noqa: E731
    rows = [
        ("", f"| episodes per step | {k * tasks} ({tasks} tasks × K={k}) |"),
        ("fixed", f"| rollout episodes/s | {f(res['rollout_episodes_per_s'])} |"),
        ("fixed", f"| rollout tokens/s (generated) | {f(res['rollout_tokens_per_s'], '.0f')} |"),
        ("learner", f"| learner tokens/s (rows × length) | {f(res['learner_tokens_per_s'], '.0f')} |"),
        ("learner", f"| learner s per step | {f(learn_s)} |"),
        ("learner", f"| learner s per step, plain forward over every position (before) | {f(res['learner_s_plain'])} |"),
        ("learner", f"| **ratio learner / plain** (same episodes, same round) | **{f(res['ratio_learner_to_plain'], '.3f')}** |"),
        ("learner", f"| full step s (rollout + learner) | {f(res['step_s'])} |"),
        ("", f"| peak RSS MB | {peak_mb:.0f} |"),
        ("manager", f"| rollout s with ExperienceManager (K/2 retrieve) | {f(res['rollout_s_with_manager'])} |"),
        ("fixed", f"| rollout s, same entries handed over without the manager | {f(res['rollout_s_fixed_entries'])} |"),
        ("none", f"| rollout s without experience | {f(res['rollout_s_without'])} |"),
        ("plain", f"| rollout s, same entries, shared prompt prefix recomputed per row (before) | {f(res['rollout_s_without_prefix_cache'])} |"),
        ("plain", f"| **ratio rollout with prefix cache / without** (same round) | **{f(res['ratio_prefix_cache_to_plain'], '.3f')}** |"),
        ("nodedupe", f"| rollout s, same entries, identical prompts prefilled once per row (before) | {f(res['rollout_s_without_dedupe'])} |"),
        ("nodedupe", f"| **ratio rollout with prompt dedupe / without** (same round; per-round range) | "
                     f"**{f(res['ratio_dedupe_to_nodedupe'], '.3f')}** ({rng(res['ratio_dedupe_to_nodedupe_per_round'])}) |"),
        ("nosession", f"| rollout s, same entries, every turn's prompt prefilled whole (before: no episode KV cache) | {f(res['rollout_s_without_sessions'])} |"),
        ("nosession", f"| rollout tokens/s (generated), before | {f(res['rollout_tokens_per_s_nosession'], '.1f')} |"),
        ("nosession", f"| prompt tokens run through the model per rollout: episode caches kept / not | "
                      f"{f(res['prefill_tokens_fixed'], '.0f')} / {f(res['prefill_tokens_nosession'], '.0f')} |"),
        ("nosession", f"| same generated tokens with and without (seeded) | {res['same_tokens_sessions_vs_not']} |"),
        ("nosession", f"| **ratio rollout with episode KV caches / without** (same round; per-round range) | "
                      f"**{f(res['ratio_sessions_to_nosession'], '.3f')}** ({rng(res['ratio_sessions_to_nosession_per_round'])}) |"),
        ("manager", f"| **ratio manager / same entries without it** (target <= 1.02; per-round range) | **{f(res['ratio_manager_to_fixed'], '.3f')}** ({rng(paired)}) |"),
        ("fixed2", f"| noise floor: the same control run twice, ratio (per-round range) | {f(res['ratio_control_to_control'], '.3f')} ({rng(noise)}) |"),
        ("manager+none", f"| ratio manager / no experience (adds longer prompts) | {f(res['ratio_with_to_without'], '.3f')} |"),
        ("manager", f"| retrieval calls' share of the rollout | {f(100 * res['retrieval_share_of_rollout'] if ret_s else None)}% |"),
    ]
    have = set(modes) | ({"learner"} if learn else set()) | {""}
    table = "\n".join(["| measure | value |", "|---|---:|", *[line for need, line in rows if set(need.split("+")) <= have],
                       "", f"Model: {actor.describe()}; env {args.env}; prompt style {cfg.rollout.prompt_style}; turn limit "
                       f"{cfg.env.max_turns or 'the env' + chr(39) + 's'}; modes {', '.join(modes)}; medians of {rounds} interleaved "
                       f"rounds of paired ratios (learner: {len(learn)} rounds)"
                       + (f"; rounds {sorted(env_errors)} left out: an env failed during them" if env_errors else "") + "."])
    write_results(args.out, res, table)


if __name__ == "__main__":
    main()

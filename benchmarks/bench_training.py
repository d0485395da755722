"""Training speed of the embedded default on this CPU: rollouts, the learner, a full step, memory,
and the ExperienceManager's cost to rollouts.

    python benchmarks/bench_training.py [--quick] [--rounds N] [--data-dir ./comprl_data]

Four rollouts per round are interleaved, same model, same seeds, and timed side by side:
  manager  K/2 of each group get the top entry of a real library through the ExperienceManager;
  fixed    the same episodes are handed the very entries the manager returned, with no retrieval
           work at all (the control: identical prompts and, with seeded sampling, identical tokens,
           so only the manager's cost differs);
  fixed2   the control again: fixed2 / fixed is the machine's noise floor for a paired ratio;
  none     no experience (shorter prompts);
  plain    the control with the prompts' shared prefix (system prompt and task) recomputed for every
           row instead of run once as a repeated cache (HFBackend.prefix_cache off): the prefix cache's gain.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data-dir", default=str(ROOT / "comprl_data"))
    ap.add_argument("--rounds", type=int, default=0, help="interleaved rounds (default 3 with --quick, else 6)")
    ap.add_argument("--env", default="", help="default: the CPU default config's (first) env")
    args = ap.parse_args()
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

    ensure_models(args.data_dir)
    cfg = load_run_config(ROOT / "configs" / "minihack_room_cpu.yaml")
    args.env = args.env or next(iter(cfg.env.names))
    actor = HFBackend(resolve_model_path(cfg.actor.path, args.data_dir), device="cpu", num_threads=1)
    rounds = args.rounds or (3 if args.quick else 6)
    k, tasks = cfg.rollout.group_size, cfg.rollout.tasks_per_step
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
        with_t, without_t, fixed_t, fixed2_t, plain_t, ret_s, eps_s, tok_s, learn, learn_plain = ([] for _ in range(10))
        opt = torch.optim.AdamW(actor.trainable_parameters(), lr=1e-9)
        still = dataclasses.replace(cfg.actor, lr=1e-12, lr_warmup=0)  # ~no-op steps: speed only, the model stays put
        orders = [(0, 1, 2, 3, 4), (4, 3, 2, 1, 0), (1, 3, 0, 4, 2), (2, 4, 0, 3, 1), (0, 2, 4, 3, 1), (3, 1, 4, 0, 2)]
        for r in range(rounds):
            specs = [EpisodeSpec(args.env, 1000 * r + t, i < k // 2, t) for t in range(tasks) for i in range(k)]
            base = [EpisodeSpec(s.env, s.seed, False, s.group_id) for s in specs]
            want = [s for s in specs if s.with_experience]
            recorded = mgr.search_sync([task] * len(want), task=[s.env for s in want])  # untimed: what the control replays
            for mode in orders[r % len(orders)]:  # rotate the order: no systematic warm-cache bias
                if mode == 4:
                    roller.manager = _Fixed(recorded)
                    actor.prefix_cache = False
                    t0 = time.perf_counter()
                    roller.collect(specs, step=r)
                    plain_t.append(time.perf_counter() - t0)
                    actor.prefix_cache = True
                elif mode in (2, 3):
                    roller.manager = _Fixed(recorded)
                    t0 = time.perf_counter()
                    roller.collect(specs, step=r)
                    (fixed_t if mode == 2 else fixed2_t).append(time.perf_counter() - t0)
                elif mode == 0:
                    roller.manager = mgr
                    t0 = time.perf_counter()
                    eps = roller.collect(specs, step=r)
                    with_t.append(time.perf_counter() - t0)
                    ret_s.append(roller.stats["rollout/retrieval_s"])
                    eps_s.append(roller.stats["rollout/episodes_per_s"])
                    tok_s.append(roller.stats["rollout/tokens_per_s"])
                else:
                    roller.manager = None
                    t0 = time.perf_counter()
                    roller.collect(base, step=r)
                    without_t.append(time.perf_counter() - t0)
            if r < 3:
                for fast in ((True, False) if r % 2 == 0 else (False, True)):
                    actor.supports_logits_to_keep = actor.prefix_cache = fast
                    t0 = time.perf_counter()
                    st = actor_update(actor, opt, eps, cfg.loss, still)
                    (learn if fast else learn_plain).append((time.perf_counter() - t0, st["policy/tokens"] if "policy/tokens" in st else 0.0))
                actor.supports_logits_to_keep = actor.prefix_cache = True
        mgr.close()
        pool.close()
    learn_s = median([a for a, _ in learn])
    learn_plain_s = median([a for a, _ in learn_plain])
    learn_ratio = median([a / b for (a, _), (b, _) in zip(learn, learn_plain)])
    prefix_ratio = median([a / b for a, b in zip(fixed_t, plain_t)])
    learn_tok = median([b / a for a, b in learn if a > 0]) if learn else 0.0
    step_s = median(with_t) + learn_s
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    paired = [a / b for a, b in zip(with_t, fixed_t)]       # manager / control, same round
    noise = [a / b for a, b in zip(fixed2_t, fixed_t)]       # control / control, same round
    ratio = median([a / b for a, b in zip(with_t, without_t)])
    overhead = median(paired)
    res = {"benchmark": "training", "environment": environment(), "env": args.env, "episodes_per_step": k * tasks,
           "rollout_episodes_per_s": median(eps_s), "rollout_tokens_per_s": median(tok_s), "learner_tokens_per_s": learn_tok,
           "learner_s": learn_s, "learner_s_plain": learn_plain_s, "ratio_learner_to_plain": learn_ratio,
           "rollout_s_without_prefix_cache": median(plain_t), "ratio_prefix_cache_to_plain": prefix_ratio, "step_s": step_s, "peak_rss_mb": peak_mb, "rollout_s_with_manager": median(with_t),
           "rollout_s_without": median(without_t), "ratio_with_to_without": ratio,
           "rollout_s_fixed_entries": median(fixed_t), "ratio_manager_to_fixed": overhead,
           "ratio_manager_to_fixed_per_round": paired, "ratio_control_to_control": median(noise),
           "ratio_control_to_control_per_round": noise,
           "retrieval_share_of_rollout": median(ret_s) / median(with_t), "rounds": rounds,
           "model": actor.describe()}
    rng = lambda xs: f"{min(xs):.3f}–{max(xs):.3f}"  # noqa: E731
    table = "\n".join([
        "| measure | value |", "|---|---:|",
        f"| episodes per step | {k * tasks} ({tasks} tasks × K={k}) |",
        f"| rollout episodes/s | {res['rollout_episodes_per_s']:.2f} |",
        f"| rollout tokens/s (generated) | {res['rollout_tokens_per_s']:.0f} |",
        f"| learner tokens/s (rows × length) | {learn_tok:.0f} |",
        f"| learner s per step | {learn_s:.2f} |",
        f"| learner s per step, plain forward over every position (before) | {learn_plain_s:.2f} |",
        f"| **ratio learner / plain** (same episodes, same round) | **{learn_ratio:.3f}** |",
        f"| full step s (rollout + learner) | {step_s:.2f} |",
        f"| peak RSS MB | {peak_mb:.0f} |",
        f"| rollout s with ExperienceManager (K/2 retrieve) | {median(with_t):.2f} |",
        f"| rollout s, same entries handed over without the manager | {median(fixed_t):.2f} |",
        f"| rollout s without experience | {median(without_t):.2f} |",
        f"| rollout s, same entries, shared prompt prefix recomputed per row (before) | {median(plain_t):.2f} |",
        f"| **ratio rollout with prefix cache / without** (same round) | **{prefix_ratio:.3f}** |",
        f"| **ratio manager / same entries without it** (target <= 1.02; per-round range) | **{overhead:.3f}** ({rng(paired)}) |",
        f"| noise floor: the same control run twice, ratio (per-round range) | {median(noise):.3f} ({rng(noise)}) |",
        f"| ratio manager / no experience (adds longer prompts) | {ratio:.3f} |",
        f"| retrieval calls' share of the rollout | {100 * res['retrieval_share_of_rollout']:.2f}% |",
        "", f"Model: {actor.describe()}; env {args.env}; medians of {rounds} interleaved rounds of paired ratios "
        f"(learner: {len(learn)} rounds).",
    ])
    write_results("bench_training", res, table)


if __name__ == "__main__":
    main()

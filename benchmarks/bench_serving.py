"""Evaluation through an OpenAI-compatible server vs the hf back end: the same model, seeds and prompts.

    python benchmarks/bench_serving.py --folder comprl_data/models/smollm2-135m-instruct --seeds 8 --turns 4

Starts the OpenAI-compatible server tests/test_llama_server.py starts (vLLM's, serving the folder; llama.cpp's with
COMPRL_TEST_SERVER=llama.cpp, serving the GGUF the folder was imported from) on loopback, and plays greedy evaluation
episodes (trainers/evaluate.py `evaluate_policy`, the chat prompts) through `backend: openai` and through
the hf back end (one torch thread), in interleaved rounds. Reports episodes/s, seconds per turn, how
often the two back ends chose the same action, and the valid-action rate of each. Writes
benchmarks/results/<out>.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import environment, median, write_results  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", required=True, help="the imported model folder (comprl models import-gguf)")
    ap.add_argument("--env", default="minihack/Room-5x5")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--slots", type=int, default=4, help="episodes in lockstep (the server gets that many concurrent requests)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--out", default="bench_serving")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from envs.pool import EnvPool
    from test_llama_server import SERVER, LlamaServer
    from trainers.config import ModelSection, RolloutSection
    from trainers.cotrain import SlotRouter
    from trainers.evaluate import evaluate_policy
    from trainers.models import inference_backend, load_backend
    from trainers.rollout import Roller

    folder = Path(args.folder)
    gguf = Path(json.loads((folder / "comprl_import.json").read_text())["source"])
    log = Path(tempfile.gettempdir()) / f"{args.out}_server.log"
    srv = LlamaServer(gguf, log, folder=folder).wait_ready()
    rc = RolloutSection(prompt_style="chat", history_turns=4, history_chars=3000)
    slots = [args.env] * args.slots
    pool = EnvPool(slots, num_workers=1)
    times: dict[str, list[float]] = {"openai": [], "hf": []}
    actions: dict[str, list[list[str]]] = {}
    valid: dict[str, float] = {}
    turns: dict[str, int] = {}
    try:
        backends = {"openai": inference_backend(ModelSection(backend="openai", base_url=srv.url, path=str(folder),
                                                             served_model="smollm2", max_new_tokens=args.max_new_tokens), folder),
                    "hf": load_backend("hf", folder, device="cpu", num_threads=1)}
        for r in range(args.rounds):
            for name in (("openai", "hf") if r % 2 == 0 else ("hf", "openai")):
                roller = Roller(backends[name], pool, None, rollout_cfg=rc, actor_cfg=ModelSection(max_new_tokens=args.max_new_tokens),
                                max_turns=args.turns, seed=0)
                t0 = time.perf_counter()
                res = evaluate_policy(roller, SlotRouter(slots), [args.env], n=args.seeds, seed_offset=2_000_000, with_experience=(False,))
                times[name].append(time.perf_counter() - t0)
                acts = [[s.action for s in e.traj.steps] for e in res.episodes]
                actions[name] = acts
                n_act = sum(len(a) for a in acts)
                turns[name] = n_act
                valid[name] = 1 - sum(e.invalid_actions for e in res.episodes) / max(1, n_act)
                print(f"round {r} {name}: {times[name][-1]:.1f} s, {n_act} actions, valid {valid[name]:.3f}", flush=True)
    finally:
        pool.close()
        srv.stop()
    pairs = [(a, b) for ea, eb in zip(actions["openai"], actions["hf"]) for a, b in zip(ea, eb)]
    same = sum(a == b for a, b in pairs) / max(1, len(pairs))
    first_same = sum(ea[:1] == eb[:1] for ea, eb in zip(actions["openai"], actions["hf"])) / max(1, len(actions["hf"]))
    res = {"benchmark": "serving", "environment": environment(), "args": vars(args),
           "seconds": times, "median_s": {k: median(v) for k, v in times.items()},
           "episodes_per_s": {k: args.seeds / median(v) for k, v in times.items()},
           "seconds_per_turn": {k: median(v) / max(1, turns[k]) for k, v in times.items()},
           "valid_rate": valid, "same_action_share": same, "same_first_action_share": first_same}
    served = "llama.cpp server (Q4_1 GGUF, 1 thread)" if SERVER == "llama.cpp" else "vLLM's OpenAI server (fp32 folder)"
    res["server"] = served
    lines = ["| back end | episodes/s | s per turn | valid-action rate |", "|---|---:|---:|---:|",
             f"| openai → {served} | {res['episodes_per_s']['openai']:.3f} | "
             f"{res['seconds_per_turn']['openai']:.2f} | {valid['openai']:.3f} |",
             f"| hf (transformers, fp32 folder, 1 thread) | {res['episodes_per_s']['hf']:.3f} | "
             f"{res['seconds_per_turn']['hf']:.2f} | {valid['hf']:.3f} |",
             "",
             f"Greedy evaluation, {args.env}, {args.seeds} held-out seeds, {args.turns} turns, chat prompts, {args.slots} episodes "
             f"in lockstep, medians of {args.rounds} interleaved rounds. Same action at the same turn on "
             f"{same:.0%} of turns ({first_same:.0%} of first moves): " + (
                 "the server runs the Q4_1 weights, hf their fp32 dequantisation, and llama.cpp's own kernels"
                 if SERVER == "llama.cpp" else "both run the same fp32 weights, with different kernels") +
             ", so greedy choices can part where two moves are close; once they part, the episodes differ."]
    write_results(args.out, res, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

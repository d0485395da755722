"""The learner's forward + backward on a CPU in fp32 and under bf16 autocast (actor.cpu_bf16_autocast).

    python benchmarks/bench_bf16_learner.py --folder comprl_data/models/smollm2-135m-instruct --rows 4 --length 600

The same rows (random token ids of a real tokenizer's range, a reply mask over the last 16 tokens of
each) through trainers/backends/logprobs.py `row_logprobs` (as the actor's learner calls it) with LoRA, then
backward, timed side by side in interleaved rounds on one thread; also the largest difference of the reply log-probs between the two.
Writes benchmarks/results/<out>.json and .md.
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

from benchmarks.common import environment, median, write_results  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", required=True)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--length", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench_bf16_learner")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from trainers.actor_step import _learner_autocast
    from trainers.backends.logprobs import row_logprobs
    from trainers.models import LoraSettings, load_backend

    b = load_backend("hf", args.folder, device="cpu", lora=LoraSettings(), num_threads=1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, len(b.tokenizer) - 100, (args.rows, args.length), generator=g)
    attn = torch.ones_like(ids)
    mask = torch.zeros_like(ids)
    mask[:, -16:] = 1
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    lps: dict[str, torch.Tensor] = {}
    for r in range(args.rounds):
        for mode in (("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")):
            b.autocast_bf16 = mode == "bf16"
            b.model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            with _learner_autocast(b):
                logp, _ = row_logprobs(b, ids, attn, mask, entropy=True)
            (-(logp * mask).sum()).backward()
            times[mode].append(time.perf_counter() - t0)
            lps[mode] = logp.detach()
            print(f"round {r} {mode}: {times[mode][-1]:.2f} s", flush=True)
    diff = float(((lps["fp32"] - lps["bf16"]) * mask).abs().max())
    ratio = median([a / c for a, c in zip(times["bf16"], times["fp32"])])
    res = {"environment": environment(), "args": vars(args), "times_s": times, "median_s": {k: median(v) for k, v in times.items()},
           "ratio_bf16_to_fp32": ratio, "max_reply_logprob_diff": diff, "model": b.describe()}
    table = "\n".join(["| learner forward + backward | s (median) |", "|---|---:|",
                       f"| fp32 | {res['median_s']['fp32']:.2f} |", f"| bf16 autocast | {res['median_s']['bf16']:.2f} |",
                       f"| **ratio bf16 / fp32** (paired, same round) | **{ratio:.3f}** |",
                       f"| largest reply log-prob difference | {diff:.3f} |", "",
                       f"{b.describe()}; {args.rows} rows × {args.length} tokens, loss on the last 16 of each, {args.rounds} interleaved rounds."])
    write_results(args.out, res, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

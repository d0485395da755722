"""Does the warm start's extractor copy the debrief into its entry? The build's own extractor stages
(`trainers/warmstart/ train_extractor`) on a smaller demonstration set, then greedy extraction answers on
held-out expert episodes, each entry checked against the level (`envs/minihack.py claimed_offset`).

    python experiments/extractor_copy_probe.py --demos 800 --short-steps 200 --steps 300 --out extractor_copy_probe

Also reports the layout the copy relies on: for every extraction example whose debrief states where the
staircase was, the distance in tokens from each copied token of the answer back to the prompt's debrief (the
think's quote) and to the think's quote (the lesson's copy). One distance each means a model can copy by position.
Writes benchmarks/results/<out>.json and .md.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import environment, write_results  # noqa: E402


def copy_distances(tokenizer: Any, examples: list[Any], demos: list[Any]) -> dict[str, Any]:
    """Distances (in tokens) between the debrief's span in the prompt, the think's quote and the lesson's copy."""
    from trainers import warmstart as W

    to_think: Counter[int] = Counter()
    to_lesson: Counter[int] = Counter()
    for ex, d in zip(examples, demos):
        quote = W._debrief_quote(d)
        if not quote:
            continue
        span = tokenizer.encode(quote.split("was ", 1)[1].rstrip("."), add_special_tokens=False)
        ids = list(ex.input_ids)
        hits = [i for i in range(len(ids) - len(span) + 1) if ids[i:i + len(span)] == span]
        if len(hits) >= 2:
            to_think[hits[1] - hits[0]] += 1
        if len(hits) >= 3:
            to_lesson[hits[2] - hits[1]] += 1
    return {"prompt_to_think": dict(to_think.most_common(6)), "think_to_lesson": dict(to_lesson.most_common(6))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demos", type=int, default=800)
    ap.add_argument("--short-steps", type=int, default=200)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--short-batch", type=int, default=16)
    ap.add_argument("--eval", type=int, default=60, help="held-out extraction answers")
    ap.add_argument("--out", default="extractor_copy_probe")
    ap.add_argument("--save", default="", help="also save the extractor (and tokenizer) to this folder")
    args = ap.parse_args()

    import torch

    from trainers import warmstart as W
    from trainers.models import load_backend, save_model_folder

    torch.set_num_threads(1)
    cfg = W.WarmStartConfig(demo_episodes=args.demos,
                            extractor_short_steps=args.short_steps, extractor_steps=args.steps,
                            extractor_batch_size=args.batch, extractor_short_batch_size=args.short_batch, eval_extractor=args.eval, threads=1)
    t0 = time.time()
    demos = W.collect_demos(cfg)
    tokenizer = W.demo_tokenizer(cfg, demos)
    ex = [W._join(tokenizer, W._chat_ids(tokenizer, W._extractor_prompt(cfg, d)), W._extractor_target(d)[1], "x") for d in demos]
    layout = copy_distances(tokenizer, ex, demos)
    t_train = time.time()
    model, examples, dropped, losses, short_losses = W.train_extractor(cfg, demos, tokenizer)
    train_s = time.time() - t_train

    # Held-out episodes: the scripted expert on evaluation seeds, each condition in turn.
    held = W.play_episodes(cfg, [(cfg.envs[0], W._eval_seed(0, i), ("none", "correct", "wrong")[i % 3], 0.0)
                                 for i in range(args.eval * 2)], source="expert", seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        save_model_folder(model, tokenizer, Path(tmp) / "extractor")
        backend = load_backend("hf", Path(tmp) / "extractor", device="cpu", quiet=True)
        evaluation = W._evaluate_extractor(backend, cfg, held)
        # Every held-out answer whose trajectory's debrief says where the staircase was: the quote, the think, the entry.
        stated = [d for d in held if W._debrief_quote(d)][: args.eval]
        prompts = [backend.apply_chat_template(W._extractor_prompt(cfg, d), add_generation_prompt=True, tokenize=True)
                   for d in stated]
        outs = backend.generate(prompts, max_new_tokens=cfg.extractor_max_new_tokens, temperature=0.0, seed=0)
        if args.save:
            save_model_folder(model, tokenizer, Path(args.save))
    answers = []
    for d, o in zip(stated, outs):
        think = o.text.split("</think>", 1)[0].replace("<think>", "")
        entry = o.text.split("</think>", 1)[-1]
        answers.append({"truth": list(d.facts["offset"]), "condition": d.condition, "quote": W._debrief_quote(d),
                        "think_exact": W._debrief_quote(d) == think.strip(), "think_claim": W._claimed(think),
                        "entry_claim": W._claimed(entry), "answer": o.text})
    n = max(1, len(answers))
    copy = {"answers": len(answers),
            "think_exact": sum(a["think_exact"] for a in answers) / n,
            "think_claim_right": sum(a["think_claim"] == tuple(a["truth"]) for a in answers) / n,
            "entry_claim_right": sum(a["entry_claim"] == tuple(a["truth"]) for a in answers) / n,
            "entry_claim_any": sum(a["entry_claim"] is not None for a in answers) / n}
    result = {
        "command": "python " + " ".join(sys.argv),
        "config": {k: getattr(cfg, k) for k in ("demo_episodes", "extractor_short_steps", "extractor_short_batch_size",
                                                  "extractor_steps", "extractor_batch_size", "extractor_hidden", "extractor_layers")},
        "layout_distances": layout,
        "examples": len(examples), "dropped_too_long": dropped,
        "loss": {"short_first": round(sum(short_losses[:10]) / 10, 3) if short_losses else None,
                 "short_last": round(sum(short_losses[-10:]) / 10, 3) if short_losses else None,
                 "first": round(sum(losses[:10]) / 10, 3), "last": round(sum(losses[-10:]) / 10, 3)},
        "eval": evaluation,
        "copy": copy,
        "answers": answers,
        "train_s": round(train_s, 1), "wall_s": round(time.time() - t0, 1),
        "environment": environment(),
    }
    ev = evaluation
    md = [f"# Extractor copy probe: `{result['command']}`", "",
          "| demos | short steps | steps | batch | parse rate | entries that claim a place | right | debriefs copied | train s |",
          "|---|---|---|---|---|---|---|---|---|",
          f"| {cfg.demo_episodes} | {cfg.extractor_short_steps} | {cfg.extractor_steps} | {cfg.extractor_batch_size} | "
          f"{ev['parse_rate']:.2f} | {ev.get('entries_checked', 0)} | {ev.get('entry_correct_share', 0):.2f} | "
          f"{ev.get('debrief_copied_share', 0):.2f} of {ev.get('debriefs_stated', 0)} | {train_s:.0f} |",
          "", f"Held-out debriefs that say where the staircase was: {copy}", "",
          f"Copy distances (tokens: count): {layout}", "", "Example answer:", "", "```", ev.get("example", ""), "```"]
    write_results(args.out, result, "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()

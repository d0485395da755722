"""Can a tiny policy learn to copy the task's object into its action, and what makes it learn?

    python experiments/copy_probe.py --out copy_probe

A synthetic ALFWorld-like turn: "Task: put a watch in safe." ... "On the shelf 1, you see a pen 1, a
watch 1, and a mug 1." -> "take watch 1 from shelf 1". The object is one of 22 names, placed at a random
slot of the listing, so no frequency or position guess gets it right: only copying the task's object
does. Prompts come short (the task line and the observation, ~60 tokens) or long (the actor's system
text and four history items of distracting names before them, ~270 tokens, the shape of a real
ALFWorld prompt). Each arm trains a fresh tiny Qwen2 of the warm start's design (trainers/models.py)
with the warm start's SFT step (trainers/warmstart/ `_sft`, loss on the action only unless a prompt
loss weight is set) and measures, every --every steps, the share of held-out long and short prompts on
which the greedy next token after "take" is the task's object. Arms, side by side from the same
initialisation and batches:

- full: long prompts only (what the ALFWorld warm start did);
- short then full: --short-steps on short prompts, then long ones (`short_prompt_steps`);
- full + prompt loss: long prompts with a next-token loss on the prompt at weight 0.5
  (`prompt_loss_weight`).

Writes benchmarks/results/<out>.json and .md.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import environment, write_results  # noqa: E402

OBJECTS = ("watch pen apple mug egg keychain creditcard cellphone tissuebox dishsponge book vase pillow laptop statue "
           "candle plate bowl cup fork knife spoon").split()
RECEPTACLES = "safe drawer shelf sidetable countertop cabinet fridge desk dresser armchair".split()
FORMAT = ('Reply with exactly one action per turn, using the names the game shows ("apple 1", "countertop 2"). '
          "Actions: go to X, open X, take O from X, move O to X.")


def turn(rng: random.Random, long: bool) -> tuple[list[dict[str, str]], str]:
    """(chat messages, target action) of one synthetic turn."""
    from trainers import prompts as P

    obj, goal, here = rng.choice(OBJECTS), rng.choice(RECEPTACLES), rng.choice(RECEPTACLES)
    items = [obj] + rng.sample([o for o in OBJECTS if o != obj], 2)
    rng.shuffle(items)
    observation = f"On the {here} 1, you see a {items[0]} 1, a {items[1]} 1, and a {items[2]} 1."
    history = [(f"You arrive at {rng.choice(RECEPTACLES)} {rng.randint(1, 3)}. On it, you see a {rng.choice(OBJECTS)} 1, "
                f"and a {rng.choice(OBJECTS)} 2.", f"go to {rng.choice(RECEPTACLES)} 1") for _ in range(4)] if long else []
    msgs = P.actor_messages(action_format=FORMAT, task=f"put a {obj} in {goal}.", observation=observation, history=history)
    return (msgs if long else msgs[1:]), f"take {obj} 1 from {here} 1"


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    import torch

    from trainers import warmstart as W
    from trainers.models import build_tiny_qwen2, build_tokenizer

    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    raw = {"short": [turn(rng, False) for _ in range(args.train)], "long": [turn(rng, True) for _ in range(args.train)]}
    texts = ["\n".join(m["content"] for m in msgs) + "\n" + a for k in raw for msgs, a in raw[k][:500]]
    tok = build_tokenizer(texts, vocab_size=600)
    train = {k: [W._join(tok, W._chat_ids(tok, msgs), a, k) for msgs, a in v] for k, v in raw.items()}
    trng = random.Random(args.seed + 1)
    test = {k: [W._join(tok, W._chat_ids(tok, msgs), a, k) for msgs, a in (turn(trng, k == "long") for _ in range(args.test))]
            for k in ("long", "short")}
    mean_tokens = {k: round(sum(len(e.input_ids) for e in v) / len(v), 1) for k, v in train.items()}
    cfg = dataclasses.replace(W.WarmStartConfig(envs=["alfworld/pick_and_place"]), lr=args.lr, warmup_steps=15)

    def object_right(model: Any, examples: list) -> float:
        ok = 0
        with torch.no_grad():
            for e in examples:
                n = next(i for i, lab in enumerate(e.labels) if lab != W.IGNORE)  # first target token: "take"
                logits = model(input_ids=torch.tensor([e.input_ids[: n + 1]])).logits[0, -1]
                ok += int(logits.argmax()) == e.input_ids[n + 1]  # the object's token
        return ok / len(examples)

    arms = {"full": (0, 0.0), "short then full": (args.short_steps, 0.0), "full + prompt loss": (0, 0.5)}
    out: dict[str, Any] = {}
    for name, (short_steps, weight) in arms.items():
        model = build_tiny_qwen2(tok, args.hidden, 4, 4, 2, max_pos=1024, seed=args.seed)
        opt, done, curve, t0 = None, 0, [], time.time()
        while done < args.steps:
            pool = train["short"] if done < short_steps else train["long"]
            step = min(args.every, args.steps - done, short_steps - done if done < short_steps else args.steps)
            opt, losses = W._sft(model, pool, step, cfg, pad_id=int(tok.pad_token_id), seed=args.seed + done,
                                 batch_size=args.batch_size, start_step=done, total_steps=args.steps, optimizer=opt,
                                 prompt_loss_weight=weight)
            done += step
            curve.append({"step": done, "prompts": "short" if done <= short_steps else "long",
                          "loss": round(sum(losses[-10:]) / len(losses[-10:]), 4),
                          "long": object_right(model, test["long"]), "short": object_right(model, test["short"])})
            print(name, curve[-1], flush=True)
        out[name] = {"short_steps": short_steps, "prompt_loss_weight": weight, "curve": curve,
                     "wall_s": round(time.time() - t0, 1)}
    return {"argv": ["python", "experiments/copy_probe.py", *argv], "environment": environment(),
            "settings": vars(args), "mean_prompt_tokens": mean_tokens, "arms": out}


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    arms = result["arms"]
    steps = [p["step"] for p in next(iter(arms.values()))["curve"]]
    md = [f"Object right after \"take\" (greedy next token) on {s['test']} held-out long prompts "
          f"(~{result['mean_prompt_tokens']['long']:.0f} tokens) / {s['test']} short ones "
          f"(~{result['mean_prompt_tokens']['short']:.0f}); a fresh {s['hidden']}-wide 4-layer tiny Qwen2 per arm, "
          f"batch {s['batch_size']}, lr {s['lr']}, {s['train']} training turns of each length. 22 objects in the task, "
          "3 in the listing at random slots: a guess is right 1 time in 22, the listing's first 1 in 3.", "",
          "| arm | " + " | ".join(str(x) for x in steps) + " | minutes |",
          "|---|" + "---:|" * (len(steps) + 1)]
    for name, arm in arms.items():
        cells = [f"{p['long']:.2f} / {p['short']:.2f}" + ("*" if p["prompts"] == "short" else "") for p in arm["curve"]]
        md.append(f"| {name} | " + " | ".join(cells) + f" | {arm['wall_s'] / 60:.1f} |")
    md += ["", "Cells: long / short; * = the step was still on short prompts. Columns: SFT steps."]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--short-steps", type=int, default=200, help="the curriculum arm's steps on short prompts")
    ap.add_argument("--every", type=int, default=50, help="measure every this many steps")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--train", type=int, default=4000, help="training turns of each length")
    ap.add_argument("--test", type=int, default=100, help="held-out turns of each length")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="copy_probe")
    ap.add_argument("--results-dir", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.short_steps > args.steps or args.every < 1 or args.steps < 1:
        ap.error("need 1 <= --every, 1 <= --steps and --short-steps <= --steps")
    result = run(args, argv)
    write_results(args.out, result, table(result), Path(args.results_dir) if args.results_dir else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

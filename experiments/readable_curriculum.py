"""Does the readable-turns curriculum teach the tiny policy to read an entry, given enough steps?

    python experiments/readable_curriculum.py --steps 1400 --threads 2

A research probe, not a benchmark (not in `make bench`): 1,200 scripted demonstrations of the recurring
dark room (trainers/warmstart/'s teacher), the short-prompt examples of only the turns whose action can be
read off the prompt (`_copyable`: the entry's heading before the staircase is seen, the observation's after),
1,000 demonstrations to train on and 200 held out. Every 200 SFT steps it prints the training loss and the
greedy accuracy of the next token on 300 held-out readable turns (the move the prompt names). The warm start
of the eleventh round ran 600 such steps with a cosine decay over those 600 and ended at loss 0.81.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trainers import prompts as P  # noqa: E402
from trainers import warmstart as W  # noqa: E402
from trainers.models import build_tiny_qwen2, build_tokenizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1400, help="SFT steps (a multiple of 200)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = W.WarmStartConfig(demo_episodes=1200)
    demos = W.collect_demos(cfg)
    texts = [P.ACTOR_SYSTEM, P.ACTOR_USER] + ["\n".join(m["content"] for m in W._actor_prompt(cfg, d, t)) + "\n" + t.label
                                              for d in demos for t in d.turns[:4]]
    tok = build_tokenizer(texts, vocab_size=cfg.vocab_size, model_max_length=cfg.max_positions)
    train, _ = W.policy_examples(demos[:1000], tok, cfg, short=True)
    held, _ = W.policy_examples(demos[1000:], tok, cfg, short=True)
    print(f"{len(train)} readable training turns, {len(held)} held out", flush=True)
    pol = build_tiny_qwen2(tok, cfg.policy_hidden, cfg.policy_layers, cfg.policy_heads, cfg.policy_kv_heads,
                           max_pos=cfg.max_positions, seed=0)

    def accuracy() -> float:
        pol.eval()
        ok = 0
        with torch.no_grad():
            for e in held[:300]:
                n = next(i for i, lab in enumerate(e.labels) if lab != W.IGNORE)
                ok += int(pol(input_ids=torch.tensor([e.input_ids[:n]])).logits[0, -1].argmax()) == e.input_ids[n]
        pol.train()
        return ok / min(300, len(held))

    t0, opt, done = time.time(), None, 0
    for chunk in range(args.steps // 200):
        opt, losses = W._sft(pol, train, 200, cfg, pad_id=int(tok.pad_token_id), seed=chunk, batch_size=16, optimizer=opt,
                             start_step=done, total_steps=args.steps)
        done += 200
        print(f"step {done}: loss {sum(losses[-50:]) / 50:.3f}, held-out accuracy {accuracy():.3f}, {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()

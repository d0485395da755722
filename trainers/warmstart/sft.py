"""The SFT loop and the build's own rollouts: the DAgger episodes of the partly trained policy and the
held-out checks of both models (policy success with no / a right / a wrong entry, extractor parse rate, merges)."""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trainers.backends.logprobs import forward_switches, model_logprobs
from trainers.parsing import parse_extractor_answer
from trainers.warmstart.common import ACTION_LEAD, Demo, IGNORE, SFTExample, WarmStartConfig
from trainers.warmstart.examples import _debrief_quote, _extractor_prompt, _merge_chunk, _merge_messages
from trainers.warmstart.teachers import _claimed, _eval_seed, play_episodes


def _sft(model: Any, examples: Sequence[SFTExample], steps: int, cfg: WarmStartConfig, *, pad_id: int, seed: int,
         batch_size: int,
         tick: Callable[[int], None] | None = None, start_step: int = 0, total_steps: int | None = None,
         optimizer: torch.optim.Optimizer | None = None,
         prompt_loss_weight: float = 0.0) -> tuple[torch.optim.Optimizer, list[float]]:
    """Supervised fine-tuning: mean cross-entropy over target tokens, plus `prompt_loss_weight` times
    the mean next-token cross-entropy over the prompt's tokens (both from trainers/backends/logprobs.py's
    per-token log-probs, as the run's learners); AdamW, warm-up + cosine.

    Each batch is drawn at random and padded on the right; `start_step`/`total_steps` let the
    schedule continue across the DAgger pause with the same optimiser."""
    total = total_steps or steps
    opt = optimizer or torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    rng = random.Random(seed)
    losses: list[float] = []
    switches = forward_switches(model)
    model.train()
    for s in range(start_step, start_step + steps):
        lr = cfg.lr * min(1.0, (s + 1) / max(1, cfg.warmup_steps))
        if s >= cfg.warmup_steps:
            frac = (s - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
            lr = cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        width = max(len(e.input_ids) for e in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # (B, T)
        labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)  # (B, T)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for i, e in enumerate(batch):
            ids[i, : len(e.input_ids)] = torch.tensor(e.input_ids)
            labels[i, : len(e.labels)] = torch.tensor(e.labels)
            attn[i, : len(e.input_ids)] = 1
        target = labels != IGNORE  # (B, T): the tokens the loss is on (labels equal ids there, `_join`)
        target[:, 0] = False  # nothing predicts the first token
        # With the target as the loss mask only its positions reach the output layer and the rows' shared system
        # prompt runs once (policy batch 16 of the default build: step 0.64x the time of cross-entropy over every
        # position); the prompt's loss needs every position's prediction.
        logp, _ = model_logprobs(model, ids, attn, None if prompt_loss_weight > 0 else target,
                                 **switches)  # (B, T): 0 at t = 0, on padding (and off the mask)
        target_loss = -(logp * target).sum() / target.sum()
        loss = target_loss
        if prompt_loss_weight > 0:  # next-token loss on the prompt: real tokens that carry no target label
            prompt = ~target & (attn == 1)  # (B, T)
            prompt[:, 0] = False
            if prompt.any():
                loss = loss + prompt_loss_weight * -(logp * prompt).sum() / prompt.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(target_loss.item()))  # the target's loss alone, comparable across weights
        if tick:
            tick(1)
    model.eval()
    return opt, losses


# ============================================================================ rollouts (DAgger and evaluation)

def action_token_budget(tokenizer: Any, demos: Sequence[Demo], cfg: WarmStartConfig) -> int:
    """Tokens to generate per actor turn: `cfg.action_max_new_tokens`, or the longest demonstrated
    action plus its end token if that is longer."""
    labels = {t.label for d in demos for t in d.turns}
    longest = max((len(tokenizer(ACTION_LEAD + a, add_special_tokens=False)["input_ids"]) for a in labels), default=0)
    return max(cfg.action_max_new_tokens, longest + 1)


def _rollouts(backend: Any, cfg: WarmStartConfig, specs: Sequence[tuple[str, int, str]], *, temperature: float,
              seed: int, source: str, max_turns: int | None = None, max_new_tokens: int | None = None) -> list[Demo]:
    """Play the model on (env name, seed, condition), `cfg.rollout_batch` episodes in lockstep (the Roller, through
    teachers.play_episodes). Every state is labelled with the expert's action for that condition (DAgger); the
    model's own action is what is played. `max_turns` cuts episodes short (they then count as failures);
    `max_new_tokens` per turn defaults to `cfg.action_max_new_tokens`."""
    return play_episodes(cfg, [(n, s, c, 0.0) for n, s, c in specs], source=source, seed=seed, actor=backend,
                         temperature=temperature, max_turns=max_turns, max_new_tokens=max_new_tokens)


def _evaluate_policy(backend: Any, cfg: WarmStartConfig, max_new_tokens: int | None = None) -> tuple[dict[str, Any], list[Demo]]:
    """Greedy success and mean actions (failures count at the turn limit) on held-out seeds."""
    specs = [(name, _eval_seed(ei, i), cond) for ei, name in enumerate(cfg.envs)
             for cond in ("none", "correct", "wrong") for i in range(cfg.eval_episodes)]
    demos = _rollouts(backend, cfg, specs, temperature=0.0, seed=cfg.seed + 7, source="eval", max_new_tokens=max_new_tokens)
    res: dict[str, Any] = {}
    for name in cfg.envs:
        for cond in ("none", "correct", "wrong"):
            ds = [d for d in demos if d.env == name and d.condition == cond]
            ref = [d.facts.get("expert_actions") for d in ds if d.facts.get("expert_actions") is not None]
            res[f"{name}/{cond}"] = {
                "episodes": len(ds),
                "success": sum(d.success for d in ds) / max(1, len(ds)),
                "mean_actions": sum(len(d.turns) for d in ds) / max(1, len(ds)),
                "invalid_share": sum(d.invalid_actions for d in ds) / max(1, sum(len(d.turns) for d in ds)),
                **({"expert_mean_actions": sum(ref) / len(ref)} if ref else {}),
            }
    return res, demos


def _evaluate_extractor(backend: Any, cfg: WarmStartConfig, demos: Sequence[Demo]) -> dict[str, Any]:
    """Share of greedy extraction answers on held-out trajectories that parse as operation lists."""
    rng = random.Random(cfg.seed + 11)
    pick = rng.sample(list(demos), k=min(cfg.eval_extractor, len(demos)))
    prompts = [backend.apply_chat_template(_extractor_prompt(cfg, d), add_generation_prompt=True, tokenize=True) for d in pick]
    outs = backend.generate(prompts, max_new_tokens=cfg.extractor_max_new_tokens, temperature=0.0, seed=cfg.seed)
    parsed = [parse_extractor_answer(o.text, n_previous=1 if d.entry else 0) for o, d in zip(outs, pick)]
    ok = [p for p in parsed if p is not None]
    # MiniHack: is what the entries claim true of the level the trajectory came from (envs/entry_check.py)? And of
    # the trajectories whose debrief says where the staircase was, how many answers wrote an entry that says it?
    right = checkable = stated = copied = quoted = 0
    for p, d, o in zip(parsed, pick, outs):
        offset = d.facts.get("offset") if d.env.startswith("minihack/") else None
        if offset is None:
            continue
        claims = [_claimed(op.text) for op in (p or []) if op.text]
        checkable += sum(c is not None for c in claims)
        right += sum(c == tuple(offset) for c in claims)
        if _debrief_quote(d):
            stated += 1
            copied += tuple(offset) in claims
            quoted += _debrief_quote(d) in o.text.split("</think>", 1)[0]
    merge = _evaluate_merge(backend, cfg, demos)
    return {
        "answers": len(pick),
        "parse_rate": len(ok) / max(1, len(pick)),
        "ops_per_answer": sum(len(p) for p in ok) / max(1, len(ok)),
        "parse_rate_with_ops": sum(1 for p in ok if p) / max(1, len(pick)),  # parsed and not the empty list
        **({"entries_checked": checkable, "entry_correct_share": right / checkable} if checkable else {}),
        **({"debriefs_stated": stated, "debrief_copied_share": copied / stated, "debrief_quoted_share": quoted / stated}
           if stated else {}),
        "example": outs[0].text[:600] if outs else "",
        **merge,
    }


def _evaluate_merge(backend: Any, cfg: WarmStartConfig, demos: Sequence[Demo]) -> dict[str, Any]:
    """Greedy merge answers on held-out chunks (lessons of the evaluation episodes): the share that
    parses, the share with at least one operation, and the share equal to the teacher's answer."""
    from core.types import Experience
    from trainers.parsing import _answer_json, parse_merge

    rng = random.Random(cfg.seed + 13)
    by_task: dict[str, list[Demo]] = {}
    for d in demos:
        by_task.setdefault(d.task, []).append(d)
    chunks = [(task, *_merge_chunk(rng.sample(g, k=min(len(g), 24)), rng)) for task, g in by_task.items()
              for _ in range(max(1, cfg.eval_extractor // max(1, len(by_task))))]
    if not chunks:
        return {}
    prompts = [backend.apply_chat_template(_merge_messages(task, entries), add_generation_prompt=True, tokenize=True)
               for task, entries, _, _ in chunks]
    outs = backend.generate(prompts, max_new_tokens=cfg.extractor_max_new_tokens, temperature=0.0, seed=cfg.seed)
    parsed = exact = with_ops = 0
    for (task, entries, ops, _), o in zip(chunks, outs):
        got = parse_merge(o.text, [Experience(id=i, text=t) for i, t in enumerate(entries)])
        parsed += got is not None
        with_ops += bool(got)
        data, err = _answer_json(o.text)
        exact += not err and data == ops
    n = len(chunks)
    return {"merge_answers": n, "merge_parse_rate": parsed / n, "merge_parse_rate_with_ops": with_ops / n,
            "merge_exact_rate": exact / n, "merge_example": outs[0].text[:400]}


# ============================================================================ the build


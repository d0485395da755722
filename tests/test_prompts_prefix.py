"""Prefix-stable actor prompts (issue 41, item 2): with history in the prompt, each turn's prompt extends the last
one's (up to where the last one's current observation began) until the history window moves, in both prompt sets,
so vLLM's automatic prefix cache (and the hf back end's episode sessions) serve it; history_turns 0, the embedded
policy's default, renders as it always did."""
from __future__ import annotations

import pytest

from trainers import prompts as P


def _lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _compact_user(hist, t: int, history_turns: int, stride: int, max_chars: int = 10_000) -> str:
    h = P.fit_history(hist, max_turns=history_turns, max_chars=max_chars, stride=stride)
    return P.turn_messages("compact", action_format="f", task="reach the stairs", observation=f"obs {t}\nyou see a wall",
                           experience="go east", history=h)[1]["content"]


def _extends(prev: str, cur: str) -> bool:
    """cur repeats prev up to the start of prev's current observation (the last "Observation:" line)."""
    keep = prev[: prev.rindex("Observation:")]
    return cur.startswith(keep)


@pytest.mark.parametrize("history_turns, moves_at", [(4, {5, 7}), (2, {3, 4, 5, 6, 7, 8}), (6, {7})])
def test_compact_prompt_extends_the_previous_turn_between_window_moves(history_turns, moves_at):
    """The compact set's window moves half its length at a time, as the chat set's: between moves a turn's prompt is
    the last one's, its current observation turned into a history item, then the new observation."""
    stride = P.history_stride("compact", history_turns)
    assert stride == P.history_stride("chat", history_turns) == max(1, history_turns // 2)
    hist: list[tuple[str, str]] = []
    prev = None
    moved = set()
    for t in range(9):
        cur = _compact_user(hist, t, history_turns, stride)
        if prev is not None and not _extends(prev, cur):
            moved.add(t)
        prev = cur
        hist.append((f"obs {t}\nyou see a wall", "north"))
    assert moved == moves_at
    # before (a window moved every turn): once full, no turn extended the last beyond the task line
    hist, prev, moved = [], None, set()
    for t in range(9):
        cur = _compact_user(hist, t, 4, 1)
        if prev is not None and not _extends(prev, cur):
            moved.add(t)
        prev = cur
        hist.append((f"obs {t}\nyou see a wall", "north"))
    assert moved == {5, 6, 7, 8}


def test_the_character_budget_moves_the_window_by_strides_too():
    hist = [(f"observation number {i}", "north") for i in range(8)]  # 26 characters a pair
    stride = P.history_stride("compact", 6)
    starts = []
    for n in range(len(hist) + 1):
        h = P.fit_history(hist[:n], max_turns=6, max_chars=80, stride=stride)
        starts.append(n - len(h))
        assert sum(len(o) + len(a) for o, a in h) <= 80
    assert all(s % stride == 0 for s in starts) and starts == sorted(starts)


def test_history_turns_0_renders_the_default_prompt_unchanged():
    """The embedded policy is built and run without history: no window, nothing a stride could move."""
    hist = [(f"obs {i}", "north") for i in range(5)]
    for style in P.PROMPT_STYLES:
        assert P.history_stride(style, 0) == 1
        assert P.fit_history(hist, max_turns=0, max_chars=1200, stride=P.history_stride(style, 0)) == []
    msgs = P.turn_messages("compact", action_format="f", task="t", observation="o", history=[])
    assert msgs[1]["content"] == "Task: t\nObservation:\no\nYour action:"


def test_roller_compact_prompts_share_their_tokens_between_window_moves(tmp_path):
    """On the token ids the Roller sends (a real tokenizer, a real MiniHack episode, history on): between window
    moves the next turn's ids start with the last turn's ids up to its current observation."""
    from dataclasses import dataclass

    from envs.pool import EnvPool
    from trainers.config import ModelSection, RolloutSection
    from trainers.models import HFBackend, build_tiny_qwen2, build_tokenizer, save_model_folder
    from trainers.rollout import EpisodeSpec, Roller

    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, P.HISTORY_ITEM, "north east south west southeast"] * 30,
                          vocab_size=400)
    save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1), tok, tmp_path)
    hf = HFBackend(tmp_path, device="cpu")

    @dataclass
    class Out:
        token_ids: list
        text: str
        logprobs: list
        finish_reason: str = "stop"

    class Walker:  # walks into the wall: the episode lasts every turn
        def apply_chat_template(self, *a, **k):
            return hf.apply_chat_template(*a, **k)

        def generate(self, prompts, **kw):
            ids = hf.encode("west")
            return [Out(ids, "west", [-0.1] * len(ids)) for _ in prompts]

    pool = EnvPool(["minihack/Room-5x5"], num_workers=1)
    try:
        r = Roller(Walker(), pool, None, rollout_cfg=RolloutSection(history_turns=4, history_chars=100_000),
                   actor_cfg=ModelSection(), max_turns=8)
        ep = r.collect([EpisodeSpec("minihack/Room-5x5", 0, False, 0)], step=0)[0]
    finally:
        pool.close()
    ids = [t.prompt_ids for t in ep.turns]
    assert len(ids) == 8
    for t in range(1, 8):
        prev_text = hf.tokenizer.decode(ids[t - 1])
        head = prev_text[: prev_text.rindex("Observation:")].rstrip()  # the last prompt up to its current observation
        shared = hf.tokenizer.decode(ids[t][: _lcp(ids[t - 1], ids[t])])  # the tokens this turn repeats
        # window 4, stride 2: it moves at turns 5 and 7; every other turn repeats the last one's tokens that far
        assert shared.startswith(head) == (t not in (5, 7)), (t, len(shared), len(head))

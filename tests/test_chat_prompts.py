"""Issue 24's fast half: the chat prompt set, tolerant action parsing, episode KV-cache sessions on a
tiny model, and which roles may use an OpenAI-compatible endpoint (config)."""
from __future__ import annotations

import pytest
import torch

from core.config import ConfigError
from trainers import prompts as P
from trainers.config import load_run_config
from trainers.models import build_tiny_qwen2, build_tokenizer, load_backend, save_model_folder
from trainers.parsing import parse_action

ADM = ["go to fridge 1", "go to countertop 2", "open fridge 1", "look", "inventory"]


# ---------------------------------------------------------------- parsing

@pytest.mark.parametrize("reply, want", [
    ("go to fridge 1", "go to fridge 1"),
    ("Action: go to fridge 1", "go to fridge 1"),
    ('"go to fridge 1".', "go to fridge 1"),
    ("`open fridge 1`", "open fridge 1"),
    ("- look", "look"),
    ("1. Look", "look"),
    ("> inventory", "inventory"),
    ("\n\nGo To Fridge 1\nbecause it is cold", "go to fridge 1"),
    ("I will go to countertop 2 to look there", "go to countertop 2"),  # the longest admissible inside wins
    ("My action: open fridge 1!", "open fridge 1"),
])
def test_parse_action_is_tolerant_with_admissible_actions(reply, want):
    assert parse_action(reply, ADM) == want
    assert P.parse_actor_reply(reply, ADM) == ("action", want)


def test_parse_action_keeps_what_names_no_action_and_the_compact_format():
    # a copied observation sentence is not picked apart for a direction
    assert parse_action("You see a door to the north of the room", ["north", "south"]) == "You see a door to the north of the room"
    assert parse_action("fly away.", ADM) == "fly away"  # cleaned, then judged invalid by the env
    assert parse_action("", ADM) == ""
    # without admissible actions (the tiny models' compact prompts): the first non-empty line, as before
    assert parse_action("  north  \nsouth") == "north"
    assert P.parse_actor_reply('Action: "north"') == ("action", 'Action: "north"')
    assert P.parse_actor_reply("<search_and_ask>where is the key</search_and_ask>", ADM) == ("tool", "where is the key")


# ---------------------------------------------------------------- the chat set

def test_chat_messages_carry_rules_actions_example_experience_and_history():
    msgs = P.chat_actor_messages(action_format="Move with compass words.", task="reach the stairs",
                                 observation="obs now", experience="go east first",
                                 history=[("obs 0", "north"), ("obs 1", "east")], admissible=["north", "east"])
    roles = [m["role"] for m in msgs]
    assert roles[0] == "system" and "Move with compass words." in msgs[0]["content"]
    assert roles[1:5] == ["user", "assistant", "user", "assistant"]  # two example exchanges
    assert roles[5:] == ["user", "assistant", "user", "assistant", "user"]
    first = msgs[5]["content"]
    assert first.startswith("Task: reach the stairs") and "go east first" in first and "obs 0" in first
    assert [msgs[6]["content"], msgs[8]["content"]] == ["north", "east"]
    assert "- north\n- east" in msgs[-1]["content"] and "obs now" in msgs[-1]["content"]
    assert "Admissible actions" not in msgs[7]["content"]  # past turns render without their lists
    assert "search_and_ask" not in msgs[0]["content"]
    assert "search_and_ask" in P.chat_actor_messages(action_format="", task="t", observation="o", allow_tool=True)[0]["content"]


def test_chat_prompt_extends_the_previous_turn_between_window_moves():
    """The property episode sessions rely on: turn t+1's messages start with turn t's, except the
    last user message (which loses its action list), until the history window moves."""
    hist: list[tuple[str, str]] = []
    prev = None
    moves = 0
    for t in range(9):
        h = P.fit_history(hist, max_turns=4, max_chars=10_000, stride=P.history_stride("chat", 4))
        msgs = P.turn_messages("chat", action_format="f", task="t", observation=f"obs {t}", history=h, admissible=["a", "b"])
        if prev is not None and msgs[: len(prev) - 1] != prev[:-1]:
            moves += 1
        prev = msgs
        hist.append((f"obs {t}", "a"))
    assert moves == 2  # window 4, stride 2, turns 0..8: it moves at turns 5 and 7 only
    # compact keeps its one-message shape and its sliding window
    c = P.turn_messages("compact", action_format="f", task="t", observation="o", history=[("x", "y")])
    assert [m["role"] for m in c] == ["system", "user"]


def test_fit_history_with_a_stride_moves_in_steps_and_keeps_the_first_pair():
    hist = [(f"o{i}", f"a{i}") for i in range(7)]
    assert P.fit_history(hist[:4], max_turns=4, max_chars=1000, stride=2) == hist[:4]
    assert P.fit_history(hist[:5], max_turns=4, max_chars=1000, stride=2) == hist[2:5]
    assert P.fit_history(hist[:6], max_turns=4, max_chars=1000, stride=2) == hist[2:6]
    assert P.fit_history(hist, max_turns=4, max_chars=1000, stride=2) == hist[4:]
    assert P.fit_history(hist, max_turns=4, max_chars=1000, stride=2, keep_first=True) == [hist[0], *hist[3:]]
    assert P.fit_history(hist, max_turns=4, max_chars=12, stride=2) == hist[4:]  # 3 pairs of 4 characters
    assert P.fit_history(hist, max_turns=4, max_chars=7, stride=2) == hist[6:]  # the budget moves the start on by strides
    # stride 1 is the old behaviour
    assert P.fit_history(hist, max_turns=2, max_chars=1000) == P.fit_history(hist, max_turns=2, max_chars=1000, stride=1) == hist[-2:]


def test_prompt_style_and_templates_are_config_fields():
    assert load_run_config("rollout: {prompt_style: chat}\n").rollout.prompt_style == "chat"
    with pytest.raises(ConfigError, match="prompt_style"):
        load_run_config("rollout: {prompt_style: fancy}\n")
    assert "CHAT_SYSTEM" in P.TEMPLATE_NAMES and P.reply_stops("chat") == [] and P.reply_stops("compact") == ["\n"]


# ---------------------------------------------------------------- which roles may use an endpoint

def test_openai_backend_is_for_inference_roles_only():
    url = "base_url: 'http://127.0.0.1:8000/v1'"
    # training roles are refused, naming why and the way out
    with pytest.raises(ConfigError, match=r"actor.backend: openai serves inference only.*complementary.*exp_only"):
        load_run_config(f"run: {{variant: complementary}}\nactor: {{backend: openai, {url}}}\n")
    with pytest.raises(ConfigError, match=r"extractor.model.backend: openai serves inference only.*static"):
        load_run_config(f"run: {{variant: exp_only}}\nextractor: {{model: {{backend: openai, {url}}}}}\n")
    with pytest.raises(ConfigError, match="actor.backend: openai serves inference only"):
        load_run_config(f"run: {{variant: grpo}}\nactor: {{backend: openai, {url}}}\n")
    # frozen roles are allowed
    cfg = load_run_config(f"run: {{variant: exp_only}}\nactor: {{backend: openai, {url}, served_model: smollm2}}\n")
    assert cfg.actor.backend == "openai" and cfg.actor.served_model == "smollm2"
    assert load_run_config(f"run: {{variant: static}}\nextractor: {{model: {{backend: openai, {url}}}}}\n").extractor.model.base_url
    # the two fields go together
    with pytest.raises(ConfigError, match="needs base_url"):
        load_run_config("run: {variant: exp_only}\nactor: {backend: openai}\n")
    with pytest.raises(ConfigError, match="base_url belongs to backend openai"):
        load_run_config(f"actor: {{{url}}}\n")


# ---------------------------------------------------------------- sessions: rollouts reuse their prefix

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    texts = [f"user observation {i} north south east west go to fridge {i % 5} look take apple" for i in range(200)]
    tok = build_tokenizer(texts, vocab_size=400)
    model = build_tiny_qwen2(tok, hidden=64, layers=2, heads=4, kv_heads=2, mlp=128, max_pos=1024, seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)
    return load_backend("hf", save_model_folder(model, tok, tmp_path_factory.mktemp("tiny24")), quiet=True)


def _episode_turns(backend, sessions: bool, *, temperature: float, n: int = 3, turns: int = 4):
    convs = [[{"role": "system", "content": "play"}] for _ in range(n)]
    outs_all = []
    backend.drop_sessions()
    before = backend.prefill_computed
    for t in range(turns):
        for i, c in enumerate(convs):
            c.append({"role": "user", "content": f"observation {t} {'north ' * (i + t)}go to fridge {i}"})
        ids = [backend.apply_chat_template(c, tokenize=True) for c in convs]
        outs = backend.generate(ids, max_new_tokens=5, temperature=temperature, stop=[], seed=7 + t,
                                sessions=[f"ep{i}" for i in range(n)] if sessions else None)
        for c, o in zip(convs, outs):
            c.append({"role": "assistant", "content": o.text})
        outs_all.append(outs)
    return outs_all, backend.prefill_computed - before


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sessions_give_the_same_replies_and_prefill_less(tiny, temperature):
    plain, plain_tokens = _episode_turns(tiny, False, temperature=temperature)
    kept, kept_tokens = _episode_turns(tiny, True, temperature=temperature)
    for a_turn, b_turn in zip(plain, kept):
        for a, b in zip(a_turn, b_turn):
            assert a.token_ids == b.token_ids and a.prompt_ids == b.prompt_ids
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    assert kept_tokens < 0.6 * plain_tokens, (kept_tokens, plain_tokens)
    assert len(tiny.sessions) == 3
    tiny.drop_sessions(["ep0"])
    assert set(tiny.sessions) == {"ep1", "ep2"}
    tiny.load_weights(tiny.state_dict_for_sync())  # new weights: every kept cache is stale
    assert not tiny.sessions


def test_a_session_whose_prompt_diverges_reuses_only_the_common_prefix(tiny):
    tiny.drop_sessions()
    p1 = tiny.apply_chat_template([{"role": "user", "content": "observation 1 north go to fridge 1"}], tokenize=True)
    tiny.generate([p1], max_new_tokens=3, temperature=0.0, sessions=["x"])
    p2 = tiny.apply_chat_template([{"role": "user", "content": "observation 2 south"}], tokenize=True)
    before = tiny.prefill_computed
    a = tiny.generate([p2], max_new_tokens=4, temperature=0.0, sessions=["x"])[0]
    shared = next(i for i, (x, y) in enumerate(zip(p1, p2)) if x != y)
    assert tiny.prefill_computed - before == len(p2) - shared
    assert a.token_ids == tiny.generate([p2], max_new_tokens=4, temperature=0.0)[0].token_ids
    tiny.drop_sessions()


def test_an_ab_test_may_name_its_actor_back_end_and_prompts():
    from trainers.evaluate import validate_ab_config

    base = {"env": "minihack/Room-5x5", "seeds": [1, 2], "arms": {"A": {"kind": "none"}, "B": {"kind": "current"}}}
    assert validate_ab_config(base) == ""
    ok = {**base, "actor": {"backend": "openai", "base_url": "http://127.0.0.1:8080/v1", "path": "/m", "prompt_style": "chat"}}
    assert validate_ab_config(ok) == ""
    assert "needs base_url" in validate_ab_config({**base, "actor": {"backend": "openai", "path": "/m"}})
    assert "prompt_style" in validate_ab_config({**base, "actor": {"prompt_style": "fancy"}})
    assert "mapping" in validate_ab_config({**base, "actor": "openai"})


def test_the_roller_keeps_episode_caches_only_for_the_chat_prompts(tiny):
    from trainers.config import RolloutSection
    from trainers.rollout import Roller

    def roller(**kw):
        return Roller(tiny, None, None, rollout_cfg=RolloutSection(**kw), actor_cfg=None)

    assert roller(prompt_style="chat")._sessions()
    assert not roller(prompt_style="chat", reuse_cache=False)._sessions()
    assert not roller(prompt_style="compact")._sessions()  # the tiny default: measured slower with them


def test_past_turns_can_sit_inside_the_current_user_message():
    t = P.Templates()
    t.texts["CHAT_PAST_INLINE"] = "Earlier observation:\n{observation}\nYou did: {action}\n"
    msgs = P.chat_actor_messages(action_format="f", task="t", observation="o2", history=[("o0", "a0"), ("o1", "a1")],
                                 admissible=["a", "b"], templates=t)
    assert [m["role"] for m in msgs[5:]] == ["user"]  # after the system text and the two examples: one user message
    assert msgs[-1]["content"].startswith("Task: t\nEarlier observation:\no0\nYou did: a0\nEarlier observation:\no1\nYou did: a1\n"
                                          "Observation:\no2\nAdmissible actions:\n- a\n- b\n")
    # the default keeps past turns as user/assistant messages
    assert [m["role"] for m in P.chat_actor_messages(action_format="f", task="t", observation="o2", history=[("o0", "a0")])[5:]] \
        == ["user", "assistant", "user"]

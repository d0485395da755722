"""Constrained decoding to the env's admissible actions (rollout.constrain_actions; trainers/backends/choices.py ActionChoice):
the allowed-token walk on hand-made action sets, the hf back end's masked generate on a tiny model, the Roller on a
real MiniHack pool, the config field, and vLLM's structured-output arguments (where vLLM is installed)."""
from __future__ import annotations

import re

import pytest
import torch

from conftest import require_vllm
from core.config import ConfigError
from trainers.config import ModelSection, RolloutSection, load_run_config
from trainers.models import ActionChoice, ChoiceState, ChoiceVocab, as_choice, build_tiny_qwen2, build_tokenizer, load_backend, save_model_folder

TEXTS = [f"go to fridge {i} go to countertop {i % 3} north northeast east look take apple {i} from fridge 1 "
         "open the door search[red shoes]" for i in range(200)]
ADM = ["go to fridge 1", "go to fridge 10", "go to countertop 2", "north", "northeast", "look", "take apple 1 from fridge 1"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tok = build_tokenizer(TEXTS, vocab_size=400)
    model = build_tiny_qwen2(tok, hidden=64, layers=2, heads=4, kv_heads=2, mlp=128, max_pos=4096, seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)  # sharp logits: the free model's greedy replies are far from any action
    return load_backend("hf", save_model_folder(model, tok, tmp_path_factory.mktemp("tiny_c")), quiet=True)


# ---------------------------------------------------------------- the choice itself

def test_a_choice_reads_placeholders_as_free_text_and_renders_as_grammar_and_regex():
    c = ActionChoice.of(["look", "look", "", "click[buy now]", "search[<query>]"], ["<search_and_ask>"])
    assert c.actions == ("look", "click[buy now]") and c.open_prefixes == ("<search_and_ask>", "search[")
    assert as_choice(["look"]) == ActionChoice(("look",)) and as_choice([]) is None and as_choice(None) is None
    with pytest.raises(TypeError):
        as_choice("look")
    rx = re.compile(c.regex())
    for ok in ("look", "click[buy now]", "search[red shoes]", "<search_and_ask>where is the key"):
        assert rx.fullmatch(ok), ok
    for bad in ("lookx", "click[buy]", "search", "go"):
        assert not rx.fullmatch(bad), bad
    g = ActionChoice(('say "hi"', "a\\b")).gbnf()
    assert g == 'root ::= "say \\"hi\\"" | "a\\\\b"\n'
    assert ActionChoice(("look",), ("search[",)).gbnf() == 'root ::= "look" | "search[" [^\\n]*\n'


def _replies(state_of, end_ids: set[int], max_new: int, limit: int = 20_000) -> list[tuple[str, bool]]:
    """Every reply the constraint lets through within max_new tokens: (text, ended by an end token)."""
    out, stack = [], [(state_of(), 0)]
    while stack:
        st, depth = stack.pop()
        allowed = st.allowed(max_new - depth)
        assert allowed, f"no token allowed after {st.text!r}"
        for t in allowed:
            if t in end_ids:
                out.append((st.text, True))
                continue
            nxt = ChoiceState(st.choice, st.vocab, st.end_ids)
            nxt.text, nxt.free = st.text, st.free
            nxt.advance(t)
            if depth + 1 == max_new or nxt.free:
                out.append((nxt.text, False))
            else:
                stack.append((nxt, depth + 1))
        assert len(out) < limit
    return out


def test_the_allowed_tokens_spell_exactly_the_admissible_actions(tiny):
    """Shared prefixes (go to fridge 1 / go to countertop 2), one action a prefix of another (north / northeast,
    fridge 1 / fridge 10), multi-token words, and the end token only once an action is complete."""
    vocab = ChoiceVocab(tiny.tokenizer, len(tiny.tokenizer))
    ends = set(tiny.end_ids)
    choice = ActionChoice.of(ADM)
    assert any(len(tiny.encode(a)) > 3 for a in ADM)  # multi-token actions
    replies = _replies(lambda: ChoiceState(choice, vocab, ends), ends, max_new=24)
    assert {t for t, ended in replies} == set(ADM) and all(ended for _, ended in replies)
    # several tokenizations of one action are allowed (the model's own, whichever it prefers)
    assert sum(t == "northeast" for t, _ in replies) > 1
    st = ChoiceState(choice, vocab, ends)
    for t in tiny.encode("north"):
        st.advance(t)
    nxt = st.allowed(10)
    assert ends <= set(nxt) and all(vocab.piece.get(t, "").startswith("e") or "east".startswith(vocab.piece.get(t, "-"))
                                    for t in nxt if t not in ends)
    st = ChoiceState(choice, vocab, ends)
    for t in tiny.encode("go to fridge 1"):
        st.advance(t)
    assert ends <= set(st.allowed(10)) and any(vocab.piece.get(t) == "0" for t in st.allowed(10))


def test_a_reply_is_kept_within_its_token_budget(tiny):
    """With the budget of the action's own tokenization, every path ends on a complete action: a token is offered only
    while the rest of its action still fits."""
    vocab = ChoiceVocab(tiny.tokenizer, len(tiny.tokenizer))
    ends = set(tiny.end_ids)
    choice = ActionChoice.of(["take apple 1 from fridge 1", "look"])
    n = len(tiny.encode("take apple 1 from fridge 1"))
    replies = _replies(lambda: ChoiceState(choice, vocab, ends), ends, max_new=n)
    assert {t for t, _ in replies} == {"take apple 1 from fridge 1", "look"}
    # a budget no action fits: the reply still stays on an action (cut as a prefix of one)
    short = _replies(lambda: ChoiceState(ActionChoice(("take apple 1 from fridge 1",)), vocab, ends), ends, max_new=2)
    assert all("take apple 1 from fridge 1".startswith(t) and not ended for t, ended in short)


def test_an_open_prefix_frees_the_rest_of_the_reply(tiny):
    vocab = ChoiceVocab(tiny.tokenizer, len(tiny.tokenizer))
    st = ChoiceState(ActionChoice.of(["look", "search[<query>]"]), vocab, set(tiny.end_ids))
    for t in tiny.encode("search["):
        assert st.allowed(10) is not None and t in st.allowed(10)
        st.advance(t)
    assert st.free and st.allowed(10) is None


# ---------------------------------------------------------------- the hf back end

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constrained_generate_writes_only_admissible_actions(tiny, temperature):
    prompts = [tiny.apply_chat_template([{"role": "user", "content": f"observation {i} north look go to fridge {i}"}], tokenize=True)
               for i in range(5)]
    free = tiny.generate(prompts, max_new_tokens=12, temperature=0.0)
    assert not any(o.text in ADM for o in free)  # the tiny model on its own writes none of them
    sets = [ADM, ["north", "northeast"], ADM[:3], None, ["look"]]  # different sets per row, one row free
    outs = tiny.generate(prompts, max_new_tokens=12, temperature=temperature, seed=5, choices=sets)
    for o, s in zip(outs, sets):
        if s is None:
            continue
        assert o.text in s and o.finish_reason == "eos" and o.token_ids[-1] in tiny.end_ids, (o.text, s)
    if temperature == 0.0:
        assert outs[3].token_ids == free[3].token_ids  # the free row is untouched
    # the learner's view: logprobs are the unmasked model's, what logprobs() recomputes on prompt + reply
    re_lp = tiny.logprobs([p + o.token_ids for p, o in zip(prompts, outs)])
    for i, (p, o) in enumerate(zip(prompts, outs)):
        got = torch.tensor(o.logprobs)
        assert torch.allclose(got, re_lp[i, len(p): len(p) + len(o.token_ids)], atol=1e-4)
        if sets[i] is not None and temperature == 1.0:
            # drawn from the masked distribution: each token at least as likely there as under the raw model
            assert all(s >= r - 1e-5 for s, r in zip(o.sample_logprobs, o.logprobs))
            assert any(s > r + 1e-3 for s, r in zip(o.sample_logprobs, o.logprobs))
    # sampled replies vary between seeds but stay inside the set
    many = tiny.generate([prompts[0]] * 12, max_new_tokens=12, temperature=1.0, seed=9, choices=[ADM] * 12)
    assert all(o.text in ADM for o in many)
    if temperature == 1.0:
        assert len({o.text for o in many}) > 1


@pytest.mark.slow
def test_constrained_generate_with_episode_sessions_matches_without(tiny):
    convs = [[{"role": "user", "content": f"observation {i} go to fridge"}] for i in range(3)]
    runs = []
    for sessions in (False, True):
        tiny.drop_sessions()
        cs = [list(c) for c in convs]
        texts = []
        for turn in range(3):
            ids = [tiny.apply_chat_template(c, tokenize=True) for c in cs]
            outs = tiny.generate(ids, max_new_tokens=12, temperature=1.0, seed=turn, choices=[ADM] * 3,
                                 sessions=[f"e{i}" for i in range(3)] if sessions else None)
            for c, o in zip(cs, outs):
                c += [{"role": "assistant", "content": o.text}, {"role": "user", "content": f"turn {turn}"}]
            texts.append([o.text for o in outs])
        runs.append(texts)
    tiny.drop_sessions()
    assert runs[0] == runs[1] and all(t in ADM for turn in runs[0] for t in turn)


def test_generate_refuses_a_choice_list_of_the_wrong_length(tiny):
    with pytest.raises(ValueError, match="choices names 1 action sets for 2 prompts"):
        tiny.generate([[1, 2], [3, 4]], max_new_tokens=2, choices=[ADM])


# ---------------------------------------------------------------- the Roller and the config

def _live(env: str, admissible: list[str], tool_calls: int = 0):
    from core.types import Trajectory
    from trainers.rollout import Episode, EpisodeSpec, _Live

    lv = _Live(Episode(EpisodeSpec(env, 0, False, 0), Trajectory(env=env, task="t", seed=0, with_experience=False, group_id=0)),
               0, "", "obs", admissible=admissible)
    lv.tool_calls = tool_calls
    return lv


def test_which_turns_the_roller_constrains(tiny):
    from trainers.rollout import Roller

    tool = lambda *a: ("", [], None)  # noqa: E731 - a search-and-ask stand-in; only whether one exists matters here
    r = Roller(tiny, None, None, rollout_cfg=RolloutSection(constrain_actions=True, search_and_ask=1), actor_cfg=None, tool_fn=tool)
    assert r.choice(_live("alfworld/pick_and_place", ["look", "go to fridge 1"])) == \
        ActionChoice(("look", "go to fridge 1"), ("<search_and_ask>",))
    assert r.choice(_live("alfworld/pick_and_place", ["look"], tool_calls=1)) == ActionChoice(("look",))  # budget spent
    assert r.choice(_live("webshop", ["search[<query>]"], tool_calls=1)) == ActionChoice((), ("search[",))
    assert r.choice(_live("swe/local", ["ls", "submit"])) is None  # SWE lists only some of its commands
    assert r.choice(_live("minihack/Room-5x5", [])) is None  # no list: a free reply


@pytest.mark.slow
def test_a_constrained_rollout_on_minihack_sends_only_valid_actions(tiny):
    from envs.pool import EnvPool
    from trainers.rollout import EpisodeSpec, Roller

    pool = EnvPool(["minihack/Room-5x5"] * 3, num_workers=1)
    try:
        specs = [EpisodeSpec("minihack/Room-5x5", s, False, s) for s in range(3)]
        got = {}
        for on in (False, True):
            roller = Roller(tiny, pool, None, rollout_cfg=RolloutSection(prompt_style="chat", constrain_actions=on),
                            actor_cfg=ModelSection(max_new_tokens=8, temperature=1.0), max_turns=3, seed=0)
            got[on] = roller.collect(specs, step=0, retrieval=False)
        assert sum(e.invalid_actions for e in got[False]) > 0  # the untrained model on its own
        assert sum(e.invalid_actions for e in got[True]) == 0 and all(e.traj.num_actions == 3 for e in got[True])
        for e in got[True]:
            for t in e.turns:  # the learner's rows: a reply and its unmasked log-probs, one per token
                assert t.response_ids[-1] in tiny.end_ids and len(t.logprobs) == len(t.response_ids)
    finally:
        pool.close()


def test_constrain_actions_is_a_validated_config_field():
    assert RolloutSection().constrain_actions is False
    assert load_run_config("rollout: {prompt_style: chat, constrain_actions: true}\n").rollout.constrain_actions is True
    with pytest.raises(ConfigError, match="rollout.constrain_actions"):
        load_run_config("rollout: {constrain_actions: maybe}\n")
    with pytest.raises(ConfigError, match="rollout.constrain_actions must be true or false"):
        RolloutSection(constrain_actions="yes")


# ---------------------------------------------------------------- vLLM (make setup installs it; tests/test_vllm.py runs the engine)

def test_vllm_structured_outputs_arguments():
    require_vllm()
    from vllm import SamplingParams

    from trainers.models import vllm_structured_kwargs

    assert vllm_structured_kwargs(None) == {}
    for choice in (ActionChoice(("look", "go to fridge 1")), ActionChoice(("look",), ("search[",))):
        kw = vllm_structured_kwargs(choice)
        p = SamplingParams(max_tokens=8, **kw)
        spec = getattr(p, "structured_outputs", None) or getattr(p, "guided_decoding", None)
        assert spec is not None and (spec.choice == list(choice.actions) if not choice.open_prefixes else spec.regex == choice.regex())


@pytest.mark.slow
def test_the_demo_player_can_decode_constrained_too(tiny, tmp_path):
    from trainers.player import EpisodePlayer

    player = EpisodePlayer("minihack/Room-5x5", 4, db_url=f"sqlite:///{tmp_path / 'w.db'}", use_library=False,
                           checkpoint=str(tiny.path),  # the actor is given: no default models built
                           max_new_tokens=8, prompt_style="chat", actor=tiny, constrain_actions=True)
    try:
        player.reset()
        turns = [player.step() for _ in range(3)]
        assert all(t["action"] in player.env.admissible_actions for t in turns), turns
    finally:
        player.close()

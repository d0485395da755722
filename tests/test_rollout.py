"""Rollouts over a real MiniHack EnvPool: lockstep episodes, search-and-ask turns, honest old log-probs."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from envs.pool import EnvPool
from trainers.config import ModelSection, RolloutSection
from trainers.rollout import EpisodeSpec, Roller, episode_metrics, trajectory_record


@pytest.fixture(scope="module")
def pool():
    p = EnvPool(["minihack/Room-5x5"] * 4, num_workers=2)
    yield p
    p.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trainers.models import HFBackend, build_tiny_qwen2, build_tokenizer, save_model_folder
    from trainers import prompts as P

    d = tmp_path_factory.mktemp("tiny")
    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, "north east south west southeast"] * 30, vocab_size=400)
    save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1), tok, d)
    return HFBackend(d, device="cpu")


@dataclass
class _Out:
    token_ids: list
    text: str
    logprobs: list
    finish_reason: str = "stop"


class ScriptedActor:
    """Replies from a script (first a search-and-ask call, then moves), on the real tokenizer."""

    def __init__(self, backend, replies):
        self.b, self.replies, self.calls = backend, replies, 0

    def apply_chat_template(self, *a, **k):
        return self.b.apply_chat_template(*a, **k)

    def generate(self, prompts, **kw):
        text = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        ids = self.b.encode(text)
        return [_Out(ids, text, [-0.1] * len(ids)) for _ in prompts]


def test_lockstep_rollout_with_real_model_has_consistent_logprobs(pool, tiny):
    r = Roller(tiny, pool, None, rollout_cfg=RolloutSection(), actor_cfg=ModelSection(max_new_tokens=4), max_turns=3, seed=1)
    stats: dict[str, float] = {}
    eps = r.collect([EpisodeSpec("minihack/Room-5x5", s, False, 0) for s in range(4)], step=1, metrics=stats)
    assert len(eps) == 4 and all(e.traj.num_actions == 3 or e.success for e in eps)
    assert stats["rollout/tokens_per_s"] > 0
    # an untrained model rarely ends a reply within 4 tokens: the share of cut replies says so
    cut = sum(len(t.response_ids) == 4 for e in eps for t in e.turns) / sum(len(e.turns) for e in eps)
    assert stats["rollout/cut_replies"] == pytest.approx(cut) and cut > 0
    t = eps[0].turns[0]
    with torch.no_grad():
        lp = tiny.logprobs([t.prompt_ids + t.response_ids])[0, len(t.prompt_ids):]
    assert torch.allclose(lp, torch.tensor(t.logprobs), atol=1e-4)  # old log-probs are the model's own
    m = episode_metrics(eps)
    assert "policy/success_without_exp" in m and "policy/success_with_exp" not in m
    rec = trajectory_record(eps[0], run_id=None, step=1)
    assert rec["num_actions"] == len([s for s in rec["steps"] if s["kind"] != "tool"])


def test_search_and_ask_turn_is_recorded_and_capped(pool, tiny):
    calls = []

    def tool(task, query, env, step):
        calls.append(query)
        return "the stairs are south-east of you", [42], None

    actor = ScriptedActor(tiny, ["<search_and_ask>where are the stairs?</search_and_ask>",
                                 "<search_and_ask>again?</search_and_ask>", "southeast"])
    rc = RolloutSection(search_and_ask=1)
    r = Roller(actor, pool, None, rollout_cfg=rc, actor_cfg=ModelSection(), max_turns=8, tool_fn=tool)
    stats: dict[str, float] = {}
    ep = r.collect([EpisodeSpec("minihack/Room-5x5", 5, False, 0)], step=0, metrics=stats)[0]
    kinds = [s.kind for s in ep.traj.steps]
    assert kinds[0] == "tool" and ep.traj.steps[0].tool_answer == "the stairs are south-east of you"
    assert calls == ["where are the stairs?"]  # the second call was over the budget of 1
    assert kinds[1] == "invalid"  # ... so the env judged it as an (invalid) action
    assert ep.tool_entry_ids == [42] and ep.turns[0].kind == "tool"
    # the collect's metrics carry the mean latency of its search-and-ask calls (here one, as the step recorded it)
    assert stats["search_and_ask/latency_ms"] == ep.traj.steps[0].info["latency_ms"] > 0
    # the answer is in the next prompt, as an observation (prompt side: never trained on)
    nxt = tiny.tokenizer.decode(ep.turns[1].prompt_ids)
    assert "the stairs are south-east of you" in nxt
    assert ep.traj.num_actions == len(ep.traj.steps) - 1


def test_retrieved_experience_reaches_the_prompt(pool, tiny, store, embedder):
    from core.config import IndexConfig, ManagerConfig
    from core.manager import ExperienceManager, OpContext
    from core.types import Operation

    mgr = ExperienceManager(store, embedder, ManagerConfig(random_demote=False), IndexConfig(use_gpu="never"))
    try:
        task = "Reach the staircase down (>) in a lit 5x5 room."
        eid = mgr.apply_operations([Operation("add", text="## Title: diag\n## Content: go southeast")],
                                   OpContext(env="minihack/Room-5x5", task=task))[0].new_id
        r = Roller(tiny, pool, mgr, rollout_cfg=RolloutSection(), actor_cfg=ModelSection(max_new_tokens=3), max_turns=1)
        eps = r.collect([EpisodeSpec("minihack/Room-5x5", 1, True, 0), EpisodeSpec("minihack/Room-5x5", 1, False, 0)], step=0)
        assert eps[0].traj.experience_ids == [eid] and "go southeast" in tiny.tokenizer.decode(eps[0].turns[0].prompt_ids)
        assert eps[1].traj.experience_ids == [] and "go southeast" not in tiny.tokenizer.decode(eps[1].turns[0].prompt_ids)
        eps = r.collect([EpisodeSpec("minihack/Room-5x5", 1, True, 0)], step=1, retrieval=False)  # warm-up: off
        assert eps[0].traj.experience_ids == []
    finally:
        mgr.close()


def test_episode_player_plays_turn_by_turn(tmp_path, tiny, store, db_url):
    from trainers.player import EpisodePlayer

    store.add_entry("## Title: stairs\n## Content: go southeast", env="minihack/Room-5x5",
                    task="Reach the staircase down (>) in a lit 5x5 room.", actor="human")
    p = EpisodePlayer("minihack/Room-5x5", 2, db_url=db_url, checkpoint=str(tiny.path))
    try:
        first = p.reset()
        assert first["turn"] == 0 and "Map:" in first["observation"] and "go southeast" in first["experience"]
        # the embedded policy's prompt (trainers/config.py PROMPT_DEFAULTS): no search-and-ask offer, no history
        prompt = tiny.tokenizer.decode(p.roller.prompt_ids(p.batch.lives[0]))
        assert "search_and_ask" not in prompt and p.roller.rc.history_turns == 0
        turns = [p.step() for _ in range(3)]
        assert [t["turn"] for t in turns] == [1, 2, 3]
        assert all(set(t) >= {"observation", "action", "reward", "done", "success", "tool_query", "tool_answer"} for t in turns)
    finally:
        p.close()


class CriticActor(ScriptedActor):
    """Judges entries with `verdict` (the critic prompt is recognisable by its question), then moves."""

    def __init__(self, backend, verdict):
        super().__init__(backend, ["southeast"])
        self.verdict, self.judged = verdict, 0

    def generate(self, prompts, **kw):
        texts = [self.b.tokenizer.decode(p) for p in prompts]
        if all("Will this entry help you" in t for t in texts):
            self.judged += len(prompts)
            ids = self.b.encode(self.verdict)
            return [_Out(ids, self.verdict, [-0.1] * len(ids)) for _ in prompts]
        return super().generate(prompts, **kw)


@pytest.mark.parametrize("verdict,score,shown", [("reject", 0.0, False), ("accept", 1.0, True), ("refine it", 0.5, True),
                                                 ("no idea", 1.0, True)])
def test_actor_as_critic_judges_entries_and_hides_rejected_ones(pool, tiny, store, embedder, verdict, score, shown):
    from core.config import IndexConfig, ManagerConfig
    from core.manager import ExperienceManager, OpContext
    from core.types import Operation

    mgr = ExperienceManager(store, embedder, ManagerConfig(random_demote=False), IndexConfig(use_gpu="never"))
    try:
        task = "Reach the staircase down (>) in a lit 5x5 room."
        eid = mgr.apply_operations([Operation("add", text=f"## Title: t\n## Content: go southeast {verdict}")],
                                   OpContext(env="minihack/Room-5x5", task=task))[0].new_id
        actor = CriticActor(tiny, verdict)
        r = Roller(actor, pool, mgr, rollout_cfg=RolloutSection(actor_critic=True), actor_cfg=ModelSection(), max_turns=1)
        stats: dict[str, float] = {}
        ep = r.collect([EpisodeSpec("minihack/Room-5x5", 1, True, 0)], step=0, metrics=stats)[0]
        assert actor.judged == 1 and ep.critic_scores == {eid: score}
        assert (ep.traj.experience_ids == [eid]) is shown
        assert ("go southeast" in tiny.tokenizer.decode(ep.turns[0].prompt_ids)) is shown
        assert stats["critic/judged"] == 1 and stats["critic/unparsed"] == (1 if verdict == "no idea" else 0)
    finally:
        mgr.close()


def test_critic_is_off_by_default(pool, tiny, store, embedder):
    assert RolloutSection().actor_critic is False


class TempRecorder(ScriptedActor):
    """Records the temperature of every generate call."""

    def __init__(self, backend, replies):
        super().__init__(backend, replies)
        self.temperatures = []

    def generate(self, prompts, **kw):
        self.temperatures.append(kw.get("temperature"))
        return super().generate(prompts, **kw)


def test_evaluation_greedy_then_sampled_on_held_out_seeds(pool, tiny):
    """evaluate_policy: greedy conditions at temperature 0, `_sampled` ones at the rollout temperature,
    each on the same held-out seeds; the metrics carry both."""
    from trainers.cotrain import SlotRouter
    from trainers.evaluate import evaluate_policy

    actor = TempRecorder(tiny, ["north"])
    r = Roller(actor, pool, None, rollout_cfg=RolloutSection(), actor_cfg=ModelSection(max_new_tokens=4, temperature=0.7),
               max_turns=2, seed=1)
    res = evaluate_policy(r, SlotRouter(["minihack/Room-5x5"] * 4), ["minihack/Room-5x5"], n=3, seed_offset=500,
                          with_experience=(False,), sampled=True)
    assert list(res.conditions) == ["without_exp", "without_exp_sampled"]
    assert set(actor.temperatures[:2]) == {0.0} and set(actor.temperatures[2:]) == {0.7}  # 2 turns greedy, then 2 sampled
    assert sorted(e.spec.seed for e in res.episodes) == [500, 500, 501, 501, 502, 502]
    m = res.metrics()
    assert m["eval/success_without_exp"] == m["eval/success_without_exp_sampled"] == 0.0  # "north" never reaches the stairs
    assert m["eval/actions_without_exp_sampled"] == 2.0
    assert r.ac.temperature == 0.7  # the roller itself is left as it was


def test_fit_history_keeps_the_first_pair_when_asked():
    from trainers import prompts as P

    hist = [("intro: you see a cabinet 1", "go to cabinet 1"), ("o1", "a1"), ("o2", "a2"), ("o3", "a3")]
    assert P.fit_history(hist, max_turns=2, max_chars=1000) == hist[-2:]
    assert P.fit_history(hist, max_turns=2, max_chars=1000, keep_first=True) == [hist[0], *hist[-2:]]
    assert P.fit_history(hist[:2], max_turns=2, max_chars=1000, keep_first=True) == hist[:2]  # never twice
    # the first pair counts against the character budget; the recent ones are cut first
    budget = len(hist[0][0]) + len(hist[0][1]) + 4
    assert P.fit_history(hist, max_turns=2, max_chars=budget, keep_first=True) == [hist[0], hist[-1]]
    # a first pair over the whole budget is dropped like any other
    assert P.fit_history(hist, max_turns=2, max_chars=5, keep_first=True) == [hist[-1]]
    assert P.fit_history(hist, max_turns=0, max_chars=1000, keep_first=True) == []


def test_alfworld_intro_stays_in_the_prompt(tiny):
    """ALFWorld names the room's receptacles only in its first observation: every later prompt keeps it."""
    pytest.importorskip("alfworld")
    p = EnvPool(["alfworld/pick_and_place"], num_workers=1)
    try:
        actor = ScriptedActor(tiny, ["look"])
        r = Roller(actor, p, None, rollout_cfg=RolloutSection(history_turns=1), actor_cfg=ModelSection(), max_turns=4)
        ep = r.collect([EpisodeSpec("alfworld/pick_and_place", 3, False, 0)], step=0)[0]
        prompts = [tiny.tokenizer.decode(t.prompt_ids) for t in ep.turns]
        assert len(prompts) == 4
        assert all("Looking quickly around you" in q for q in prompts)
        assert all(q.count("Earlier observation:") == min(i, 2) for i, q in enumerate(prompts))  # intro + 1 recent
    finally:
        p.close()


def test_a_task_played_again_in_a_later_chunk_is_sampled_afresh(pool, tiny):
    """`play` hands specs to the pool a chunk of slots at a time; each chunk after the first samples from its own
    stream. Without that, an A/B test's second episode of a task (the next chunk, same step) replayed the first
    token for token, and its paired test counted one episode as many."""
    from trainers.slots import SlotRouter, play

    seen = []

    class Recorder:
        def apply_chat_template(self, *a, **k):
            return tiny.apply_chat_template(*a, **k)

        def generate(self, prompts, **kw):
            seen.append(kw["seed"])
            return tiny.generate(prompts, **kw)

    r = Roller(Recorder(), pool, None, rollout_cfg=RolloutSection(), actor_cfg=ModelSection(max_new_tokens=6, temperature=1.0),
               max_turns=1, seed=3)
    specs = [EpisodeSpec("minihack/Room-5x5", 7, False, -1 - i) for i in range(8)]  # one task, 8 times: two chunks of 4
    eps = play(r, SlotRouter(["minihack/Room-5x5"] * 4), specs, step=0)
    first, again = [e.turns[0].response_ids for e in eps[:4]], [e.turns[0].response_ids for e in eps[4:]]
    assert len(set(seen)) == 2 and r.seed == 3  # one stream per chunk; the roller itself untouched
    assert first != again  # the same four prompts, sampled afresh
    eps2 = play(r, SlotRouter(["minihack/Room-5x5"] * 4), specs, step=0)
    assert [e.turns[0].response_ids for e in eps2] == first + again  # and reproducible

"""Recurring task sets (env.task_set), same-task retrieval, and the entry checker: the ground on which an
experience entry carries information the actor cannot see (issue: experience that carries information)."""
from __future__ import annotations

import random

import pytest

from core.config import IndexConfig, ManagerConfig
from core.manager import ExperienceManager, OpContext
from core.types import Operation, format_entry_text
from envs.base import instance_task, task_id_of, task_seed

ENV = "minihack/Room-Ultimate-5x5"


def _cfg(**env):
    from trainers.config import load_run_config

    return load_run_config({"env": {"names": {ENV: 1.0}, **env}, "rollout": {"tasks_per_step": 3, "group_size": 4}})


def test_task_set_draws_only_its_tasks_each_one_fixed_instance_and_never_the_unseen_ones():
    from envs.pool import TaskMixture
    from trainers.cotrain import make_specs
    from trainers.evaluate import task_sets

    cfg = _cfg(task_set=5)
    mixture, rng = TaskMixture(cfg.env.names, seed=0), random.Random(0)
    drawn: dict[int, set[int]] = {}
    for step in range(1, 41):
        specs = make_specs(cfg, mixture, rng, step)
        ids = [s.task_id for s in specs[::4]]
        assert len(set(ids)) == 3  # distinct tasks within a step (the set has 5)
        for s in specs:
            drawn.setdefault(s.task_id, set()).add(s.seed)
            assert s.seed == task_seed(ENV, s.task_id)
    assert set(drawn) == {0, 1, 2, 3, 4}  # every task recurs ...
    assert all(len(seeds) == 1 for seeds in drawn.values())  # ... as the same instance
    (_, seen), (unseen_tag, unseen) = task_sets(5, 8)
    assert seen == [0, 1, 2, 3, 4] and unseen_tag == "unseen_" and not set(unseen) & set(drawn)
    assert task_sets(0, 8) == [("", None)]  # random-seed mode is unchanged
    off = make_specs(_cfg(), TaskMixture({ENV: 1.0}, seed=0), random.Random(0), 1)
    assert all(s.task_id is None for s in off) and off[0].seed == random.Random(0).randrange(100_000)


def test_task_text_names_the_instance_and_the_instance_is_one_level():
    from envs.registry import make_env

    t = instance_task(ENV, 17, "Reach the staircase down (>).")
    assert t == "Dungeon 17: Reach the staircase down (>)." and task_id_of(t) == 17
    assert task_id_of("Reach the staircase down (>).") is None
    assert instance_task("alfworld/pick_and_place", 3, "put a mug in a cabinet.").startswith("Household 3: ")
    assert task_seed(ENV, 17) == task_seed(ENV, 17) != task_seed(ENV, 18) != task_seed("minihack/Room-5x5", 18)
    env = make_env(ENV)
    try:
        a, _ = env.reset(seed=task_seed(ENV, 17))
        b, _ = env.reset(seed=task_seed(ENV, 17))
        assert a == b
    finally:
        env.close()


def test_debrief_states_the_offset_the_checker_reads():
    from envs.experts import expert_action
    from envs.minihack import claimed_offset, first_heading, make_minihack

    assert [first_heading(*o) for o in [(3, 1), (2, 2), (-1, -3), (0, 0)]] == ["south", "southeast", "west", ""]
    # Longer axis when the other is at most 1, else the diagonal: walking that one word brings every offset of a
    # 5x5 room next to the walker (in view in the dark), e.g. (3, -4) by southwest, not west (it would end 3 away).
    assert [first_heading(*o) for o in [(3, -4), (4, 2), (-2, 3), (1, 4)]] == ["southwest", "southeast", "northeast", "east"]
    for dr in range(-4, 5):
        for dc in range(-4, 5):
            if (dr, dc) == (0, 0):
                continue
            step = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1), "northeast": (-1, 1),
                    "northwest": (-1, -1), "southeast": (1, 1), "southwest": (1, -1)}[first_heading(dr, dc)]
            assert any(max(abs(dr - k * step[0]), abs(dc - k * step[1])) <= 1 for k in range(5)), (dr, dc)
    env = make_minihack("Room-Ultimate-5x5", max_turns=60)
    try:
        for seed in range(6):
            env.reset(seed=seed)
            while True:
                obs, _, term, trunc, info = env.step(expert_action(env))
                if term or trunc:
                    break
            assert "Debrief:" in obs.splitlines()[-1]
            offset = claimed_offset(obs)
            if env.stairs_pos is None:
                assert offset is None and "never saw" in obs
            else:
                assert offset == (env.stairs_pos[0] - env.start_pos[0], env.stairs_pos[1] - env.start_pos[1])
    finally:
        env.close()


def test_entry_checker_on_hand_made_entries():
    from envs.entry_check import EntryChecker, correct_share
    from envs.minihack import _relative

    checker = EntryChecker()
    try:
        task = instance_task(ENV, 3, "Reach the staircase.")
        dr, dc = checker.facts(ENV, 3)["offset"]
        right = format_entry_text("Where the staircase is", "Dungeon 3",
                                  f"The staircase down (>) is {_relative(dr, dc)} of the square where you start.")
        wrong = format_entry_text("Where the staircase is", "Dungeon 3",
                                  f"The staircase down (>) is {_relative(dr + 9, dc)} of the square where you start.")
        vague = format_entry_text("Monsters", "Dungeon 3", "Attack the lichen by moving into it.")
        assert checker.verdict(ENV, task, right) == "right"
        assert checker.verdict(ENV, task, wrong) == "wrong"
        assert checker.verdict(ENV, task, vague) == "no_claim"
        assert checker.verdict(ENV, "Reach the staircase.", right) == "unknown"  # no instance id: not checkable
        assert checker.verdict("webshop", task, right) == "unknown"  # no checker for that env
        assert correct_share(["right", "wrong", "no_claim", "unknown"]) == pytest.approx(1 / 3)
        assert correct_share(["unknown"]) is None
    finally:
        checker.close()


def _library(store, embedder, *, scope: bool) -> ExperienceManager:
    m = ExperienceManager(store, embedder, ManagerConfig(random_demote=False, task_scope=scope),
                          IndexConfig(use_gpu="never"))
    return m


def test_same_task_retrieval_rate_on_a_small_library(store, embedder):
    """Task texts that differ only in an id are near neighbours in MiniLM space. A step's K/2 rollouts of
    one dungeon retrieve together; Eq. 6 counts each pick against the next (a recent pick loses 1), so
    with whole-env retrieval a later rollout of a dungeon gets another dungeon's entry while unused ones
    remain. task_scope keeps every one on its own dungeon's entries (Eq. 6 still ranks within them) and
    falls back to the env's."""
    goal = "Reach the staircase down (>) in a dark 5x5 room; you only see the squares next to you."
    tasks = [instance_task(ENV, i, goal) for i in range(12)]
    m = _library(store, embedder, scope=True)
    queries = [t for t in tasks[:10] for _ in range(4)]  # 4 with-experience rollouts per dungeon, as a step asks

    def rate(mgr) -> float:
        hits = mgr.search_sync(queries, task=[ENV] * len(queries), scope=queries)
        return sum(h[0].task == t for h, t in zip(hits, queries)) / len(queries)

    try:
        for i, t in enumerate(tasks[:10]):  # dungeons 10 and 11 have no entry yet
            text = format_entry_text("Where the staircase is", f"Dungeon {i}", f"A lesson about dungeon {i}.")
            assert m.apply_operations([Operation("add", text=text)], OpContext(env=ENV, task=t))[0].ok
    finally:
        m.close()
    plain = _library(store, embedder, scope=False)  # first, on a library nothing has been retrieved from yet
    try:
        unscoped = rate(plain)
    finally:
        plain.close()
    m = _library(store, embedder, scope=True)
    try:
        scoped = rate(m)
        hit = m.search_sync([tasks[10]], task=ENV, scope=[tasks[10]])[0]  # no entry of its own: falls back to the env
        assert len(hit) == 1 and hit[0].env == ENV and hit[0].task != tasks[10]
        assert m.search_sync([tasks[10]], task="minihack/Room-5x5", scope=[tasks[10]]) == [[]]  # never another env
    finally:
        m.close()
    assert scoped == 1.0
    assert unscoped < 1.0  # 0.9 here: the second rollout of a dungeon got another dungeon's entry (Eq. 6's recency)


@pytest.mark.slow
def test_recurring_run_logs_same_task_rate_correctness_and_unseen_evaluation(tmp_path):
    """A 2-step `comprl train` on a task set of 3 with a library seeded by hand (one right entry per dungeon
    and one wrong): the new metrics reach the store."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from core.store import ExperienceStore, NewEntry
    from core.types import Source
    from envs.entry_check import EntryChecker
    from envs.minihack import TASKS, _relative
    from trainers import prompts as P
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder

    env, models = "minihack/Room-5x5", tmp_path / "models"
    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, P.EXTRACTOR_USER, "north east south west"] * 30, vocab_size=400)
    for name in ("policy", "extractor"):
        save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=1), tok, models / name)
    data = tmp_path / "data"
    data.mkdir()
    store = ExperienceStore(f"sqlite:///{data / 'workbench.db'}")
    checker = EntryChecker()
    entries = []
    for i in range(3):
        dr, dc = checker.facts(env, i)["offset"]
        task = instance_task(env, i, TASKS["Room-5x5"].goal)
        says = (dr + 7, dc) if i == 2 else (dr, dc)  # dungeon 2's entry is wrong
        entries.append(NewEntry(text=format_entry_text("Where the staircase is", f"Dungeon {i}",
                                                       f"The staircase down (>) is {_relative(*says)} of the square where you start."),
                                env=env, task=task, query=task, source=Source.MANUAL))
    checker.close()
    store.add_entries(entries, actor="test")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
run: {{name: recurring, variant: complementary, max_steps: 2, eval_episodes: 2, checkpoint_every: 1, threads: 1, deterministic: true}}
env: {{names: {{{env}: 1.0}}, max_turns: 3, task_set: 3}}
actor: {{path: {models / 'policy'}, max_new_tokens: 4}}
rollout: {{tasks_per_step: 2, group_size: 4, with_experience: 2}}
extractor: {{model: {{path: {models / 'extractor'}, max_new_tokens: 24}}, buffer_size: 4, merge_every: 0}}
library: {{manager: {{task_scope: true}}}}
""")
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "app.cli", "train", str(cfg), "--data-dir", str(data)], cwd=root,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    run = store.list_runs()[0]
    m = store.latest_metrics(run["id"])
    assert m["retrieval/same_task_rate"] == 1.0  # every dungeon has its own entry, and task_scope finds it
    assert m["library/entry_correct_share"] == pytest.approx(2 / 3)  # the random extractor wrote nothing that parses
    for key in ("eval/success_with_exp", "eval/success_without_exp", "eval/success_unseen_with_exp",
                "eval/success_unseen_without_exp", "eval/actions_unseen_with_exp"):
        assert key in m, key
    tasks = {t["task"] for t in store.list_trajectories(run_id=run["id"])}
    assert {task_id_of(t) for t in tasks} <= {0, 1, 2, 3, 4}  # training and seen evaluation 0-2; unseen 3-4
    store.close()


def test_ab_config_takes_recurring_task_ids():
    from trainers.evaluate import validate_ab_config

    c = {"env": ENV, "seeds": [0, 1], "arms": {"A": {"kind": "current"}, "B": {"kind": "none"}}, "task_ids": True}
    assert validate_ab_config(c) == ""
    assert "task_ids" in validate_ab_config({**c, "task_ids": "yes"})


def test_library_table_shows_whether_each_entry_is_right(tmp_path, embedder, db_url):
    from app.service import Workbench
    from core.store import NewEntry
    from envs.entry_check import EntryChecker
    from envs.minihack import stairs_sentence

    env = "minihack/Room-5x5"
    task = instance_task(env, 0, "Reach the staircase.")
    checker = EntryChecker()
    dr, dc = checker.facts(env, 0)["offset"]
    checker.close()
    wb = Workbench(tmp_path / "data", db_url, embedder=embedder)
    try:
        wb.store.add_entries([NewEntry(text=f"## Title: t\n## Description: d\n## Content: {stairs_sentence(dr, dc)}.", env=env, task=task),
                              NewEntry(text=f"## Title: t\n## Description: d\n## Content: {stairs_sentence(dr, dc + 3)}.", env=env, task=task),
                              NewEntry(text="## Title: t\n## Description: d\n## Content: kill the lichen.", env=env, task=task),
                              NewEntry(text="## Title: t\n## Description: d\n## Content: go down.", env=env, task="Reach the staircase.")],
                             actor="test")
        df, _ = wb.library_page()
        assert list(df["claim"]) == ["right", "WRONG", "no claim", "–"]
    finally:
        wb.close()


def test_an_update_of_another_tasks_entry_adds_instead(store, embedder):
    """task_scope: a dungeon with no entry of its own is shown another dungeon's (the fallback). An extractor that
    answers `update` on it replaces nothing: an episode checks only its own task's entries, so the other dungeon's
    entry stays and the lesson is added for this one. An update of the episode's own task's entry replaces it."""
    goal = "Reach the staircase down (>) in a dark 5x5 room; you only see the squares next to you."
    a, b = instance_task(ENV, 1, goal), instance_task(ENV, 2, goal)
    m = _library(store, embedder, scope=True)
    try:
        (ra,) = m.apply_operations([Operation("add", text="## Title: t\n## Description: d\n## Content: about 1.")],
                                   OpContext(env=ENV, task=a))
        (rb,) = m.apply_operations([Operation("update", text="## Title: t\n## Description: d\n## Content: about 2.",
                                              ids=[ra.new_id])], OpContext(env=ENV, task=b))
        assert rb.ok and rb.archived == [] and rb.new_id != ra.new_id
        active = {e.id: e.task for e in store.list_entries(limit=100).entries}
        assert active[ra.new_id] == a and active[rb.new_id] == b
        (rc,) = m.apply_operations([Operation("update", text="## Title: t\n## Description: d\n## Content: 2 again.",
                                              ids=[rb.new_id])], OpContext(env=ENV, task=b))
        assert rc.ok and rc.archived == [rb.new_id]
    finally:
        m.close()
    plain = _library(store, embedder, scope=False)  # without task_scope an update replaces whatever it names
    try:
        (rd,) = plain.apply_operations([Operation("update", text="## Title: t\n## Description: d\n## Content: x.",
                                                  ids=[ra.new_id])], OpContext(env=ENV, task=b))
        assert rd.ok and rd.archived == [ra.new_id]
    finally:
        plain.close()


def test_a_similarity_floor_shows_an_unseen_dungeon_no_entry(store, embedder):
    """manager.min_similarity: a recurring task's own entries are keyed by its own text (cosine 1.0); another
    dungeon's text, the same words with another id, sits below 0.98 in MiniLM space. With the floor at 0.99 a dungeon
    that has no entry of its own gets none (no other dungeon's lesson); its own entry is still found; without the floor
    it gets another dungeon's."""
    goal = "Reach the staircase down (>) in a dark 5x5 room; you only see the squares next to you."
    tasks = [instance_task(ENV, i, goal) for i in range(6)]

    def manager(floor: float) -> ExperienceManager:
        return ExperienceManager(store, embedder, ManagerConfig(random_demote=False, task_scope=True, min_similarity=floor),
                                 IndexConfig(use_gpu="never"))

    m = manager(0.0)
    try:
        for i, t in enumerate(tasks[:4]):  # dungeons 4 and 5 have no entry
            assert m.apply_operations([Operation("add", text=format_entry_text("Stairs", f"Dungeon {i}", f"Lesson {i}."))],
                                      OpContext(env=ENV, task=t))[0].ok
        unseen = m.search_sync([tasks[4]], task=ENV, scope=[tasks[4]])[0]
        assert unseen and unseen[0].task != tasks[4] and unseen[0].score < 0.99
    finally:
        m.close()
    m = manager(0.99)
    try:
        assert m.search_sync([tasks[4], tasks[5]], task=ENV, scope=[tasks[4], tasks[5]]) == [[], []]
        own = m.search_sync([tasks[2]], task=ENV, scope=[tasks[2]])[0]
        assert [h.task for h in own] == [tasks[2]] and own[0].score > 0.99
    finally:
        m.close()
    from core.config import ConfigError

    with pytest.raises(ConfigError, match="min_similarity"):
        ManagerConfig(min_similarity=1.5)


def test_credit_metrics_tell_how_far_the_reward_separates_right_lessons_from_wrong_ones(tmp_path):
    """EntryAudit.credit_metrics: this step's entry rewards, split by whether the entry's claim is right."""
    from core.store import ExperienceStore, NewEntry
    from core.types import Source
    from envs.entry_check import EntryChecker
    from envs.minihack import TASKS, _relative
    from trainers.cotrain import EntryAudit

    env = "minihack/Room-5x5"
    store = ExperienceStore(f"sqlite:///{tmp_path / 'w.db'}")
    checker = EntryChecker()
    new = []
    for i in range(3):
        dr, dc = checker.facts(env, i)["offset"]
        says = (dr + 7, dc) if i == 2 else (dr, dc)  # dungeon 2's entry is wrong
        task = instance_task(env, i, TASKS["Room-5x5"].goal)
        new.append(NewEntry(text=format_entry_text("Where the staircase is", f"Dungeon {i}",
                                                   f"The staircase down (>) is {_relative(*says)} of the square where you start."),
                            env=env, task=task, query=task, source=Source.MANUAL))
    checker.close()
    ids = store.add_entries(new, actor="test")
    from trainers.config import load_run_config

    cfg = load_run_config({"env": {"names": {env: 1.0}, "task_set": 3}})
    audit = EntryAudit(cfg, store, None)
    try:
        m = audit.credit_metrics({ids[0]: (1.0, 0.5), ids[1]: (0.0, 1.0), ids[2]: (-1.0, -0.5)})
        assert audit.credit_metrics({}) == {}
    finally:
        audit.close()
    assert m["extractor/rewarded_right_share"] == pytest.approx(2 / 3)
    assert m["extractor/reward_right"] == pytest.approx(0.5)
    assert m["extractor/reward_wrong"] == pytest.approx(-1.0)
    assert m["extractor/reward_gap"] == pytest.approx(1.5)
    assert m["extractor/relative_reward_gap"] == pytest.approx(0.75 + 0.5)

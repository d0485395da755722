"""Recurring ALFWorld households (env.task_set on an alfworld/ env): the same machinery as MiniHack's dungeons
(tests/test_recurring.py): task id k is one fixed household whose identity is in the task text ("Household 17: put a
watch in safe."), seen ids are trained on and unseen ones evaluated apart, and the entry checker scores an entry's
"the watch is in drawer 3" against the household's initial placements (envs/alfworld/claims.py)."""
from __future__ import annotations

import random

import pytest

pytest.importorskip("textworld")
pytest.importorskip("alfworld")

from core.types import format_entry_text  # noqa: E402
from envs.base import instance_task, task_id_of, task_seed  # noqa: E402

ENV = "alfworld/pick_and_place"
ALL = "alfworld/all"


def _entry(content: str, household: int) -> str:
    return format_entry_text("Where the object is", f"Household {household}", content)


def test_same_id_same_household_and_its_identity_in_the_task_text(tmp_path):
    """Id k fixes the household: the checker's view (the generated instance) is the same in a fresh checker, and the
    engine's first state of reset(task_seed(env, k)) holds exactly those placements, twice over; the task text the
    query is built from names the household."""
    from envs.entry_check import EntryChecker
    from envs.registry import make_env

    a, b = EntryChecker(), EntryChecker()
    try:
        facts = [a.facts(ENV, k) for k in range(6)]
        assert facts == [b.facts(ENV, k) for k in range(6)]
        assert len({(f["task"], tuple(sorted(f["placements"].items()))) for f in facts}) == 6  # six households
    finally:
        a.close()
        b.close()
    env = make_env(ENV, cache_dir=tmp_path, max_turns=10)
    try:
        for k in (0, 3):
            obs, _ = env.reset(seed=task_seed(ENV, k))
            assert env.world.where == facts[k]["placements"]  # the game starts as the checker reads it
            assert env.task == facts[k]["task"] + "."
            task = instance_task(ENV, k, env.task)
            assert task == f"Household {k}: {facts[k]['task']}." and task_id_of(task) == k
            again, _ = env.reset(seed=task_seed(ENV, k))
            assert again == obs and instance_task(ENV, k, env.task) == task
    finally:
        env.close()


def test_task_set_draws_seen_households_and_evaluation_keeps_the_unseen_apart():
    from envs.pool import TaskMixture
    from trainers.config import load_run_config
    from trainers.cotrain import EntryAudit, make_specs
    from trainers.evaluate import task_sets

    cfg = load_run_config({"env": {"names": {ENV: 1.0}, "task_set": 6, "max_turns": 20},
                           "rollout": {"tasks_per_step": 3, "group_size": 4}})
    mixture, rng = TaskMixture(cfg.env.names, seed=0), random.Random(0)
    drawn: dict[int, set[int]] = {}
    for step in range(1, 31):
        for s in make_specs(cfg, mixture, rng, step):
            assert s.env == ENV and s.seed == task_seed(ENV, s.task_id)
            drawn.setdefault(s.task_id, set()).add(s.seed)
    assert set(drawn) == set(range(6)) and all(len(v) == 1 for v in drawn.values())
    (_, seen), (tag, unseen) = task_sets(6, 8)
    assert seen == list(range(6)) and tag == "unseen_" and unseen == list(range(6, 14))
    assert not set(unseen) & set(drawn)
    assert EntryAudit.applies(cfg)  # library/entry_correct_share is logged on this config


def test_claimed_location_reads_the_entry_format_and_common_phrasings():
    from envs.alfworld import claimed_location, claimed_locations

    full = _entry("In household 17 the watch is in drawer 3.", 17)
    assert claimed_location(full, "watch") == "drawer 3" and claimed_location(full) == "drawer 3"
    for text, where in [
        ("The watch is in drawer 3.", "drawer 3"),
        ("Watch 2 was on top of dresser 1; take it.", "dresser 1"),
        ("the watches are usually in the drawer 3", "drawer 3"),
        ("You will find the watch on sidetable 2.", "sidetable 2"),
        ("I found a watch 1 in safe 1 after opening it.", "safe 1"),
        ("take watch 1 from drawer 3, then go to safe 1", "drawer 3"),
        ("Drawer 3 contains the watch.", "drawer 3"),
        ("Look in drawer 3 for the watch.", "drawer 3"),
        ("go to drawer 3, open it, take watch 1", "drawer 3"),
        ("## Title: Watch\n## Description: Household 4\n## Content: The watch can be found in Drawer 3.", "drawer 3"),
    ]:
        assert claimed_location(text, "watch") == where, text
    for text in ["Watches are usually in a drawer (60%); look there first.",  # the prior: no claim about a household
                 "The watch is not in drawer 3.", "Household 17: put a watch in safe.", "Open every drawer.",
                 "The pen is in drawer 3."]:  # another object
        assert claimed_location(text, "watch") is None, text
    assert claimed_locations("The pen is in drawer 3 and the watch is on desk 1.", ["watch", "pen"]) == [
        ("pen", "drawer 3"), ("watch", "desk 1")]
    assert claimed_location("The tomatoes are in fridge 1.", "tomato") == "fridge 1"  # the priors' plural


def test_entry_checker_scores_entries_built_from_a_households_placements():
    """For households of every task type (alfworld/all draws the type from the seed): an entry naming a receptacle
    the task's object starts in is right, one naming a receptacle of the household that holds none is wrong, the
    placement prior and a vague tip claim nothing, and without a household id nothing is checkable."""
    from envs.alfworld import prior_hint
    from envs.entry_check import EntryChecker, correct_share

    checker = EntryChecker()
    try:
        kinds = set()
        for k in range(12):
            f = checker.facts(ALL, k)
            kinds.add(f["task_type"])
            task = instance_task(ALL, k, f["task"] + ".")
            obj = f["object"]
            there = f["targets"][obj]
            elsewhere = [r for r in f["receptacles"] if r not in there]
            assert there and elsewhere
            right = _entry(f"In household {k} the {obj} is in {there[0]}.", k)
            wrong = _entry(f"The {obj} is in {elsewhere[0]}.", k)
            assert checker.verdict(ALL, task, right) == "right", (k, f)
            assert checker.verdict(ALL, task, wrong) == "wrong", (k, f)
            assert checker.verdict(ALL, task, _entry(f"take {obj} 1 from {there[-1]}", k)) == "right"
            assert checker.verdict(ALL, task, _entry(f"{right} Then the {obj} was on {elsewhere[0]}.", k)) == "wrong"
            assert checker.verdict(ALL, task, _entry(prior_hint(obj), k)) == "no_claim"  # the prior: type-level
            assert checker.verdict(ALL, task, _entry("Open receptacles before looking inside.", k)) == "no_claim"
            assert checker.verdict(ALL, f["task"], right) == "unknown"  # no household id
            if f["light"]:  # look_at_obj_in_light: where the lamp stands is a claim too
                lamp = f["targets"][f["light"]][0]
                assert checker.verdict(ALL, task, _entry(f"The {f['light']} is on {lamp}.", k)) == "right"
        assert len(kinds) >= 4
        assert correct_share(["right", "wrong", "no_claim"]) == pytest.approx(1 / 3)
    finally:
        checker.close()


def test_entry_audit_logs_the_correct_share_on_an_alfworld_library(tmp_path):
    """library/entry_correct_share on recurring households: two right entries and one wrong, unchanged EntryAudit."""
    from core.store import ExperienceStore, NewEntry
    from core.types import Source
    from envs.entry_check import EntryChecker
    from trainers.config import load_run_config
    from trainers.cotrain import EntryAudit

    store = ExperienceStore(f"sqlite:///{tmp_path / 'w.db'}")
    checker = EntryChecker()
    new = []
    for k in range(3):
        f = checker.facts(ENV, k)
        obj = f["object"]
        where = f["targets"][obj][0] if k < 2 else next(r for r in f["receptacles"] if r not in f["targets"][obj])
        task = instance_task(ENV, k, f["task"] + ".")
        new.append(NewEntry(text=_entry(f"In household {k} the {obj} is in {where}.", k), env=ENV, task=task,
                            query=task, source=Source.MANUAL))
    new.append(NewEntry(text=_entry("Search every receptacle.", 4), env=ENV, task=instance_task(ENV, 4, "x."),
                        query="x", source=Source.MANUAL))  # no claim, but checkable: counts against the share
    new.append(NewEntry(text=_entry("The pen is in desk 1.", 9), env=ENV, task=instance_task(ENV, 9, "x."),
                        query="x", source=Source.MANUAL))  # an unseen household: not the library's seen share
    checker.close()
    store.add_entries(new, actor="test")
    cfg = load_run_config({"env": {"names": {ENV: 1.0}, "task_set": 6}})
    audit = EntryAudit(cfg, store, None)
    try:
        m = audit.metrics()
    finally:
        audit.close()
        store.close()
    assert m["library/entry_correct_share"] == pytest.approx(2 / 4)
    assert m["library/entry_claim_share"] == pytest.approx(3 / 4)


def test_recurring_config_loads():
    from pathlib import Path

    from trainers.config import load_run_config

    cfg = load_run_config(Path(__file__).resolve().parents[1] / "configs" / "alfworld_recurring_cpu.yaml")
    assert cfg.env.task_set > 0 and all(n.startswith("alfworld/") for n in cfg.env.names)


@pytest.mark.slow
def test_a_one_step_run_on_recurring_households_logs_the_correct_share(tmp_path):
    """`comprl train` for one step on 3 households with a library seeded by hand (two right entries, one wrong): the
    trajectories name their household, training and seen evaluation play ids 0-2 and unseen evaluation ids 3-4, and
    library/entry_correct_share reaches the store."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from core.store import ExperienceStore, NewEntry
    from core.types import Source
    from envs.alfworld import ACTION_FORMAT
    from envs.entry_check import EntryChecker
    from trainers import prompts as P
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder

    models = tmp_path / "models"
    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, P.EXTRACTOR_USER, ACTION_FORMAT] * 30, vocab_size=400)
    for name in ("policy", "extractor"):
        save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=1), tok, models / name)
    data = tmp_path / "data"
    data.mkdir()
    store = ExperienceStore(f"sqlite:///{data / 'workbench.db'}")
    checker = EntryChecker()
    entries = []
    for k in range(3):
        f = checker.facts(ENV, k)
        obj = f["object"]
        where = f["targets"][obj][0] if k < 2 else next(r for r in f["receptacles"] if r not in f["targets"][obj])
        task = instance_task(ENV, k, f["task"] + ".")
        entries.append(NewEntry(text=_entry(f"In household {k} the {obj} is in {where}.", k), env=ENV, task=task,
                                query=task, source=Source.MANUAL))
    checker.close()
    store.add_entries(entries, actor="test")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
run: {{name: households, variant: complementary, max_steps: 1, eval_episodes: 2, checkpoint_every: 1, threads: 1, deterministic: true}}
env: {{names: {{{ENV}: 1.0}}, max_turns: 2, task_set: 3, options: {{cache_dir: {tmp_path / 'alfworld-cache'}}}}}
actor: {{path: {models / 'policy'}, max_new_tokens: 4}}
rollout: {{tasks_per_step: 2, group_size: 2, with_experience: 1}}
extractor: {{model: {{path: {models / 'extractor'}, max_new_tokens: 24}}, buffer_size: 4, merge_every: 0}}
library: {{manager: {{task_scope: true}}}}
""")
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "app.cli", "train", str(cfg), "--data-dir", str(data)], cwd=root,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    run = store.list_runs()[0]
    m = store.latest_metrics(run["id"])
    assert m["library/entry_correct_share"] == pytest.approx(2 / 3)  # the random extractor wrote nothing that parses
    for key in ("eval/success_with_exp", "eval/success_without_exp", "eval/success_unseen_with_exp",
                "eval/success_unseen_without_exp"):
        assert key in m, key
    tasks = {t["task"] for t in store.list_trajectories(run_id=run["id"])}
    assert tasks and all(t.startswith("Household ") for t in tasks)
    assert {task_id_of(t) for t in tasks} <= {0, 1, 2, 3, 4}
    store.close()


# ---------------------------------------------------------------- the warm start's ALFWorld teacher (issue 38 item 2)

def _teacher_demos(conditions, ids=range(1000, 1008), noise=0.0):
    from trainers import warmstart as W

    cfg = W.WarmStartConfig(envs=[ENV], max_turns=20, noisy_share=0.0)
    specs = [(ENV, k, c, noise) for c in conditions for k in ids]
    return cfg, W.play_episodes(cfg, specs, source="expert", seed=0)


def test_the_teachers_household_entries_are_right_or_wrong_by_the_checker():
    """A correct entry states where the task's object starts in that household ("In household 1003 the statue is in
    coffeetable 1."), which the entry checker scores right; a wrong one places it in a receptacle of the same household
    that holds none (scored wrong); none claims the placement prior any more."""
    from envs.entry_check import EntryChecker

    _, demos = _teacher_demos(("correct", "wrong"))
    checker = EntryChecker()
    try:
        for d in demos:
            k = task_id_of(d.task)
            assert f"In household {k} the {d.facts['object']} is in " in d.entry
            assert checker.verdict(ENV, d.task, d.entry) == ("right" if d.condition == "correct" else "wrong"), d.entry
    finally:
        checker.close()


def test_the_expert_walks_to_the_receptacle_an_entry_names_and_recovers_from_a_wrong_one():
    """Under an entry the expert goes to the receptacle it names first (opening it if closed); under a correct one it
    takes the object there, under a wrong one it searches on and still solves the household. Without an entry it
    searches in listing order and needs more actions."""
    from envs.alfworld.claims import claimed_location

    _, demos = _teacher_demos(("none", "correct", "wrong"))
    by = {c: [d for d in demos if d.condition == c] for c in ("none", "correct", "wrong")}
    for d in by["correct"] + by["wrong"]:
        named = claimed_location(d.entry, d.facts["object"])
        assert d.turns[0].label == f"go to {named}"
    assert sum(d.success for d in by["wrong"]) >= len(by["wrong"]) / 2  # a search of up to 20 actions
    for d in by["correct"]:
        assert d.success
        assert any(t.label.startswith(f"take {d.facts['object']} ") and t.label.endswith(f" from {d.facts['where']}")
                   for t in d.turns)
        assert len(d.turns) <= 6
    mean = {c: sum(len(d.turns) for d in ds) / len(ds) for c, ds in by.items()}
    assert mean["correct"] < mean["none"] and mean["correct"] < mean["wrong"]


def test_the_extractors_teacher_writes_where_the_object_was_seen_or_nothing():
    """The lesson of an ALFWorld episode is what its trajectory shows: the think quotes the observation in which the
    task's object was seen or taken, and the entry added says where it was (scored right by the checker); an episode
    cut short before the object was seen writes nothing ([])."""
    import dataclasses

    from envs.entry_check import EntryChecker
    from trainers.warmstart.examples import _extractor_target

    _, demos = _teacher_demos(("none", "correct", "wrong"), ids=range(1000, 1004))
    checker = EntryChecker()
    try:
        for d in demos:
            ops, answer = _extractor_target(d)
            assert len(ops) == 1 and ops[0]["function"] == "add"
            assert checker.verdict(ENV, d.task, ops[0]["new_memory"]) == "right", ops
            think = answer.split("</think>", 1)[0]
            assert d.facts["object"] in think and ("You pick up" in think or "you see" in think)
        blind = [dataclasses.replace(d, turns=d.turns[:1], final_observation="You arrive at bed 1. On the bed 1, you see nothing.")
                 for d in demos if d.condition == "none"]
        for d in blind:
            assert _extractor_target(d)[0] == []
    finally:
        checker.close()


def test_alfworld_policy_labels_carry_no_lead_and_minihack_keeps_it():
    """A constrained ALFWorld reply is exactly an admissible command, so its demonstrated reply has no leading space
    (the tokens the constraint lets the policy write); MiniHack's keep ACTION_LEAD."""
    from trainers import warmstart as W
    from trainers.warmstart.examples import action_lead

    cfg, demos = _teacher_demos(("correct",), ids=range(1000, 1001))
    assert action_lead(demos[0]) == ""
    assert action_lead(dataclasses_replace_env(demos[0], "minihack/Room-5x5")) == W.ACTION_LEAD


def dataclasses_replace_env(demo, env):
    import dataclasses

    return dataclasses.replace(demo, env=env)


def test_a_model_plays_alfworld_within_the_admissible_commands():
    """The warm start's model rollouts (DAgger, evaluation, the entry probe) decode ALFWorld replies within the env's
    admissible commands: an untrained tiny model sends no refused action, and every action it took was admissible."""
    import torch

    from envs.alfworld import ACTION_FORMAT
    from trainers import prompts as P
    from trainers import warmstart as W
    from trainers.models import build_tiny_qwen2, build_tokenizer, load_backend, save_model_folder

    import tempfile

    texts = [P.ACTOR_SYSTEM_NO_TOOL, P.ACTOR_USER, ACTION_FORMAT, "go to drawer 1 take pen 1 from desk 2 open safe 1"] * 20
    tok = build_tokenizer(texts, vocab_size=400)
    model = build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, mlp=64, max_pos=4096, seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)  # sharp logits: a free reply would be far from any command
    with tempfile.TemporaryDirectory() as tmp:
        backend = load_backend("hf", save_model_folder(model, tok, tmp), quiet=True)
        cfg = W.WarmStartConfig(envs=[ENV], max_turns=4, rollout_batch=3)
        demos = W._rollouts(backend, cfg, [(ENV, k, c) for k, c in zip((0, 1, 2), ("none", "correct", "wrong"))],
                            temperature=1.0, seed=0, source="eval", max_new_tokens=24)
    assert len(demos) == 3 and all(len(d.turns) == 4 for d in demos)
    assert sum(d.invalid_actions for d in demos) == 0

"""A/B arms: each library state an arm can play with, and config validation."""
from __future__ import annotations

from core.config import AbTestConfig, from_dict
from core.library_io import export_library
from trainers.evaluate import arm_entries, validate_ab_config


def test_every_arm_kind(store, tmp_path):
    a = store.add_entry("alpha", env="e", task="t")
    b = store.add_entry("beta", env="e", task="t")
    v = store.library_version()
    store.update_text(a, "alpha v2", expected_version=1)
    store.archive([b])
    c = store.add_entry("gamma", env="e", task="t")
    assert arm_entries(store, {"kind": "none"}) is None
    assert sorted(e.text for e in arm_entries(store, {"kind": "current"})) == ["alpha v2", "gamma"]
    assert sorted(e.text for e in arm_entries(store, {"kind": "version", "version": v})) == ["alpha", "beta"]
    assert [e.text for e in arm_entries(store, {"kind": "minus", "ids": [c]})] == ["alpha v2"]
    assert sorted(e.text for e in arm_entries(store, {"kind": "plus", "ids": [b]})) == ["alpha v2", "beta", "gamma"]
    f = tmp_path / "lib.jsonl"
    export_library(store, f, status="active")
    got = arm_entries(store, {"kind": "file", "path": str(f)})
    assert sorted(e.text for e in got) == ["alpha v2", "gamma"] and all(e.env == "e" for e in got)


def test_ab_config_errors(tmp_path):
    ok = {"env": "minihack/Room-5x5", "seeds": [1, 2], "arms": {"A": {"kind": "current"}, "B": {"kind": "none"}}}
    assert validate_ab_config(ok) == ""
    assert "unknown env" in validate_ab_config({**ok, "env": "nope"})
    assert "seeds" in validate_ab_config({**ok, "seeds": []})
    assert "exactly A and B" in validate_ab_config({**ok, "arms": {"A": {"kind": "none"}}})
    assert "does not exist" in validate_ab_config({**ok, "arms": {"A": {"kind": "file", "path": str(tmp_path / "x")},
                                                                  "B": {"kind": "none"}}})
    assert "list of entry ids" in validate_ab_config({**ok, "arms": {"A": {"kind": "minus"}, "B": {"kind": "none"}}})


def test_ab_episodes_per_task_need_sampling_and_pair_in_order():
    from trainers.evaluate import ab_specs

    ok = {"env": "minihack/Room-Ultimate-5x5", "seeds": [3, 5], "task_ids": True,
          "arms": {"A": {"kind": "current"}, "B": {"kind": "none"}}}
    assert validate_ab_config({**ok, "episodes_per_task": 4, "decoding": "sampled"}) == ""
    assert "choose sampled decoding" in validate_ab_config({**ok, "episodes_per_task": 4})  # greedy is the default
    assert "decoding must be one of" in validate_ab_config({**ok, "decoding": "beam"})
    for bad in (0, 65):
        assert "whole number from 1 to 64" in validate_ab_config({**ok, "episodes_per_task": bad, "decoding": "sampled"})
    for bad in (2.5, True, "4"):
        assert "episodes_per_task" in validate_ab_config({**ok, "episodes_per_task": bad, "decoding": "sampled"})
    cfg = from_dict(AbTestConfig, {**ok, "episodes_per_task": 3, "decoding": "sampled"})
    a, b = ab_specs(cfg, True), ab_specs(cfg, False)
    assert [s.task_id for s in a] == [3, 5, 3, 5, 3, 5] and [s.task_id for s in b] == [s.task_id for s in a]
    assert [s.seed for s in a] == [s.seed for s in b] and len({s.group_id for s in a}) == 6
    assert all(s.with_experience for s in a) and not any(s.with_experience for s in b)
    plain = ab_specs(from_dict(AbTestConfig, {**ok, "task_ids": False}), False)
    assert [(s.seed, s.task_id) for s in plain] == [(3, None), (5, None)]


def test_ab_config_is_typed_and_every_stored_shape_is_checked():
    """The stored config (JSON) is an AbTestConfig: unknown fields, wrong types, missing fields and malformed
    arms are refused with the field named, before anything plays."""
    from trainers.evaluate import ab_config

    ok = {"env": "minihack/Room-5x5", "seeds": [1, 2], "arms": {"A": {"kind": "current"}, "B": {"kind": "none"}}}
    cfg, why = ab_config(ok)
    assert why == "" and isinstance(cfg, AbTestConfig) and (cfg.episodes_per_task, cfg.decoding, cfg.max_turns) == (1, "greedy", None)
    assert "unknown config field repeats" in ab_config({**ok, "repeats": 3})[1]
    assert "has no seeds" in ab_config({k: v for k, v in ok.items() if k != "seeds"})[1]
    assert "task_ids" in ab_config({**ok, "task_ids": "yes"})[1]
    assert "max_turns must be at least 1" in ab_config({**ok, "max_turns": 0})[1]
    assert "arm A: a past library version" in ab_config({**ok, "arms": {"A": {"kind": "version"}, "B": {"kind": "none"}}})[1]
    assert "seeds must be a non-empty list of integers" in ab_config({**ok, "seeds": [1, True]})[1]
    assert "actor.prompt_style" in ab_config({**ok, "actor": {"prompt_style": "poem"}})[1]
    assert ab_config([1, 2])[1] == "the config must be a mapping"

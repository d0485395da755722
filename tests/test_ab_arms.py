"""A/B arms: each library state an arm can play with, and config validation."""
from __future__ import annotations

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
    for bad in (0, 65, 2.5, True, "4"):
        assert "whole number from 1 to 64" in validate_ab_config({**ok, "episodes_per_task": bad, "decoding": "sampled"})
    a, b = ab_specs({**ok, "episodes_per_task": 3}, True), ab_specs({**ok, "episodes_per_task": 3}, False)
    assert [s.task_id for s in a] == [3, 5, 3, 5, 3, 5] and [s.task_id for s in b] == [s.task_id for s in a]
    assert [s.seed for s in a] == [s.seed for s in b] and len({s.group_id for s in a}) == 6
    assert all(s.with_experience for s in a) and not any(s.with_experience for s in b)
    plain = ab_specs({**ok, "task_ids": False}, False)
    assert [(s.seed, s.task_id) for s in plain] == [(3, None), (5, None)]

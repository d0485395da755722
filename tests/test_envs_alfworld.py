"""envs/alfworld/ on the real ALFWorld text engine (TextWorld's PDDL backend + alfworld's domain).

Game building costs ~0.5 s per new instance on this CPU (fast-downward's translation), so the
tests share one cache directory and reuse the same seeds: after the first build a reset is a
memo hit (~0.05 s).
"""
from __future__ import annotations

import collections
import json
import math
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("textworld")
pytest.importorskip("alfworld")

from envs import alfworld as aw  # noqa: E402
from envs.base import EnvError, check_env  # noqa: E402
from envs.registry import ALFWORLD_TASK_TYPES, list_envs, make_env  # noqa: E402

EXPERT_SEEDS = range(9)  # x 6 task types = 54 instances


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("alfworld-cache")


@pytest.fixture(scope="module")
def envs(cache_dir):
    made = {t: make_env(f"alfworld/{t}", cache_dir=cache_dir, max_turns=30) for t in ALFWORLD_TASK_TYPES}
    yield made
    for env in made.values():
        env.close()


def play(env, seed: int, mode: str) -> tuple[bool, int]:
    """One expert episode; every expert action must be one the game accepts."""
    _, info = env.reset(seed=seed)
    done, turns = False, 0
    while not done:
        action = aw.alfworld_expert(env, mode)
        assert action in info["admissible_actions"], (env.task, action, env.history[-2:])
        _, reward, terminated, truncated, info = env.step(action)
        done, turns = terminated or truncated, turns + 1
    assert (reward == 1.0) == info["success"]
    return info["success"], turns


def test_registry_names_every_task_type():
    assert set(aw.TASK_TYPES) == set(ALFWORLD_TASK_TYPES)
    assert {f"alfworld/{t}" for t in ALFWORLD_TASK_TYPES} | {"alfworld/all"} <= set(list_envs())


@pytest.mark.parametrize("task_type", ALFWORLD_TASK_TYPES)
def test_check_env(envs, task_type):
    env = envs[task_type]
    assert env.name == f"alfworld/{task_type}"
    check_env(env, seed=0)


def test_observation_task_and_admissible_actions(envs):
    env = envs["pick_clean_then_place"]
    obs, info = env.reset(seed=0)
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert "You are in the middle of a room. Looking quickly around you, you see" in obs
    assert obs.endswith("Your task is to: " + env.task)
    assert env.task.startswith(("put a clean ", "clean some ")) and env.task.endswith(".")
    goal = env.goal
    assert goal.object_type in env.task and goal.receptacle_type in env.task
    assert info["task_type"] == "pick_clean_then_place" and info["invalid_action"] is False
    assert {"look", "inventory"} <= set(info["admissible_actions"])
    assert any(a.startswith("go to ") for a in info["admissible_actions"])
    for word in ("go to", "open", "take", "move", "heat", "cool", "clean", "use", "examine", "look", "inventory"):
        assert word in env.action_format


def test_game_matches_generated_instance(envs):
    """The demangled names the game shows are the instance's names, objects where it put them."""
    for task_type in ALFWORLD_TASK_TYPES:  # every scene kind, sinkbasin / bathtubbasin names included
        env = envs[task_type]
        env.reset(seed=1)
        inst, view = env.instance, env.world
        assert sorted(view.receptacles) == sorted(n for n, _ in inst.receptacles)
        placed = inst.objects + ([inst.light] if inst.light else [])
        assert {o: r for o, _, r in placed} == view.where
        assert all(view.kind[o] == t for o, t, _ in placed)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["oracle", "prior"])
def test_expert_solves_95_percent(envs, mode):
    results = collections.Counter()
    turns = []
    for task_type in ALFWORLD_TASK_TYPES:
        for seed in EXPERT_SEEDS:
            won, n = play(envs[task_type], seed, mode)
            results[won] += 1
            turns.append(n)
    total = sum(results.values())
    assert total >= 50
    assert results[True] / total >= 0.95, f"{mode} expert solved {results[True]}/{total}"
    print(f"{mode}: {results[True]}/{total} solved, {sum(turns) / len(turns):.1f} actions per episode")


def test_prior_expert_does_not_peek(envs):
    """Without having looked anywhere, the prior expert heads for the most likely receptacle type,
    wherever the object really is; the oracle goes to the object."""
    env = envs["pick_and_place"]
    for seed in range(6):
        env.reset(seed=seed)
        placement = env.priors.placement(env.goal.object_type)
        first = aw.alfworld_expert(env, "prior")
        assert first.startswith("go to ")
        kind = first[len("go to "):].rsplit(" ", 1)[0]
        assert placement[kind] == max(placement.values())
        oracle_first = aw.alfworld_expert(env, "oracle")
        holders = {r for o, t, r in env.instance.objects if t == env.goal.object_type}
        assert oracle_first[len("go to "):] in holders


def test_same_seed_same_instance(cache_dir):
    a = aw.make_alfworld("all", cache_dir=cache_dir)
    b = aw.make_alfworld("all", cache_dir=cache_dir)
    try:
        for seed in (0, 7):
            obs_a, _ = a.reset(seed=seed)
            obs_b, _ = b.reset(seed=seed)
            assert obs_a == obs_b and a.task == b.task and a.instance == b.instance
            for _ in range(3):
                action = aw.alfworld_expert(a)
                assert a.step(action)[0] == b.step(action)[0]
        assert a.reset(seed=0)[0] != a.reset(seed=1)[0]
    finally:
        a.close()
        b.close()


def test_invalid_action_feedback(envs):
    env = envs["pick_and_place"]
    _, info = env.reset(seed=2)
    before = info["admissible_actions"]
    obs, reward, terminated, truncated, info = env.step("fly to the moon")
    assert info["invalid_action"] is True and info["turn"] == 1
    assert obs.startswith("Nothing happens.") and "fly to the moon" in obs
    assert "take O from X" in obs and "move O to X" in obs
    assert reward == 0.0 and not terminated and not truncated
    assert info["admissible_actions"] == before
    # An action the game knows but that does not apply here is invalid too.
    obs, *_, info = env.step("take apple 9 from countertop 9")
    assert info["invalid_action"] is True and info["turn"] == 2
    # Case, spacing, a final period and ALFWorld's older "put X in/on Y" are understood.
    target = next(a for a in info["admissible_actions"] if a.startswith("go to "))
    obs, *_, info = env.step("  " + target.upper() + ". ")
    assert info["invalid_action"] is False and obs.startswith("You arrive at")
    assert aw.normalise_action("put apple 1 in/on fridge 1") == "move apple 1 to fridge 1"
    assert aw.normalise_action("Put the Mug 2 on countertop 1.") == "move the mug 2 to countertop 1"


def test_turn_limit_truncates(cache_dir):
    env = aw.make_alfworld("pick_two_obj", cache_dir=cache_dir, max_turns=3)
    try:
        env.reset(seed=0)
        outs = [env.step("look") for _ in range(3)]
        assert [o[3] for o in outs] == [False, False, True]
        assert outs[-1][4]["success"] is False and outs[-1][1] == 0.0
        with pytest.raises(RuntimeError):
            env.step("look")
    finally:
        env.close()


def test_placement_priors_hold_over_many_instances():
    """Empirical placement frequencies match assets/alfworld/priors.yaml."""
    priors = aw.load_priors()
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for task_type in aw.TASK_TYPES:
        for seed in range(500):
            inst = aw.generate_instance(task_type, seed, priors)
            kind = dict(inst.receptacles)
            for _, otype, recep in inst.objects + ([inst.light] if inst.light else []):
                counts[otype][kind[recep]] += 1
    checked = 0
    for otype, counter in counts.items():
        n = sum(counter.values())
        if n < 150:
            continue
        placement = priors.placement(otype)
        assert set(counter) <= set(placement), (otype, counter)
        for recep, p in placement.items():
            freq = counter[recep] / n
            # 4 standard errors plus a little for the rare rejected (infeasible-goal) draws.
            assert abs(freq - p) <= 4 * math.sqrt(p * (1 - p) / n) + 0.02, (otype, recep, freq, p, n)
        checked += 1
    assert checked >= 30


def test_many_distinct_instances():
    signatures = set()
    total = 0
    for task_type in aw.TASK_TYPES:
        for seed in range(400):
            inst = aw.generate_instance(task_type, seed)
            signatures.add((inst.goal, inst.task, tuple(inst.receptacles), tuple(sorted(inst.objects)), inst.light))
            total += 1
    assert len(signatures) >= 0.99 * total  # thousands of distinct games
    # "all" mixes every task type.
    assert {aw.generate_instance(t, 0).goal.task_type for t in aw.TASK_TYPES} == set(aw.TASK_TYPES)


def test_game_files_are_cached(cache_dir):
    env = aw.make_alfworld("pick_heat_then_place", cache_dir=cache_dir)
    try:
        env.reset(seed=123)
        files = set(cache_dir.glob("*.tw-pddl"))
        game = json.loads(env.game_file.read_text())
        assert {"pddl_domain", "grammar", "pddl_problem"} <= set(game) and "UNKNOWN GOAL" not in game["grammar"]
        assert "(:domain alfred)" in game["pddl_problem"]
        assert list((cache_dir / "sas").glob("*.pkl")) and list((cache_dir / "twl2").glob("*.pkl"))
        t0 = time.perf_counter()
        env.reset(seed=123)
        warm = time.perf_counter() - t0
        assert set(cache_dir.glob("*.tw-pddl")) == files
        assert warm < 1.0, f"a cached reset took {warm:.2f} s"
    finally:
        env.close()


def test_prior_hints():
    hint = aw.prior_hint("apple")
    assert hint.startswith("Apples are usually on a countertop (50%)")
    assert hint.index("countertop") < hint.index("fridge") < hint.index("diningtable")
    assert "in a fridge" in hint
    assert aw.prior_hint("knife").startswith("Knives")


def test_env_placement_hint(envs):
    env = envs["look_at_obj_in_light"]
    env.reset(seed=4)
    hint = env.placement_hint()
    assert aw.prior_hint(env.goal.object_type) in hint and aw.prior_hint(env.goal.toggle_type) in hint


def test_unknown_task_type_is_an_env_error():
    with pytest.raises(EnvError, match="unknown ALFWorld task type"):
        aw.make_alfworld("slice_and_dice")


def test_official_data_missing_is_an_env_error(monkeypatch, tmp_path):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(EnvError, match="ALFWORLD_DATA"):
        make_env("alfworld/pick_and_place", split="train")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(EnvError, match="json_2.1.1"):
        make_env("alfworld/all", split="eval_in_distribution")
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(EnvError, match="valid_unseen"):
        make_env("alfworld/all", split="eval_out_of_distribution")
    with pytest.raises(EnvError, match="unknown ALFWorld split"):
        make_env("alfworld/all", split="test")


def _write_official_game(root: Path, inst: aw.Instance, trial: str, solvable: bool = True, tag: str = "") -> None:
    """A game in the layout of ALFWorld's json_2.1.1 tree (game.tw-pddl + traj_data.json)."""
    g = inst.goal
    alf_type = aw.ALFWORLD_TASK_NAMES[g.task_type]
    folder = root / f"{alf_type}-{g.object_type.title()}{tag}-None-{(g.receptacle_type or g.toggle_type).title()}-1" / trial
    folder.mkdir(parents=True)
    game = aw.game_json(inst)
    game["solvable"] = solvable
    (folder / "game.tw-pddl").write_text(json.dumps(game))
    # ALFWorld writes CamelCase targets; the loader lower-cases them.
    params = {"object_target": g.object_type.title(), "parent_target": (g.receptacle_type or "").title(),
              "toggle_target": (g.toggle_type or "").title(), "mrecep_target": "", "object_sliced": False}
    (folder / "traj_data.json").write_text(json.dumps({"task_type": alf_type, "pddl_params": params}))


def test_official_game_tree_loads_and_plays(tmp_path, cache_dir):
    """The split loader on a tree in the official layout (built here from generated games)."""
    train = tmp_path / "json_2.1.1" / "train"
    _write_official_game(train, aw.generate_instance("pick_and_place", 0), "trial_T0")
    _write_official_game(train, aw.generate_instance("pick_and_place", 1), "trial_T1", solvable=False)
    _write_official_game(train, aw.generate_instance("pick_and_place", 2), "trial_T2")
    _write_official_game(train, aw.generate_instance("pick_and_place", 3), "trial_T3", tag="Sliced")
    _write_official_game(train, aw.generate_instance("look_at_obj_in_light", 0), "trial_T4")
    env = make_env("alfworld/pick_and_place", split="train", data_dir=str(tmp_path), cache_dir=cache_dir)
    try:
        assert len(env.official_games) == 3  # not the look_at game, not the sliced one
        intros = set()
        for seed in range(3):
            won, _ = play(env, seed, "oracle")
            assert won
            intros.add(env.history[0][1])
            assert env.instance is None and env.goal.task_type == "pick_and_place"
        # The unsolvable game is skipped: its seed falls through to the next solvable game.
        assert len(intros) == 2
    finally:
        env.close()


_PLAIN_REPLAY = """
import json, sys, textworld
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
path, actions = sys.argv[1], json.loads(sys.argv[2])
env = textworld.start(path, request_infos=textworld.EnvInfos(won=True, admissible_commands=True),
                      wrappers=[AlfredDemangler])
state = env.reset()
out = [[state.feedback.strip(), state.admissible_commands]]
for action in actions:
    state, _, _ = env.step(action)
    out.append([state.feedback.strip(), state.admissible_commands])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_speedups_change_nothing(envs):
    """The memoised engine plays exactly like stock TextWorld (run in a fresh process, unpatched)."""
    import subprocess
    import sys

    env = envs["pick_two_obj"]
    obs, info = env.reset(seed=5)
    ours = [[obs, info["admissible_actions"]]]
    actions = []
    done = False
    while not done:
        actions.append(aw.alfworld_expert(env, "prior"))
        obs, _, terminated, truncated, info = env.step(actions[-1])
        ours.append([obs, info["admissible_actions"]])
        done = terminated or truncated
    out = subprocess.run([sys.executable, "-c", _PLAIN_REPLAY, str(env.game_file), json.dumps(actions)],
                         capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == ours


def test_pddl_ids_demangle_to_the_names_the_game_shows():
    """Every receptacle and object kind in the priors, several instances each, through alfworld's
    own Demangler (the game lower-cases PDDL names first)."""
    from types import SimpleNamespace

    from alfworld.agents.utils.misc import Demangler

    priors = aw.load_priors()
    kinds = {r for scene in priors.scenes.values() for r in scene.receptacles} | set(priors.objects) | set(priors.lights)
    kinds |= {"bathtubbasin", "sinkbasin"}
    names = [f"{kind} {i}" for kind in sorted(kinds) for i in range(1, 12)]
    ids = {aw._pddl_id(name, 11).lower(): name for name in names}
    demangler = Demangler(game_infos={i: SimpleNamespace(id=i) for i in ids})
    assert {i: demangler.demangle_alfred_name(i).strip() for i in ids} == ids


_MANY_ENVS = """
import gc, json, random, sys
from envs import alfworld as aw

cache_dir = sys.argv[1]
rng = random.Random(0)
names = list(aw.TASK_TYPES) + ["all"]
seeds = range(9)  # the games the tests above built (cached translations)
peak = 0
for rnd in range(3):
    # Several envs alive at once (an env-pool worker), steps interleaved between them.
    live = [aw.make_alfworld(t, cache_dir=cache_dir) for t in names]
    peak = max(peak, len(live))
    for env in live:
        env.reset(seed=rng.choice(seeds))
    for _ in range(4):
        for env in rng.sample(live, len(live)):
            if not env.done:
                env.step(aw.alfworld_expert(env, "oracle"))
    for env in live[:2]:
        env.reset(seed=rng.choice(seeds))  # another game in the same env (same library copy)
    # Closed in a random order; one is dropped without close() and garbage-collected.
    rng.shuffle(live)
    dropped = live.pop()
    for env in live:
        env.close()
        env.close()  # closing twice is harmless
    del dropped, env, live
    gc.collect()
    # Then one env at a time, made and closed again and again (the demo, a respawning slot).
    for _ in range(5):
        env = aw.make_alfworld(rng.choice(names), cache_dir=cache_dir)
        env.reset(seed=rng.choice(seeds))
        env.step(aw.alfworld_expert(env, "prior"))
        env.close()
        env.reset(seed=rng.choice(seeds))  # a closed env starts again on reset
        env.step("look")
        env.close()
print(json.dumps({"loaded": aw._LIB_POOL.loaded, "free": aw._LIB_POOL.free, "peak": peak}))
"""


@pytest.mark.slow
def test_many_envs_made_played_and_closed_in_one_process(cache_dir):
    """Regression: several envs alive at once, closed, then new ones made used to kill the process
    with a segfault inside fast_downward.load_lib (dlclosed library copies left dangling entries in
    the registry all copies share; see _DownwardLibPool). Run in a subprocess so a crash fails
    this test instead of ending pytest; each library copy must be loaded once and reused."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _MANY_ENVS, str(cache_dir)],
                         capture_output=True, text=True, timeout=600, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, f"exit code {out.returncode}\n{out.stderr[-3000:]}"
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats["loaded"] <= stats["peak"]  # copies reused, not one per env
    assert stats["free"] == stats["loaded"]  # closed and collected envs all gave theirs back


def test_closed_env_returns_its_library_copy(cache_dir):
    """In this process too: close() hands the copy to the pool and the next env takes it."""
    a = aw.make_alfworld("pick_and_place", cache_dir=cache_dir)
    a.reset(seed=0)
    lib = a._tw.unwrapped.downward_lib
    a.close()
    b = aw.make_alfworld("pick_and_place", cache_dir=cache_dir)
    try:
        b.reset(seed=1)
        assert b._tw.unwrapped.downward_lib is lib
        assert b.step("look")[4]["invalid_action"] is False
    finally:
        b.close()


def test_listing_follows_the_first_observation(envs):
    """The prior expert searches in the order the room's first observation lists the receptacles,
    the one order a policy can read back from its prompt (it keeps that observation: keep_intro)."""
    env = envs["pick_and_place"]
    assert env.keep_intro is True
    intro, _ = env.reset(seed=0)
    assert sorted(env.listing) == sorted(env.world.receptacles)
    positions = [intro.index(f"a {r},") if f"a {r}," in intro else intro.index(f"a {r}.") for r in env.listing]
    assert positions == sorted(positions)
    assert aw._listing("You see nothing.", ["b 1", "a 1"]) == ["b 1", "a 1"]  # nothing named: name order kept
    from trainers.warmstart import _alfworld_action

    for seed in range(4):
        env.reset(seed=seed)
        first = _alfworld_action(env, informed=False)  # no placement knowledge: pure listing order
        assert first == f"go to {env.listing[0]}"

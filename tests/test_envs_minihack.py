"""The real MiniHack envs behind the TextEnv protocol."""
from __future__ import annotations

import pytest

from envs.base import EnvError, TextEnv, check_env
from envs.minihack import TASKS, make_minihack


@pytest.fixture(scope="module")
def envs():
    built = {t: make_minihack(t) for t in TASKS}
    yield built
    for env in built.values():
        env.close()


@pytest.mark.parametrize("task", list(TASKS))
def test_check_env_every_task(envs, task):
    env = envs[task]
    assert isinstance(env, TextEnv)
    assert env.name == f"minihack/{task}"
    check_env(env, seed=1)


@pytest.mark.parametrize("task", list(TASKS))
def test_observation_has_map_legend_and_goal(envs, task):
    obs, info = envs[task].reset(seed=2)
    assert "Map:\n" in obs and "Legend: @ you" in obs and "@" in obs.split("Map:\n")[1]
    assert "staircase down" in obs  # either where it is or that it is not seen yet
    assert info["admissible_actions"] == envs[task].admissible_actions
    assert {"north", "south", "east", "west"} <= set(info["admissible_actions"])


def test_bad_action_is_feedback_and_a_turn(envs):
    env = envs["Room-5x5"]
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("fly to the moon")
    assert info["invalid_action"] is True and info["turn"] == 1
    assert "not a valid action" in obs and "north" in obs and "Map:" in obs
    assert (reward, terminated, truncated) == (0.0, False, False)
    # An action another task has is still invalid here, with the same explanation.
    _, _, _, _, info = env.step("open north")
    assert info["invalid_action"] is True and info["turn"] == 2


def test_same_seed_same_episode(envs):
    env = envs["Room-Ultimate-5x5"]
    actions = ["north", "east", "south", "west", "southeast", "northwest"] * 3

    def play(seed):
        trace = [env.reset(seed=seed)[0]]
        for a in actions:
            obs, r, te, tr, _ = env.step(a)
            trace.append((obs, r, te, tr))
            if te or tr:
                break
        return trace

    assert play(7) == play(7)
    maps = {env.reset(seed=s)[0] for s in range(8)}
    assert len(maps) > 1, "different seeds should give different starts"


def test_reaching_the_stairs_is_success(envs):
    env = envs["Room-5x5"]
    env.reset(seed=0)
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step("southeast")
        assert not terminated
    obs, reward, terminated, truncated, info = env.step("go southeast")
    assert terminated and not truncated and info["success"] is True and reward == 1.0
    # NetHack's screen is blank once the game is over: the last real view is shown instead.
    assert "\0" not in obs and "....>" in obs and "HP 12/12" in obs
    # the debrief: where the staircase was from the start (what a lesson about this level would say)
    assert obs.endswith("You reached the goal: the task is complete. Debrief: the staircase down (>) was 4 south and "
                        "4 east of your starting square; from the start, head southeast.")


def test_turn_limit_truncates_as_failure():
    env = make_minihack("Room-5x5", max_turns=3, describe=False)
    try:
        obs, _ = env.reset(seed=0)
        assert "Next to you" not in obs
        for turn in range(1, 4):
            obs, _, terminated, truncated, info = env.step("north")
        assert truncated and not terminated and info["success"] is False
        assert obs.endswith("Out of turns: the episode is over. Debrief: the staircase down (>) was 4 south and 4 east "
                            "of your starting square; from the start, head southeast.")  # lit: seen from the start
        with pytest.raises(RuntimeError):
            env.step("north")
    finally:
        env.close()


def test_word_forms(envs):
    room, key, soko = envs["Room-5x5"], envs["KeyRoom-S5"], envs["Sokoban"]
    assert room.parse("Go North.") == "north" and room.parse("se") == "southeast"
    assert room.parse("pick up") is None
    assert key.parse("apply key west") == "apply key" and key.parse("pick up the key") == "pick up"
    assert soko.parse("open door w") == "open west" and soko.parse("open") is None
    assert "apply key" in key.action_format and "open <direction>" in soko.action_format


def test_structured_view(envs):
    env = envs["Room-5x5"]
    env.reset(seed=0)
    r, c = env.agent_pos
    assert env.grid[r][c] == "@"
    assert any(">" in line for line in env.grid)


def test_bad_task_and_options_say_what_is_wrong():
    with pytest.raises(EnvError, match="known tasks"):
        make_minihack("Room-99x99")
    with pytest.raises(EnvError, match="unknown options"):
        make_minihack("Room-5x5", colour=True)


def test_the_debrief_sentence_has_one_shape_and_reads_back():
    """Both axes are always named (a zero as '0 south' / '0 east'), so every level's debrief has the same words in
    the same places: a tiny extractor copies it by position. The checker reads every offset of a 9x9 window back."""
    from envs.minihack import claimed_offset, first_heading, stairs_sentence

    assert stairs_sentence(3, 0) == ("the staircase down (>) was 3 south and 0 east of your starting square; "
                                     "from the start, head south")
    assert stairs_sentence(0, -2).startswith("the staircase down (>) was 0 south and 2 west of")
    shapes = set()
    for dr in range(-4, 5):
        for dc in range(-4, 5):
            if (dr, dc) == (0, 0):
                continue
            s = stairs_sentence(dr, dc)
            assert claimed_offset(s) == (dr, dc) and s.endswith(f"head {first_heading(dr, dc)}")
            shapes.add(len(s.split()))
    assert shapes == {19}

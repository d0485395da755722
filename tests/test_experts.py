"""Scripted experts: measured success, and the dispatcher."""
from __future__ import annotations

import pytest

from envs.experts import expert_action, minihack_expert
from envs.minihack import make_minihack


def success_rate(task: str, seeds: range) -> float:
    env = make_minihack(task)
    wins = 0
    try:
        for seed in seeds:
            env.reset(seed=seed)
            while True:
                _, _, terminated, truncated, info = env.step(minihack_expert(env))
                if terminated or truncated:
                    wins += info["success"]
                    break
    finally:
        env.close()
    return wins / len(seeds)


def test_expert_solves_room_5x5():
    assert success_rate("Room-5x5", range(50)) >= 0.95


@pytest.mark.parametrize("task, floor", [("Room-Ultimate-5x5", 0.85), pytest.param("MazeWalk-9x9", 0.9, marks=pytest.mark.slow),
                                         ("KeyRoom-S5", 0.9)])
def test_expert_on_harder_tasks(task, floor):
    # Regression floors well under the measured rates (0.97, 1.0, 1.0 over 200 seeds).
    assert success_rate(task, range(100, 140)) >= floor


def test_expert_actions_are_admissible():
    env = make_minihack("KeyRoom-S5")
    try:
        env.reset(seed=3)
        for _ in range(20):
            action = expert_action(env)
            assert action in env.admissible_actions
            _, _, terminated, truncated, info = env.step(action)
            assert not info.get("invalid_action")
            if terminated or truncated:
                break
    finally:
        env.close()


def test_dispatch_by_name():
    class Unknown:
        name = "chess/blitz"

    with pytest.raises(KeyError, match="no scripted expert"):
        expert_action(Unknown())


def test_sokoban_solver_on_a_small_level():
    # The real Sokoban1a takes ~20 s to solve, too slow for this suite (measured separately);
    # here three boulders, two pits in the corridor to the stairs, and the solver's own cache.
    from types import SimpleNamespace

    from envs.experts import _SokobanSolver

    level = [
        "#########",
        "#.......#",
        "#.`.`.###",
        "#..@..^^>",
        "####`.###",
        "####..###",
        "#########",
    ]
    grid = [line.replace("#", "-") for line in level]
    solver = _SokobanSolver()
    view = SimpleNamespace(grid=grid, agent_pos=(3, 3))
    first = solver.action(view)
    assert first in {"north", "east", "south", "west"}
    # Replaying the cached plan ends next to the stairs with both pits filled.
    board = [list(row) for row in grid]
    pos = (3, 3)
    moves = {"north": (-1, 0), "east": (0, 1), "south": (1, 0), "west": (0, -1)}
    for _ in range(200):
        action = solver.action(SimpleNamespace(grid=["".join(r) for r in board], agent_pos=pos))
        dr, dc = moves[action]
        nxt = (pos[0] + dr, pos[1] + dc)
        if board[nxt[0]][nxt[1]] == "`":
            beyond = (nxt[0] + dr, nxt[1] + dc)
            board[beyond[0]][beyond[1]] = "." if board[beyond[0]][beyond[1]] == "^" else "`"
        board[pos[0]][pos[1]] = "."
        board[nxt[0]][nxt[1]] = "@" if board[nxt[0]][nxt[1]] != ">" else ">"
        pos = nxt
        if board[pos[0]][pos[1]] == ">":
            break
    assert board[pos[0]][pos[1]] == ">" and not any("^" in "".join(r) for r in board)

"""Scripted experts: the next good action for an env's current state, as the actor would type it.

They produce demonstrations (SFT, DAgger-style relabelling of the model's own states) and a
reference success rate per task. `expert_action(env)` dispatches on `env.name`; the ALFWorld,
WebShop and SWE experts live beside their envs and are imported only when asked for, so a module
that is missing or broken elsewhere does not break MiniHack.
"""
from __future__ import annotations

import importlib
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from envs.minihack import MiniHackEnv

Cell = tuple[int, int]

# (d_row, d_col) -> word; orthogonal first so ties prefer moves that are legal next to doors.
_MOVES: list[tuple[str, int, int]] = [
    ("north", -1, 0), ("east", 0, 1), ("south", 1, 0), ("west", 0, -1),
    ("northeast", -1, 1), ("southeast", 1, 1), ("southwest", 1, -1), ("northwest", -1, -1),
]
# Characters the expert never walks through: walls, closed doors, boulders, iron bars, trees.
_SOLID = set("|-+`")
_UNKNOWN = " "


def _neighbours(cell: Cell) -> list[tuple[str, Cell, bool]]:
    r, c = cell
    return [(w, (r + dr, c + dc), dr != 0 and dc != 0) for w, dr, dc in _MOVES]


class _Planner:
    """BFS over the env's remembered map with a few hazard levels to relax in turn."""

    def __init__(self, env: MiniHackEnv) -> None:
        self.env = env
        self.grid = env.grid
        self.rows, self.cols = len(self.grid), len(self.grid[0]) if self.grid else 0
        self.doors = env.open_doors | env.closed_doors

    def char(self, cell: Cell) -> str:
        r, c = cell
        if 0 <= r < self.rows and 0 <= c < self.cols:
            return self.grid[r][c]
        return "|"

    def passable(self, cell: Cell, avoid: set[Cell]) -> bool:
        ch = self.char(cell)
        if cell in self.env.blocked or cell in self.env.closed_doors or cell in avoid:
            return False
        if cell in self.env.open_doors:
            return True
        return ch not in _SOLID and ch != _UNKNOWN

    def step_ok(self, a: Cell, b: Cell, diagonal: bool) -> bool:
        # NetHack forbids diagonal moves into or out of a doorway that holds a door.
        return not (diagonal and (a in self.env.open_doors or b in self.env.open_doors))

    def path_to(self, goal_test: Callable[[Cell], bool], avoid: set[Cell], enter_unknown: bool = False) -> str | None:
        """First move of a shortest path to a cell passing goal_test; unknown cells may only be a goal."""
        start = self.env.agent_pos
        first: dict[Cell, str | None] = {start: None}
        queue = deque([start])
        while queue:
            cell = queue.popleft()
            if cell != start and goal_test(cell):
                return first[cell]
            if cell != start and not self.passable(cell, avoid):
                continue  # goals may be impassable (unknown squares, the door we want to stand by)
            for word, nxt, diagonal in _neighbours(cell):
                if nxt in first or not self.step_ok(cell, nxt, diagonal):
                    continue
                if nxt in self.env.blocked or nxt in avoid:
                    continue
                if not self.passable(nxt, avoid) and not goal_test(nxt):
                    continue
                if self.char(nxt) == _UNKNOWN and not enter_unknown:
                    continue
                first[nxt] = first[cell] or word
                queue.append(nxt)
        return None

    def plan(self, goal_test: Callable[[Cell], bool], enter_unknown: bool = False) -> str | None:
        """Try the safest plan first: avoid traps and squares next to monsters, then relax."""
        near_monsters = {(r + dr, c + dc) for r, c in self.env.monsters for dr in (-1, 0, 1) for dc in (-1, 0, 1)}
        hazards = [self.env.traps | near_monsters, self.env.traps | self.env.monsters, set(self.env.traps), set()]
        for avoid in hazards:
            move = self.path_to(goal_test, avoid - {self.env.agent_pos}, enter_unknown)
            if move is not None:
                return move
        return None

    def frontier(self, cell: Cell) -> bool:
        """An unknown square next to a known walkable one: where exploring reveals something."""
        if self.char(cell) != _UNKNOWN or cell in self.env.blocked:
            return False
        return any(self.passable(n, set()) for _, n, _ in _neighbours(cell))


def minihack_expert(env: MiniHackEnv) -> str:
    """Next action for a MiniHack env: fetch the key and unlock the door if the task has one, walk
    to a known staircase, otherwise explore the nearest unknown square."""
    plan = _Planner(env)
    here = env.agent_pos
    words = set(env.admissible_actions)

    def is_char(ch: str) -> Callable[[Cell], bool]:
        return lambda cell: plan.char(cell) == ch

    # A sticky monster (lichen) holds us in place: the only way on is to kill it.
    if "cannot escape" in env.message.lower():
        for word, cell, _ in _neighbours(here):
            if cell in env.monsters and word in words:
                return word
    goal_seen = any(">" in line for line in env.grid)
    if "apply key" in words and not goal_seen:
        if not env.has_key:
            if env.underfoot == "(":
                return "pick up"
            move = plan.plan(is_char("("))
            if move:
                return move
        elif env.closed_doors:
            # Unlock from an orthogonal neighbour: MiniHack's apply then walks into the door,
            # which NetHack refuses diagonally.
            beside = {(r + dr, c + dc) for r, c in env.closed_doors for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))}
            if here in beside:
                return "apply key"
            move = plan.plan(lambda cell: cell in beside and plan.passable(cell, set()))
            if move:
                return move
    if goal_seen:
        move = plan.plan(is_char(">"))
        if move:
            return move
    move = plan.plan(plan.frontier, enter_unknown=True)
    if move:
        return move
    # Nothing reachable to aim for: try any direction not known to be solid.
    for word, cell, _ in _neighbours(here):
        if word in words and cell not in env.blocked and plan.char(cell) not in _SOLID:
            return word
    return next(iter(env.admissible_actions))


def _lazy_expert(module: str, func: str) -> Callable[[Any], str]:
    def expert(env: Any) -> str:
        return getattr(importlib.import_module(module), func)(env)

    return expert


_EXPERTS: dict[str, Callable[[Any], str]] = {
    "minihack/": minihack_expert,
    "alfworld/": _lazy_expert("envs.alfworld", "alfworld_expert"),
    "webshop": _lazy_expert("envs.webshop", "webshop_expert"),
    "swe/": _lazy_expert("envs.swe", "swe_expert"),
}


def expert_action(env: Any) -> str:
    """The scripted expert's next action for any registered env, chosen by `env.name`."""
    for prefix, expert in _EXPERTS.items():
        if env.name.startswith(prefix):
            return expert(env)
    raise KeyError(f"no scripted expert for env {env.name!r}; experts exist for: {', '.join(_EXPERTS)}")

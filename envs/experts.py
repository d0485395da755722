"""Scripted experts: the next good action for an env's current state, as the actor would type it.

They produce demonstrations (SFT, DAgger-style relabelling of the model's own states) and a
reference success rate per task. `expert_action(env)` dispatches on `env.name`; the ALFWorld,
WebShop and SWE experts live beside their envs and are imported only when asked for, so a module
that is missing or broken elsewhere does not break MiniHack.
"""
from __future__ import annotations

import importlib
import re
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from envs.minihack import MiniHackEnv

Cell = tuple[int, int]

# (d_row, d_col) -> word; orthogonal first so ties prefer moves that are legal next to doors.
# Diagonals first: of several shortest first moves, BFS keeps the first it meets, so in open rooms
# the expert steps along the heading the observation names (a step toward the staircase).
_MOVES: list[tuple[str, int, int]] = [
    ("northeast", -1, 1), ("southeast", 1, 1), ("southwest", 1, -1), ("northwest", -1, -1),
    ("north", -1, 0), ("east", 0, 1), ("south", 1, 0), ("west", 0, -1),
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

    def path_to(self, goal_test: Callable[[Cell], bool], avoid: set[Cell], enter_unknown: bool = False,
                prefer: str = "") -> str | None:
        """First move of a shortest path to a cell passing goal_test; unknown cells may only be a goal.

        `prefer` names a first move tried before the others: BFS keeps the order of the start's
        neighbours at every depth, so it wins whenever some shortest path starts with it."""
        start = self.env.agent_pos
        first: dict[Cell, str | None] = {start: None}
        queue = deque([start])
        while queue:
            cell = queue.popleft()
            if cell != start and goal_test(cell):
                return first[cell]
            if cell != start and not self.passable(cell, avoid):
                continue  # goals may be impassable (unknown squares, the door we want to stand by)
            moves = _neighbours(cell)
            if cell == start and prefer:
                moves.sort(key=lambda m: m[0] != prefer)
            for word, nxt, diagonal in moves:
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

    def plan(self, goal_test: Callable[[Cell], bool], enter_unknown: bool = False, prefer: str = "") -> str | None:
        """Try the safest plan first: avoid traps and squares next to monsters, then relax."""
        near_monsters = {(r + dr, c + dc) for r, c in self.env.monsters for dr in (-1, 0, 1) for dc in (-1, 0, 1)}
        hazards = [self.env.traps | near_monsters, self.env.traps | self.env.monsters, set(self.env.traps), set()]
        for avoid in hazards:
            move = self.path_to(goal_test, avoid - {self.env.agent_pos}, enter_unknown, prefer)
            if move is not None:
                return move
        return None

    def frontier(self, cell: Cell) -> bool:
        """An unknown square next to a known walkable one: where exploring reveals something."""
        if self.char(cell) != _UNKNOWN or cell in self.env.blocked:
            return False
        return any(self.passable(n, set()) for _, n, _ in _neighbours(cell))


def minihack_expert(env: MiniHackEnv) -> str:
    """Next action for a MiniHack env: solve Sokoban by planning pushes, fetch the key and unlock
    the door if the task has one, walk to a known staircase, otherwise explore the nearest unknown
    square."""
    from envs.minihack import heading_word

    if env.task_name == "Sokoban":
        move = _sokoban.action(env)
        if move:
            return move
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
        # Among equally short paths, take the step the observation's heading names ("a step east
        # brings you closer"), so that the demonstrations agree with what the policy reads.
        gr, gc = next((r, c) for r, line in enumerate(env.grid) for c, ch in enumerate(line) if ch == ">")
        move = plan.plan(is_char(">"), prefer=heading_word(gr - here[0], gc - here[1]))
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


class _SokobanSolver:
    """Plans boulder pushes that fill every pit (^) and leave the staircase reachable.

    Search: pits are filled one at a time, each by the fewest pushes (breadth-first over
    (boulders, pits, player region) states), committing to each fill. Squares from which no push
    can reach a pit are dead; a push onto one is allowed only while enough live boulders remain.
    The player walks orthogonally and boulders are pushed orthogonally, which NetHack always
    allows. Solving MiniHack's Sokoban1a takes ~10-30 s on this CPU, so every state along a solved
    plan is cached: replaying it from the start costs nothing, and a state off the plan is solved
    anew (or, past the node budget, left to the generic expert).
    """

    WIDTH = 79

    def __init__(self, budget: int = 250_000, max_cached: int = 200_000) -> None:
        self.budget = budget  # search nodes per solve; Sokoban1a from its start needs ~150k
        self.max_cached = max_cached
        self.next_word: dict[tuple[int, frozenset[int], frozenset[int]], str] = {}
        # Boulder/pit layouts a solve gave up on: walking about does not change them, so trying
        # again from every square would only repeat the same long, failing search.
        self.unsolved: set[tuple[frozenset[int], frozenset[int]]] = set()

    def action(self, env: MiniHackEnv) -> str | None:
        w = self.WIDTH
        cells = {r * w + c: ch for r, line in enumerate(env.grid) for c, ch in enumerate(line) if ch not in "|- "}
        boulders = frozenset(k for k, ch in cells.items() if ch == "`")
        # An object lying in a pit is drawn over it once in view; the pit was seen on the premapped
        # start, so a remembered trap square that does not show plain floor is still open.
        seen_traps = {r * w + c for r, c in getattr(env, "traps", ())}
        pits = frozenset(k for k, ch in cells.items() if ch == "^" or (k in seen_traps and ch not in ".@`"))
        goals = [k for k, ch in cells.items() if ch == ">"]
        player = env.agent_pos[0] * w + env.agent_pos[1]
        key = (player, boulders, pits)
        if key not in self.next_word and goals and (boulders, pits) not in self.unsolved:
            pushes = self._solve(set(cells), boulders, pits, player, goals[0])
            if pushes is None:
                self.unsolved.add((boulders, pits))
            else:
                self._remember(set(cells), boulders, pits, player, goals[0], pushes)
        return self.next_word.get(key)

    def _solve(self, floor: set[int], boulders: frozenset[int], pits: frozenset[int], player: int,
               goal: int) -> list[tuple[int, int]] | None:
        deltas = (-self.WIDTH, 1, self.WIDTH, -1)
        nbrs = {c: [c + d for d in deltas if c + d in floor] for c in floor}
        live = set(pits)  # squares from which some push sequence reaches a pit
        queue = deque(pits)
        while queue:
            y = queue.popleft()
            for d in deltas:
                x = y - d
                if x in floor and x - d in floor and x not in live:
                    live.add(x)
                    queue.append(x)

        def region(start: int, bs: frozenset[int], ps: frozenset[int]) -> set[int]:
            seen, stack = {start}, [start]
            while stack:
                for n in nbrs[stack.pop()]:
                    if n not in seen and n not in bs and n not in ps:
                        seen.add(n)
                        stack.append(n)
            return seen

        budget = self.budget
        bs, ps, pl = boulders, pits, player
        plan: list[tuple[int, int]] = []
        while ps:
            start = (bs, ps, min(region(pl, bs, ps)))
            parent: dict[Any, Any] = {start: None}
            frontier = deque([(bs, ps, region(pl, bs, ps), start)])
            found = None
            while frontier and found is None:
                budget -= 1
                if budget < 0:
                    return None
                cbs, cps, reach, key = frontier.popleft()
                n_live = sum(1 for x in cbs if x in live)
                for b in cbs:
                    for d in deltas:
                        t = b + d
                        if b - d not in reach or t not in floor or t in cbs or t == goal:
                            continue
                        if t in cps:
                            nbs, nps = cbs - {b}, cps - {t}
                        else:
                            if t not in live and n_live - (b in live) < len(cps):
                                continue
                            nbs, nps = (cbs - {b}) | {t}, cps
                        nreach = region(b, nbs, nps)
                        nkey = (nbs, nps, min(nreach))
                        if nkey in parent:
                            continue
                        parent[nkey] = (key, (b, d))
                        if len(nps) < len(cps):
                            found = (nbs, nps, b, nkey)
                            break
                        frontier.append((nbs, nps, nreach, nkey))
                    if found:
                        break
            if found is None:
                return None
            bs, ps, pl, key = found
            pushes = []
            while parent[key] is not None:
                key, push = parent[key]
                pushes.append(push)
            plan += pushes[::-1]
        return plan if goal in region(pl, bs, ps) else None

    def _remember(self, floor: set[int], bs: frozenset[int], ps: frozenset[int], pl: int, goal: int,
                  pushes: list[tuple[int, int]]) -> None:
        """Replay the plan as word moves and cache the word to play in every state on the way."""
        if len(self.next_word) > self.max_cached:
            self.next_word.clear()
        words = {-self.WIDTH: "north", 1: "east", self.WIDTH: "south", -1: "west"}
        for b, d in pushes + [(None, 0)]:
            target = goal if b is None else b - d
            for step in self._walk(floor, bs, ps, pl, target):
                self.next_word[(pl, bs, ps)] = words[step]
                pl += step
            if b is None:
                return
            self.next_word[(pl, bs, ps)] = words[d]
            t = b + d
            bs, ps = (bs - {b}, ps - {t}) if t in ps else ((bs - {b}) | {t}, ps)
            pl = b

    def _walk(self, floor: set[int], bs: frozenset[int], ps: frozenset[int], start: int, goal: int) -> list[int]:
        prev: dict[int, int | None] = {start: None}
        queue = deque([start])
        while queue and goal not in prev:
            cur = queue.popleft()
            for d in (-self.WIDTH, 1, self.WIDTH, -1):
                n = cur + d
                if n in floor and n not in prev and n not in bs and n not in ps:
                    prev[n] = cur
                    queue.append(n)
        steps, cur = [], goal
        while prev.get(cur) is not None:
            steps.append(cur - prev[cur])
            cur = prev[cur]
        return steps[::-1]


_sokoban = _SokobanSolver()


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


# -- what the teacher knows of a MiniHack level ----------------------------------------------------

_SEEN = re.compile(r"You see: (.*?)\.?$", re.M)


def monsters_in(obs: str) -> set[str]:
    """Names in a MiniHack observation's 'You see: lichen 1 east; ...' line (the text before the offset)."""
    names = set()
    for line in _SEEN.findall(obs):
        for item in line.split("; "):
            name = re.split(r" \d", item, maxsplit=1)[0].strip()
            if name and name not in ("item", "an item", "item (tool or weapon)"):
                names.add(name)
    return names


def minihack_facts(env: MiniHackEnv, seed: int) -> dict[str, Any]:
    """Play the expert once on `seed` to learn the level (a privileged view a teacher or a checker
    may have, never the actor): the staircase's offset from the start (None if the expert never saw
    it), monsters met, traps seen, actions the expert needed. Leaves the env mid-reset: reset it."""
    obs, _ = env.reset(seed=seed)
    monsters = monsters_in(obs)
    n, info = 0, {}
    while True:
        obs, _, term, trunc, info = env.step(expert_action(env))
        n += 1
        monsters |= monsters_in(obs)
        if term or trunc:
            break
    offset = None
    if env.stairs_pos is not None:
        offset = (env.stairs_pos[0] - env.start_pos[0], env.stairs_pos[1] - env.start_pos[1])
    return {"offset": offset, "monsters": sorted(monsters), "traps": len(env.traps), "expert_actions": n,
            "expert_success": bool(info.get("success"))}

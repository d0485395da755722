"""Real MiniHack (NetHack Learning Environment) behind the TextEnv protocol.

    env = make_minihack("Room-5x5")
    obs, info = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step("southeast")

The observation is text: the message line, the map (NetHack's own characters, cropped to what has
been seen), a legend of the characters on it, and optionally a plain-language description of what
is next to the agent and where the goal and other things are. Besides the text, the env keeps a
structured view of the level (`grid`, `agent_pos`, `monsters`, `open_doors`, `blocked`, `has_key`)
for the scripted expert in envs/experts.py.

One gym env is built per TextEnv and reused across resets: NetHack's make is ~20 ms, a reset ~2 ms.
"""
from __future__ import annotations

import random
import re
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.base import EnvError

# minihack imports pkg_resources at import time, which warns on every process start; the warning
# says nothing a user of this env can act on.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import gymnasium as gym
    import minihack  # noqa: F401  (registers the MiniHack-* gym ids)
    from nle import nethack

ROWS, COLS = 21, 79  # NetHack's map area (the `chars` observation)
BLANK = ord(" ")


@dataclass(frozen=True)
class TaskSpec:
    gym_id: str
    goal: str
    max_turns: int


TASKS: dict[str, TaskSpec] = {
    "Room-5x5": TaskSpec(
        "MiniHack-Room-5x5-v0",
        "Reach the staircase down (>) in a lit 5x5 room.",
        50,
    ),
    # Room-5x5 always starts the agent and the stairs on the same squares (every seed is one episode);
    # Room-Random-5x5 draws both per seed: the lit-room task a policy cannot solve by memorising.
    "Room-Random-5x5": TaskSpec(
        "MiniHack-Room-Random-5x5-v0",
        "Reach the staircase down (>) in a lit 5x5 room; you and the stairs start on random squares.",
        50,
    ),
    "Room-Ultimate-5x5": TaskSpec(
        "MiniHack-Room-Ultimate-5x5-v0",
        "Reach the staircase down (>) in a dark 5x5 room that also holds a monster and a hidden trap; "
        "you only see the squares next to you.",
        50,
    ),
    "MazeWalk-9x9": TaskSpec(
        "MiniHack-MazeWalk-9x9-v0",
        "Find and reach the staircase down (>) in a dark 9x9 maze; you only see the squares next to you.",
        100,
    ),
    "KeyRoom-S5": TaskSpec(
        "MiniHack-KeyRoom-S5-v0",
        "Pick up the key, unlock the locked door of the small inner room with it (stand next to the door "
        "and apply the key), and reach the staircase down (>) inside.",
        100,
    ),
    "Sokoban": TaskSpec(
        "MiniHack-Sokoban1a-v1",
        "Push the boulders (`) into every hole (^) to clear the way, then reach the staircase down (>).",
        400,
    ),
}

# Word -> NLE action. A task exposes only the words whose action is in its gym env's action set.
DIRECTIONS: dict[str, nethack.CompassDirection] = {
    "north": nethack.CompassDirection.N,
    "east": nethack.CompassDirection.E,
    "south": nethack.CompassDirection.S,
    "west": nethack.CompassDirection.W,
    "northeast": nethack.CompassDirection.NE,
    "southeast": nethack.CompassDirection.SE,
    "southwest": nethack.CompassDirection.SW,
    "northwest": nethack.CompassDirection.NW,
}
# (d_row, d_col) of each direction on the map.
DELTAS: dict[str, tuple[int, int]] = {
    "north": (-1, 0), "east": (0, 1), "south": (1, 0), "west": (0, -1),
    "northeast": (-1, 1), "southeast": (1, 1), "southwest": (1, -1), "northwest": (-1, -1),
}
_SHORT = {"n": "north", "e": "east", "s": "south", "w": "west",
          "ne": "northeast", "se": "southeast", "sw": "southwest", "nw": "northwest"}

# NetHack's defsym indices (display.h) for the terrain the expert must tell apart.
_CMAP_WALLS = set(range(0, 12)) | {17, 18}  # stone, walls and corners, iron bars, tree
_CMAP_OPEN_DOORS = {13, 14}  # open doors: no diagonal moves in or out
_CMAP_CLOSED_DOORS = {15, 16}

# What a character means when no live screen description is available (remembered cells).
_FALLBACK_LEGEND = {
    ".": "floor", "#": "corridor", "|": "wall or open door", "-": "wall or open door",
    "+": "closed door", ">": "staircase down (the goal)", "<": "staircase up",
    "^": "trap or hole", "`": "boulder", "(": "item (tool or weapon)", "{": "fountain",
}


_OUTCOMES = {
    "success": "You reached the goal: the task is complete.",
    "death": "You died: the episode is over.",
    "aborted": "NetHack ended the episode.",
    "running": "The episode is over.",
}

# Object classes worth pointing out (tools, weapons, armour, food, scrolls, potions, wands, rings...).
_ITEM_CODES = [ord(ch) for ch in "()[%?!/=\"*$"]


def _decode(arr: np.ndarray) -> str:
    return bytes(arr).split(b"\0", 1)[0].decode("latin-1")


def _is_monster(glyph: int) -> bool:
    return bool(nethack.glyph_is_monster(glyph) or nethack.glyph_is_invisible(glyph) or nethack.glyph_is_warning(glyph))


def _relative(dr: int, dc: int) -> str:
    """'2 north and 1 east' for a map offset (rows grow southwards)."""
    parts = []
    if dr:
        parts.append(f"{abs(dr)} {'south' if dr > 0 else 'north'}")
    if dc:
        parts.append(f"{abs(dc)} {'east' if dc > 0 else 'west'}")
    return " and ".join(parts) if parts else "here"


def heading_word(dr: int, dc: int) -> str:
    """The compass word of one step toward a map offset: 'northeast' for (-2, 1); '' for (0, 0)."""
    return ("south" if dr > 0 else "north" if dr < 0 else "") + ("east" if dc > 0 else "west" if dc < 0 else "")


def first_heading(dr: int, dc: int) -> str:
    """The one heading that, walked until the target is next to you (a dark room shows only adjacent squares),
    brings it into view: along the longer axis when the other is at most 1 ('south' for (3, 1)), else the
    diagonal ('southeast' for (3, 2) and (2, 2); walking a diagonal cuts both distances until they differ
    by at most 1). A reader of a lesson needs only to repeat one word until the observation names the step."""
    if min(abs(dr), abs(dc)) <= 1 and abs(dr) != abs(dc):
        return heading_word(dr, 0) if abs(dr) > abs(dc) else heading_word(0, dc)
    return heading_word(dr, dc)


def stairs_sentence(dr: int, dc: int) -> str:
    """'the staircase down (>) was 2 south and 0 east of your starting square; from the start, head south':
    the debrief's words, which a lesson about the level repeats (a contiguous span a small model can copy)
    and `claimed_offset` reads back. Both axes are always named (a zero as '0 south' / '0 east'), so the
    sentence has the same shape, and the same number of tokens, for every level: a tiny extractor then
    copies it by position (the token so many places back), which it learns in a few hundred steps, where
    copying by content (an induction head) had not formed after 1,000. The heading comes last: in the
    actor's prompt the entry ends right before its answer, where a tiny model learns to copy first."""
    if (dr, dc) == (0, 0):
        return "the staircase down (>) was on your starting square"
    rows = f"{abs(dr)} {'north' if dr < 0 else 'south'}"
    cols = f"{abs(dc)} {'west' if dc < 0 else 'east'}"
    return f"the staircase down (>) was {rows} and {cols} of your starting square; from the start, head {first_heading(dr, dc)}"


_OFFSET = r"(?:(\d+) (north|south)(?: and (\d+) (east|west))?|(\d+) (east|west))"
_CLAIM = re.compile(r"stair\w*(?: down)?(?: \(>\))? (?:is|was|lies|lay) " + _OFFSET +
                    r" of (?:the|your) (?:square where you start\w*|start\w*(?: square)?)", re.I)


def claimed_offset(text: str) -> tuple[int, int] | None:
    """Where an entry says the staircase lies from the start, as (d_row, d_col); None if it says nothing
    of the kind. Reads the phrasing of the env's debrief ('2 south and 1 east of your starting square')."""
    m = _CLAIM.search(text or "")
    if not m:
        return None
    n1, d1, n2, d2, n3, d3 = m.groups()
    dr = dc = 0
    if n1:
        dr = int(n1) * (1 if d1.lower() == "south" else -1)
        if n2:
            dc = int(n2) * (1 if d2.lower() == "east" else -1)
    else:
        dc = int(n3) * (1 if d3.lower() == "east" else -1)
    return dr, dc


class MiniHackEnv:
    """One MiniHack task as a TextEnv. Build it with `make_minihack`."""

    def __init__(self, task: str, max_turns: int | None = None, describe: bool = True) -> None:
        if task not in TASKS:
            raise EnvError(f"unknown MiniHack task {task!r}; known tasks: {', '.join(TASKS)}")
        self.spec = TASKS[task]
        self.task_name = task
        self.name = f"minihack/{task}"
        self.task = self.spec.goal
        self.max_turns = int(max_turns if max_turns is not None else self.spec.max_turns)
        self.describe = describe
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._gym = gym.make(
                self.spec.gym_id,
                observation_keys=("chars", "glyphs", "message", "blstats", "inv_strs", "screen_descriptions"),
            ).unwrapped
        # Our own turn limit decides truncation; NLE's must never fire first (one word action can
        # take two NetHack steps, e.g. "open north").
        self._gym._max_episode_steps = self.max_turns * 4 + 10
        self._actions: list[int] = [int(a) for a in self._gym.actions]
        self._words = self._build_vocabulary()
        self.admissible_actions = list(self._words)
        self.action_format = self._action_format()
        self._rng = random.Random()
        self._obs: dict[str, np.ndarray] = {}
        self._memory = np.full((ROWS, COLS), BLANK, dtype=np.uint8)
        self._grid = self._memory.copy()  # memory with monsters and '@' drawn in: what the map shows
        self._turns = 0
        self._done = True
        # Structured view for the scripted expert.
        self.grid: list[str] = []
        self.agent_pos: tuple[int, int] = (0, 0)
        self.monsters: set[tuple[int, int]] = set()
        self.open_doors: set[tuple[int, int]] = set()
        self.closed_doors: set[tuple[int, int]] = set()
        self.traps: set[tuple[int, int]] = set()
        self.blocked: set[tuple[int, int]] = set()
        self.has_key = False
        self.start_pos: tuple[int, int] = (0, 0)
        self.stairs_pos: tuple[int, int] | None = None  # where '>' was first seen this episode

    # ---------------------------------------------------------------- vocabulary

    def _build_vocabulary(self) -> dict[str, tuple[int, ...]]:
        """Admissible word actions -> the NLE key sequence each one sends."""
        have = set(self._actions)
        words: dict[str, tuple[int, ...]] = {w: (int(a),) for w, a in DIRECTIONS.items() if int(a) in have}
        if int(nethack.Command.PICKUP) in have:
            words["pick up"] = (int(nethack.Command.PICKUP),)
        if int(nethack.Command.APPLY) in have:
            # MiniHack's KeyRoom turns APPLY into "use the key on the adjacent closed door".
            words["apply key"] = (int(nethack.Command.APPLY),)
        if int(nethack.Command.OPEN) in have:
            for w, a in DIRECTIONS.items():
                words[f"open {w}"] = (int(nethack.Command.OPEN), int(a))
        return words

    def _action_format(self) -> str:
        dirs = [w for w in DIRECTIONS if w in self._words]
        text = (
            f"Answer with one action per turn. Move one square with a compass direction: {', '.join(dirs)} "
            "(moving into a monster attacks it; moving into a boulder pushes it)."
        )
        if "pick up" in self._words:
            text += " 'pick up' takes the item you stand on."
        if "apply key" in self._words:
            text += " 'apply key' uses a key you carry on a locked door next to you (you may add the door's direction, e.g. 'apply key west')."
        if "open north" in self._words:
            text += " 'open <direction>' opens a closed door next to you, e.g. 'open west'."
        return text + f" Other words are not actions. You have {self.max_turns} turns."

    def parse(self, action: str) -> str | None:
        """Normalise an action text to an admissible word action, or None."""
        a = re.sub(r"[^a-z ]", " ", action.lower())
        a = " ".join(a.split())
        for prefix in ("go ", "move ", "walk "):
            if a.startswith(prefix):
                a = a[len(prefix):]
        a = _SHORT.get(a, a)
        if a in self._words:
            return a
        if a in ("pickup", "pick", "take") or a.startswith(("pick up ", "pickup ", "take ")):
            return "pick up" if "pick up" in self._words else None
        if a == "apply" or a.startswith("apply "):
            return "apply key" if "apply key" in self._words else None
        if a.startswith("open "):
            rest = a.split()[1:]
            dirs = [_SHORT.get(w, w) for w in rest if _SHORT.get(w, w) in DIRECTIONS]
            if dirs and f"open {dirs[-1]}" in self._words:
                return f"open {dirs[-1]}"
        return None

    # ---------------------------------------------------------------- protocol

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        del options  # no per-episode options: the task fixes the level generator
        s = seed if seed is not None else self._rng.randrange(2**31)
        # NLE draws the level from its core/disp seeds; reseed=False stops NetHack from mixing in
        # fresh entropy later, so one seed gives one map and one sequence of monster moves.
        self._gym.seed(core=s, disp=s, reseed=False)
        obs, _ = self._gym.reset()
        self._memory.fill(BLANK)
        self.blocked = set()
        self.open_doors = set()
        self.traps = set()
        self._turns = 0
        self._done = False
        self.stairs_pos = None
        self._absorb(obs)
        self.start_pos = self.agent_pos
        return self._render(), {"admissible_actions": list(self.admissible_actions), "turn": 0}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("step() after the episode ended; call reset()")
        self._turns += 1
        word = self.parse(action)
        info: dict[str, Any] = {"admissible_actions": list(self.admissible_actions), "turn": self._turns}
        if word is None:
            info["invalid_action"] = True
            text = (
                f"'{action.strip()[:60]}' is not a valid action here. Valid actions: "
                f"{', '.join(self.admissible_actions)}.\n\n"
            )
            reward, terminated = 0.0, False
        else:
            before = self.agent_pos
            reward, terminated, status = self._send(word)
            self._note_bump(word, before)
            info["end_status"] = status
            text = ""
        truncated = not terminated and self._turns >= self.max_turns
        outcome = ""
        if terminated or truncated:
            self._done = True
            info["success"] = bool(terminated and info.get("end_status") == "success")
            outcome = _OUTCOMES.get(info["end_status"], "") if terminated else "Out of turns: the episode is over."
            outcome += " " + self.debrief()
        # After an invalid action NetHack did not move, so its message line is from the turn before.
        text += self._render(outcome, show_message=word is not None)
        return text, float(reward), bool(terminated), bool(truncated), info

    def close(self) -> None:
        self._gym.close()

    # ---------------------------------------------------------------- internals

    def _send(self, word: str) -> tuple[float, bool, str]:
        """Play one word action as its NLE key sequence; returns (reward, terminated, end status)."""
        total = 0.0
        terminated = False
        end = self._gym.StepStatus.RUNNING
        for key in self._words[word]:
            obs, reward, terminated, _, info = self._gym.step(self._actions.index(key))
            total += float(reward)
            end = info.get("end_status", end)
            # NetHack's screen after the game is over is all zeros: keep the last real view.
            if obs["chars"].any():
                self._absorb(obs)
            if terminated:
                break
        status = {
            self._gym.StepStatus.TASK_SUCCESSFUL: "success",
            self._gym.StepStatus.DEATH: "death",
            self._gym.StepStatus.ABORTED: "aborted",
        }.get(end, "running")
        return total, bool(terminated), status

    def _absorb(self, obs: dict[str, np.ndarray]) -> None:
        """Update the remembered map and the structured view from one NLE observation."""
        # NLE reuses its observation buffers, so keep a copy of the state we describe.
        obs = {k: v.copy() for k, v in obs.items()}
        self._obs = obs
        chars, glyphs = obs["chars"], obs["glyphs"]
        col, row = int(obs["blstats"][0]), int(obs["blstats"][1])
        self.agent_pos = (row, col)
        # A level shows ~10 distinct glyphs: classify those, then broadcast with isin.
        kinds = np.unique(glyphs)
        monster = np.isin(glyphs, [g for g in kinds if _is_monster(int(g))])
        # Remember terrain and items, never monsters (they move) and never blanks (a dark room
        # forgets what is out of sight, but the squares are still there).
        keep = (chars != BLANK) & ~monster
        self._memory[keep] = chars[keep]
        if self._memory[row, col] == BLANK:
            self._memory[row, col] = ord(".")
        self.monsters = {(int(r), int(c)) for r, c in zip(*np.nonzero(monster)) if (r, c) != (row, col)}
        cmap = np.where(np.isin(glyphs, [g for g in kinds if nethack.glyph_is_cmap(int(g))]),
                        glyphs - nethack.GLYPH_CMAP_OFF, -1)
        self.open_doors |= {(int(r), int(c)) for r, c in zip(*np.nonzero(np.isin(cmap, list(_CMAP_OPEN_DOORS))))}
        self.closed_doors = {(int(r), int(c)) for r, c in zip(*np.nonzero(np.isin(cmap, list(_CMAP_CLOSED_DOORS))))}
        self.open_doors -= self.closed_doors
        is_trap = np.isin(glyphs, [g for g in kinds if nethack.glyph_is_trap(int(g))])
        self.traps |= {(int(r), int(c)) for r, c in zip(*np.nonzero(is_trap))}
        walls = np.isin(cmap, list(_CMAP_WALLS)) & (chars != BLANK)
        self.blocked |= {(int(r), int(c)) for r, c in zip(*np.nonzero(walls))}
        grid = self._memory.copy()
        for r, c in self.monsters:
            grid[r, c] = chars[r, c]
        grid[row, col] = ord("@")
        self._grid = grid
        self.grid = [bytes(line).decode("latin-1") for line in grid]
        self.has_key = any("key" in _decode(line) for line in obs["inv_strs"])
        if self.stairs_pos is None:
            seen = np.argwhere(self._memory == ord(">"))
            if len(seen):
                self.stairs_pos = (int(seen[0][0]), int(seen[0][1]))

    def debrief(self) -> str:
        """The episode's last line: where the staircase was from the start (what a lesson about this
        level would say), in the words `claimed_offset` reads. A dark room's agent never learns its
        own coordinates, so without this line no one reading the trajectory could state the offset."""
        if self.stairs_pos is None:
            return "Debrief: you never saw the staircase down (>)."
        dr, dc = self.stairs_pos[0] - self.start_pos[0], self.stairs_pos[1] - self.start_pos[1]
        return f"Debrief: {stairs_sentence(dr, dc)}."

    def _note_bump(self, word: str, before: tuple[int, int]) -> None:
        """A move that left us in place ran into something solid: remember it for planning."""
        if word not in DELTAS or self.agent_pos != before:
            return
        dr, dc = DELTAS[word]
        target = (before[0] + dr, before[1] + dc)
        msg = self.message.lower()
        if target not in self.monsters and ("solid stone" in msg or "wall" in msg or not msg):
            self.blocked.add(target)

    @property
    def underfoot(self) -> str:
        """The remembered character under the agent (the map shows '@' there)."""
        return chr(self._memory[self.agent_pos])

    @property
    def message(self) -> str:
        return _decode(self._obs["message"]).strip() if self._obs else ""

    def _description_at(self, r: int, c: int) -> str:
        return _decode(self._obs["screen_descriptions"][r, c])

    def _render(self, outcome: str = "", show_message: bool = True) -> str:
        """The observation text; at the episode's end `outcome` replaces the surroundings."""
        nz = np.argwhere(self._grid != BLANK)
        (r0, c0), (r1, c1) = nz.min(0), nz.max(0)
        lines = [self.grid[r][c0:c1 + 1].rstrip() for r in range(r0, r1 + 1)]
        parts = []
        msg = self.message if show_message else ""
        if msg:
            parts.append(f"Message: {msg}")
        parts.append("Map:\n" + "\n".join(lines))
        parts.append("Legend: " + "; ".join(f"{ch} {what}" for ch, what in self._legend()))
        hp, hp_max = int(self._obs["blstats"][10]), int(self._obs["blstats"][11])
        status = f"HP {hp}/{hp_max}. Turn {self._turns} of {self.max_turns}."
        if self.has_key:
            status += " You carry a key."
        parts.append(status)
        if outcome:
            parts.append(outcome)
        elif self.describe:
            parts.append(self._describe_surroundings())
        return "\n".join(parts)

    def _live_names(self, code: int, limit: int = 4) -> list[str]:
        """Screen descriptions of up to `limit` cells currently showing character `code`."""
        shown = np.argwhere((self._grid == code) & (self._obs["chars"] == code))
        names = {self._description_at(int(r), int(c)) for r, c in shown[:limit] if (r, c) != self.agent_pos}
        return sorted(n for n in names if n and n != "dark part of a room")

    def _legend(self) -> list[tuple[str, str]]:
        out = [("@", "you")]
        for code in np.unique(self._grid):
            ch = chr(code)
            if ch == " ":
                continue
            if ch == ">":
                out.append((ch, "staircase down (the goal)"))
                continue
            live = self._live_names(int(code))
            if ch == "@" and not live:
                continue  # the agent itself, already listed as "you"
            out.append((ch, " or ".join(live[:2]) or _FALLBACK_LEGEND.get(ch, "something")))
        return out

    def _describe_surroundings(self) -> str:
        ar, ac = self.agent_pos
        adjacent = []
        for word, (dr, dc) in DELTAS.items():
            r, c = ar + dr, ac + dc
            if not (0 <= r < ROWS and 0 <= c < COLS):
                continue
            d = self._description_at(r, c)
            if d and d not in ("floor of a room", "dark part of a room", "stone"):
                adjacent.append(f"{word}: {d}")
        text = "Next to you: " + ("; ".join(adjacent) if adjacent else "nothing but floor") + "."
        goals = np.argwhere(self._grid == ord(">"))
        if len(goals):
            r, c = (int(v) for v in goals[0])
            text += f" The staircase down (>) is {_relative(r - ar, c - ac)} of you"
            text += f" (a step {heading_word(r - ar, c - ac)} brings you closer)." if (r, c) != (ar, ac) else "."
        else:
            text += " You have not seen the staircase down (>) yet."
        sights = [f"{self._description_at(r, c) or 'a monster'} {_relative(r - ar, c - ac)}"
                  for r, c in sorted(self.monsters)]
        for r, c in np.argwhere(np.isin(self._grid, _ITEM_CODES)):
            r, c = int(r), int(c)
            ch = chr(self._grid[r, c])
            what = self._description_at(r, c) if self._obs["chars"][r, c] == self._grid[r, c] else ""
            sights.append(f"{what or _FALLBACK_LEGEND.get(ch, 'an item')} {_relative(r - ar, c - ac)}")
        if sights:
            text += " You see: " + "; ".join(sights[:6]) + "."
        return text


def make_minihack(task: str, max_turns: int | None = None, describe: bool = True, **options: Any) -> MiniHackEnv:
    """Build a MiniHack TextEnv. `task` is one of TASKS; unknown options are an error, not ignored."""
    if options:
        raise EnvError(f"make_minihack got unknown options {sorted(options)}; it accepts task, max_turns, describe")
    return MiniHackEnv(task, max_turns=max_turns, describe=describe)

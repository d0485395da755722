"""The ALFWorld text env: `AlfworldEnv` on the real engine, with its world view and action normalisation."""
from __future__ import annotations

import json
import os
import random
import re
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.base import EnvError
from envs.alfworld.generation import (
    ACTION_FORMAT, generate_instance, Goal, Instance, load_priors, prior_hint, PRIORS_PATH, TASK_TYPES,
)
from envs.alfworld.pddl import _official_goal, _official_root, _writable_dir, official_game_files, write_game
from envs.alfworld.speedups import _install_lib_pool, _install_speedups, _LIB_POOL, set_disk_cache_dir

# ---------------------------------------------------------------------------------------------
# The text env
# ---------------------------------------------------------------------------------------------


@dataclass
class WorldView:
    """The game state as the expert reads it (names as the game shows them)."""

    receptacles: list[str]  # sorted by type, then number ("cabinet 1", "cabinet 2", "countertop 1")
    here: set[str]  # receptacles at the agent's location
    holding: str | None
    contents: dict[str, list[str]]  # receptacle -> objects in it
    where: dict[str, str]  # object -> receptacle
    kind: dict[str, str]  # object or receptacle -> type ("apple", "countertop")
    openable: set[str]
    opened: set[str]
    props: dict[str, set[str]]  # object -> {"isclean", "ishot", "iscool", "istoggled"}


_ALIASES = (
    # Older ALFWorld releases (and most published prompts) say "put X in/on Y"; 0.4 says "move X to Y".
    (re.compile(r"^(?:put|place) (.+?) (?:in/on|into|in|on|onto) (.+)$"), "move {0} to {1}"),
    (re.compile(r"^(?:goto|go) (?!to )(.+)$"), "go to {0}"),
    (re.compile(r"^(?:pick up|pickup|get) (.+?) from (.+)$"), "take {0} from {1}"),
    (re.compile(r"^(?:turn on|toggle) (.+)$"), "use {0}"),
)


def normalise_action(action: str) -> str:
    """Lower-case, single spaces, no trailing period; map common synonyms to the game's verbs."""
    text = " ".join(action.strip().lower().split()).rstrip(".!").strip()
    for pattern, form in _ALIASES:
        m = pattern.match(text)
        if m:
            return form.format(*m.groups())
    return text


class AlfworldEnv:
    """One ALFWorld task type (or all of them) behind the TextEnv protocol."""

    action_format = ACTION_FORMAT
    keep_intro = True  # the first observation lists the room's receptacles; nothing later does

    def __init__(self, task_type: str = "all", *, split: str | None = None, data_dir: str | None = None,
                 max_turns: int = 50, cache_dir: str | os.PathLike[str] | None = None,
                 priors_path: str | os.PathLike[str] | None = None) -> None:
        if task_type != "all" and task_type not in TASK_TYPES:
            raise EnvError(f"unknown ALFWorld task type {task_type!r}; use one of {', '.join(TASK_TYPES)} or 'all'")
        if max_turns <= 0:
            raise EnvError(f"max_turns must be positive, got {max_turns}")
        self.task_type = task_type
        self.task_types = TASK_TYPES if task_type == "all" else (task_type,)
        self.name = f"alfworld/{task_type}"
        self.max_turns = int(max_turns)
        self.split = split
        self.priors = load_priors(priors_path or PRIORS_PATH)
        self.task = ""
        self.official_games: list[Path] | None = None  # with `split`: the split's game files
        self._solvable_memo: dict[Path, bool] = {}
        if split is not None:
            self.official_games = official_game_files(_official_root(data_dir), split, self.task_types)
        self.cache_dir = _writable_dir(Path(cache_dir) if cache_dir else None)
        self._tw = None  # the textworld env, started on first reset
        self._release_lib: Any = lambda: None  # returns the env's library copy to _LIB_POOL
        self.game_file: Path | None = None  # the .tw-pddl file being played
        self.world: WorldView | None = None  # the game state as facts, refreshed every step (for experts)
        self._state: Any = None
        self._rng = random.Random()
        self.instance: Instance | None = None
        self.goal: Goal | None = None
        self.turns = 0
        self.done = True
        self.observed: set[str] = set()  # receptacles whose contents the agent has seen this episode
        self.history: list[tuple[str, str]] = []  # (action, observation); the first has action ""
        self.listing: list[str] = []  # receptacles in the order the first observation names them

    # -- protocol ------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if seed is None:
            seed = self._rng.randrange(2**31)
        seed = int(seed)
        game = self._game_for(seed)
        self._start(game)
        self.turns = 0
        self.done = False
        self.observed = set()
        obs = self._state.feedback.strip()
        self.task = _task_text(obs)
        self.history = [("", obs)]
        self.world = self._read_view()
        self.listing = _listing(obs, self.world.receptacles)
        return obs, self._info(invalid=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done:
            raise RuntimeError(f"{self.name}: the episode is over; call reset() first")
        self.turns += 1
        command = normalise_action(action)
        admissible = list(self._state.admissible_commands)
        if command in admissible:
            self._state, _, _ = self._tw.step(command)
            obs = self._state.feedback.strip()
            self.world = self._read_view()
            self._note_observed(command)
            invalid = False
        else:
            obs = self._invalid_feedback(action, admissible)
            invalid = True
        won = bool(self._state["won"])
        terminated = won
        truncated = not won and self.turns >= self.max_turns
        self.done = terminated or truncated
        self.history.append((action, obs))
        return obs, (1.0 if won else 0.0), terminated, truncated, self._info(invalid=invalid)

    def close(self) -> None:
        if self._tw is not None:
            self._tw.close()
            self._tw = None
            self.game_file = None
            self._state = None
        # Hand the env's copy of fast-downward's library back to the process pool (never
        # dlclosed: see _DownwardLibPool).
        self._release_lib()
        self.done = True

    # -- hints ---------------------------------------------------------------------------------

    def placement_hint(self) -> str:
        """The prior for the current task's object (and light), phrased as an experience entry would."""
        if self.goal is None:
            raise RuntimeError("placement_hint() needs a task: call reset() first")
        hint = prior_hint(self.goal.object_type, self.priors)
        if self.goal.toggle_type:
            hint += " " + prior_hint(self.goal.toggle_type, self.priors)
        return hint

    # -- internals -----------------------------------------------------------------------------

    def _game_for(self, seed: int) -> Path:
        if self.official_games is not None:
            # Like AlfredTWEnv, play only games marked solvable; skip forward deterministically.
            n = len(self.official_games)
            for k in range(n):
                game = self.official_games[(seed + k) % n]
                if self._solvable(game):
                    self.instance = None
                    self.goal = _official_goal(game)
                    return game
            raise EnvError(f"none of the {n} ALFWorld games for {self.name} is marked solvable; "
                           "regenerate them with `alfworld-generate`")
        inst = self.instance_for(seed)
        self.instance = inst
        self.goal = inst.goal
        return write_game(inst, self.cache_dir)

    def instance_for(self, seed: int) -> Instance:
        """The generated household `reset(seed=seed)` plays (its task type drawn from the seed under alfworld/all), a
        pure function of the seed: what a checker reads a household's initial placements from without the engine."""
        if self.official_games is not None:
            raise EnvError(f"{self.name} plays official ALFWorld games (split={self.split!r}); only generated "
                           "households have an Instance")
        seed = int(seed)
        task_type = self.task_types[random.Random(f"comprl-alfworld/type/{seed}").randrange(len(self.task_types))]
        return generate_instance(task_type, seed, self.priors)

    def _solvable(self, game: Path) -> bool:
        if game not in self._solvable_memo:
            try:
                self._solvable_memo[game] = bool(json.loads(game.read_text()).get("solvable", False))
            except (OSError, ValueError):
                self._solvable_memo[game] = False
        return self._solvable_memo[game]

    def _start(self, game: Path) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler

        _install_speedups()
        set_disk_cache_dir(self.cache_dir)
        infos = textworld.EnvInfos(won=True, admissible_commands=True)
        if self._tw is None:
            _install_lib_pool()
            self._tw = textworld.start(str(game), request_infos=infos, wrappers=[AlfredDemangler])
            # The copy goes back to the pool on close(), or when the env is collected unclosed.
            self._release_lib = weakref.finalize(self, _LIB_POOL.release, self._tw.unwrapped.downward_lib)
            self._release_lib.atexit = False
        elif self.game_file != game:
            # Reuse the env (and its copy of fast-downward's library); only the game changes.
            self._tw.load(str(game))
        self.game_file = game
        self._state = self._tw.reset()

    def _read_view(self) -> WorldView:
        infos = self._state["_entity_infos"]
        name = {k: v.name.strip() for k, v in infos.items()}
        kind: dict[str, str] = {}
        recep_loc: dict[str, str] = {}
        contents: dict[str, list[str]] = {}
        where: dict[str, str] = {}
        openable, opened, holding, agent_loc = set(), set(), None, None
        props: dict[str, set[str]] = {}
        for fact in self._state["_facts"]:
            args = [a.name for a in fact.arguments]
            p = fact.name
            if p == "receptacleatlocation":
                recep_loc[name[args[0]]] = args[1]
            elif p == "atlocation":
                agent_loc = args[1]
            elif p == "inreceptacle":
                contents.setdefault(name[args[1]], []).append(name[args[0]])
                where[name[args[0]]] = name[args[1]]
            elif p in ("objecttype", "receptacletype"):
                kind[name[args[0]]] = name[args[1]].removesuffix("type")
            elif p == "openable":
                openable.add(name[args[0]])
            elif p == "opened":
                opened.add(name[args[0]])
            elif p == "holds":
                holding = name[args[1]]
            elif p in ("isclean", "ishot", "iscool", "istoggled"):
                props.setdefault(name[args[0]], set()).add(p)
        for objs in contents.values():
            objs.sort(key=_name_key)
        receptacles = sorted(recep_loc, key=_name_key)
        here = {r for r, l in recep_loc.items() if l == agent_loc}
        return WorldView(receptacles, here, holding, contents, where, kind, openable, opened, props)

    def _note_observed(self, command: str) -> None:
        """Record which receptacles' contents the agent has now seen (the prior expert's knowledge)."""
        view = self.world
        for recep in view.here:
            named = re.search(rf"\b{re.escape(recep)}(?!\d)", command) is not None
            if named and (recep not in view.openable or recep in view.opened):
                self.observed.add(recep)

    def _invalid_feedback(self, action: str, admissible: list[str]) -> str:
        examples = [a for a in admissible if a not in ("help", "look", "inventory")][:4] or admissible[:4]
        return (f"Nothing happens. \"{action.strip()}\" is not an action the game accepts here. Valid forms: "
                "go to X, open X, close X, take O from X, move O to X, heat O with X, cool O with X, "
                "clean O with X, use X, examine X, look, inventory; valid now, for example: "
                + "; ".join(examples) + ".")

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        won = bool(self._state["won"])
        return {
            "admissible_actions": list(self._state.admissible_commands),
            "invalid_action": invalid,
            "success": won,
            "won": won,
            "task_type": self.goal.task_type if self.goal else self.task_type,
            "turn": self.turns,
        }


def _name_key(name: str) -> tuple[str, int]:
    kind, _, number = name.rpartition(" ")
    return (kind, int(number)) if number.isdigit() else (name, 0)


def _listing(intro: str, receptacles: list[str]) -> list[str]:
    """The receptacles in the order the intro names them ("you see a cabinet 2, a cabinet 1, ..."),
    then any it does not name, in name order."""
    m = re.search(r"you see (.*?)\.\s*(?:\n|$)", intro)
    named = [re.sub(r"^(?:and )?an? ", "", part.strip()) for part in m.group(1).split(",")] if m else []
    known = set(receptacles)
    order = [r for r in dict.fromkeys(named) if r in known]
    return order + [r for r in receptacles if r not in set(order)]


def _task_text(intro: str) -> str:
    marker = "Your task is to:"
    if marker in intro:
        return intro.split(marker, 1)[1].strip()
    return intro.strip().splitlines()[-1]

"""Env names -> factories (a plain dict, DESIGN.md habit 8). Imports are lazy so that listing envs
never loads NetHack, TextWorld or a WebShop client."""
from __future__ import annotations

import importlib
from typing import Any, Callable

from envs.base import TextEnv

ALFWORLD_TASK_TYPES = (
    "pick_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "pick_two_obj",
)


def _lazy(module: str, func: str, **bound: Any) -> Callable[..., TextEnv]:
    def factory(**options: Any) -> TextEnv:
        return getattr(importlib.import_module(module), func)(**{**bound, **options})

    return factory


ENVS: dict[str, Callable[..., TextEnv]] = {
    "minihack/Room-5x5": _lazy("envs.minihack", "make_minihack", task="Room-5x5"),
    "minihack/Room-Random-5x5": _lazy("envs.minihack", "make_minihack", task="Room-Random-5x5"),
    "minihack/Room-Ultimate-5x5": _lazy("envs.minihack", "make_minihack", task="Room-Ultimate-5x5"),
    "minihack/MazeWalk-9x9": _lazy("envs.minihack", "make_minihack", task="MazeWalk-9x9"),
    "minihack/KeyRoom-S5": _lazy("envs.minihack", "make_minihack", task="KeyRoom-S5"),
    "minihack/Sokoban": _lazy("envs.minihack", "make_minihack", task="Sokoban"),
    **{f"alfworld/{t}": _lazy("envs.alfworld", "make_alfworld", task_type=t) for t in ALFWORLD_TASK_TYPES},
    "alfworld/all": _lazy("envs.alfworld", "make_alfworld", task_type="all"),
    "webshop": _lazy("envs.webshop", "make_webshop"),
    "swe/local": _lazy("envs.swe", "make_swe_local"),
    "swe/bench": _lazy("envs.swe", "make_swe_bench"),
}


def list_envs() -> list[str]:
    return sorted(ENVS)


def make_env(name: str, **options: Any) -> TextEnv:
    """Build a registered env; an unknown name lists the known ones."""
    if name not in ENVS:
        raise KeyError(f"unknown env {name!r}; known envs: {', '.join(list_envs())}")
    return ENVS[name](**options)

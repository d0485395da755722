"""ALFWorld household tasks on the real ALFWorld text engine (TextWorld's PDDL backend).

Every game here is played by the same machinery ALFWorld's own `AlfredTWEnv` uses: a
`.tw-pddl` JSON file holding the `alfred.pddl` domain, the `alfred.twl2` grammar (its goal
placeholder replaced by the task text) and a PDDL problem, loaded by `textworld.start` with
`AlfredDemangler` so entities read "apple 1", "countertop 2".

Measured on a busy 2-core CPU: a new instance's first reset ~0.5 s (fast-downward translates the
PDDL problem), a reset of a cached instance ~0.03-0.08 s, a step ~0.01-0.02 s.

Two sources of problems:

- generated (the default, fully offline): `reset(seed=s)` builds household instance s of the
  task type deterministically: a scene (kitchen, bathroom, bedroom, living room) with numbered
  receptacles, objects placed by the placement priors in `assets/alfworld/priors.yaml`, and a
  goal from ALFWorld's goal library. Built game files are cached on disk by content hash.
- official (`split="train" | "eval_in_distribution" | "eval_out_of_distribution"`): the
  ALFWorld game files under `$ALFWORLD_DATA` (the `json_2.1.1` tree `alfworld-download`
  fetches); instance s is the s-th solvable game of the task type, modulo their number.

`alfworld_expert(env, mode)` returns the next expert action: mode "oracle" knows where every
object is (a demonstrator); mode "prior" knows only what the agent has seen so far and searches
receptacles in order of the placement prior, which is what an experience entry would teach.
`prior_hint(object_type)` phrases that prior as one sentence.

Split by job: `generation` (task types, priors, instances), `pddl` (game files, generated and official),
`speedups` (engine memoisation, fast-downward library pool), `env` (`AlfworldEnv`), `expert`, `claims` (what an
entry says of a recurring household, and the household's placements: the entry checker's half); this module
re-exports their public names (and the few private ones the tests read), so `envs.alfworld.X` keeps working.
"""
from __future__ import annotations

from typing import Any

from envs.alfworld.generation import (
    ACTION_FORMAT, ALFWORLD_TASK_NAMES, ASSET_DIR, generate_instance, Goal, Instance, load_priors, ObjectSpec,
    prior_hint, Priors, PRIORS_PATH, SceneSpec, SPLIT_DIRS, TASK_TYPES, TaskSpec,
)
from envs.alfworld.pddl import _pddl_id, default_cache_dir, game_json, instance_to_pddl, official_game_files, write_game
from envs.alfworld.speedups import _LIB_POOL
from envs.alfworld.env import _listing, AlfworldEnv, normalise_action, WorldView
from envs.alfworld.expert import alfworld_expert
from envs.alfworld.claims import claimed_location, claimed_locations, household_facts, location_verdict


def make_alfworld(task_type: str = "all", **options: Any) -> AlfworldEnv:
    """Registry factory (envs/registry.py): options are AlfworldEnv's keyword arguments."""
    return AlfworldEnv(task_type, **options)


__all__ = [
    "ACTION_FORMAT", "alfworld_expert", "ALFWORLD_TASK_NAMES", "AlfworldEnv", "ASSET_DIR", "claimed_location",
    "claimed_locations", "default_cache_dir", "household_facts", "location_verdict",
    "game_json", "generate_instance", "Goal", "Instance", "instance_to_pddl", "load_priors", "make_alfworld",
    "normalise_action", "ObjectSpec", "official_game_files", "prior_hint", "Priors", "PRIORS_PATH", "SceneSpec",
    "SPLIT_DIRS", "TASK_TYPES", "TaskSpec", "WorldView", "write_game"
]

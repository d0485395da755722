"""Household instances, generated offline: the task types, the placement priors (assets/alfworld/priors.yaml)
and `generate_instance(task_type, seed)`, a scene with numbered receptacles, placed objects and a goal."""
from __future__ import annotations

import functools
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.base import EnvError
from envs.registry import ALFWORLD_TASK_TYPES


ASSET_DIR = Path(__file__).resolve().parents[2] / "assets" / "alfworld"
PRIORS_PATH = ASSET_DIR / "priors.yaml"

TASK_TYPES = ALFWORLD_TASK_TYPES  # one list: the registry names an env alfworld/<type> for each

# Our task names -> ALFWorld's (goal library keys, `traj_data.json` task_type, data folder prefix).
ALFWORLD_TASK_NAMES = {
    "pick_and_place": "pick_and_place_simple",
    "look_at_obj_in_light": "look_at_obj_in_light",
    "pick_clean_then_place": "pick_clean_then_place_in_recep",
    "pick_heat_then_place": "pick_heat_then_place_in_recep",
    "pick_cool_then_place": "pick_cool_then_place_in_recep",
    "pick_two_obj": "pick_two_obj_and_place",
}

# Official splits -> folders of the json_2.1.1 tree (alfworld's base_config.yaml uses the same).
SPLIT_DIRS = {
    "train": "train",
    "eval_in_distribution": "valid_seen",
    "eval_out_of_distribution": "valid_unseen",
    "valid_seen": "valid_seen",
    "valid_unseen": "valid_unseen",
}

# Which task types need which state change, and the verb the game uses for it.
_STATE_NEED = {
    "pick_clean_then_place": ("clean", "isclean"),
    "pick_heat_then_place": ("heat", "ishot"),
    "pick_cool_then_place": ("cool", "iscool"),
}

ACTION_FORMAT = (
    "Reply with exactly one action per turn, using the names the game shows (\"apple 1\", "
    "\"countertop 2\"). Actions: go to X (walk to a receptacle), open X, close X, take O from X, "
    "move O to X (put the object you hold in or on X), heat O with X (microwave), cool O with X "
    "(fridge), clean O with X (sinkbasin), use X (turn a lamp on or off), examine X, look, "
    "inventory. You can hold one object at a time; closed receptacles must be opened before you "
    "can see or take what is inside."
)


# ---------------------------------------------------------------------------------------------
# Placement priors (assets/alfworld/priors.yaml)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectSpec:
    name: str
    scenes: tuple[str, ...]
    properties: frozenset[str]
    placement: dict[str, float]
    plural: str


@dataclass(frozen=True)
class SceneSpec:
    name: str
    receptacles: dict[str, tuple[int, int]]
    object_types: tuple[int, int]
    light: str | None


@dataclass(frozen=True)
class TaskSpec:
    name: str
    scenes: tuple[str, ...]
    goals: tuple[str, ...]
    needs: str | None
    count: tuple[int, int]


@dataclass(frozen=True)
class Priors:
    openable: frozenset[str]
    inside: frozenset[str]
    stations: dict[str, str]
    scenes: dict[str, SceneSpec]
    lights: dict[str, dict[str, float]]
    objects: dict[str, ObjectSpec]
    tasks: dict[str, TaskSpec]
    distractor_count: tuple[int, int]
    can_contain: dict[str, frozenset[str]]  # receptacle type -> object types it may hold

    def placement(self, object_type: str) -> dict[str, float]:
        if object_type in self.objects:
            return self.objects[object_type].placement
        return self.lights.get(object_type, {})


def _alfworld_can_contain() -> dict[str, frozenset[str]]:
    """ALFWorld's receptacle -> object table, lower-cased to the game's type names."""
    from alfworld.gen.constants import VAL_RECEPTACLE_OBJECTS

    return {r.lower(): frozenset(o.lower() for o in objs) for r, objs in VAL_RECEPTACLE_OBJECTS.items()}


@functools.lru_cache(maxsize=4)
def load_priors(path: str | os.PathLike[str] = PRIORS_PATH) -> Priors:
    """Read and check the priors file; every error names the entry and what to fix."""
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise EnvError(f"ALFWorld priors file {path} is missing; restore assets/alfworld/priors.yaml") from exc
    can_contain = _alfworld_can_contain()

    def rng_pair(value: Any, where: str) -> tuple[int, int]:
        lo, hi = (value, value) if isinstance(value, int) else tuple(value)
        if not 0 <= lo <= hi:
            raise EnvError(f"{path}: {where} must be a range [min, max] with 0 <= min <= max, got {value}")
        return int(lo), int(hi)

    def check_dist(dist: dict[str, float], where: str) -> dict[str, float]:
        total = sum(dist.values())
        if abs(total - 1.0) > 1e-6 or any(p <= 0 for p in dist.values()):
            raise EnvError(f"{path}: {where} placement probabilities must be positive and sum to 1 (sum={total:.3f})")
        return {k: float(v) for k, v in dist.items()}

    scenes = {
        name: SceneSpec(
            name=name,
            receptacles={r: rng_pair(v, f"scenes.{name}.receptacles.{r}") for r, v in spec["receptacles"].items()},
            object_types=rng_pair(spec["object_types"], f"scenes.{name}.object_types"),
            light=spec.get("light"),
        )
        for name, spec in raw["scenes"].items()
    }
    lights = {name: check_dist(spec["placement"], f"lights.{name}") for name, spec in raw["lights"].items()}
    objects: dict[str, ObjectSpec] = {}
    for name, spec in raw["objects"].items():
        placement = check_dist(spec["placement"], f"objects.{name}")
        for recep in placement:
            if name not in can_contain.get(recep, frozenset()):
                raise EnvError(f"{path}: objects.{name} is placed in {recep!r}, which ALFWorld does not let hold a {name}")
        objects[name] = ObjectSpec(
            name=name,
            scenes=tuple(spec["scenes"]),
            properties=frozenset(spec.get("properties") or ()),
            placement=placement,
            plural=spec.get("plural") or f"{name}s",
        )
    # Priors must hold exactly, so every receptacle a prior names is always present where the
    # object (or light) can appear.
    for name, obj in objects.items():
        for scene in obj.scenes:
            if scene not in scenes:
                raise EnvError(f"{path}: objects.{name} names unknown scene {scene!r}")
            for recep in obj.placement:
                if scenes[scene].receptacles.get(recep, (0, 0))[0] < 1:
                    raise EnvError(f"{path}: objects.{name} can be placed in {recep!r}, which scene {scene!r} may lack; "
                                   f"give {recep} a minimum count of 1 there")
    for scene in scenes.values():
        if scene.light:
            if scene.light not in lights:
                raise EnvError(f"{path}: scene {scene.name!r} uses light {scene.light!r}, which lights does not define")
            for recep in lights[scene.light]:
                if scene.receptacles.get(recep, (0, 0))[0] < 1:
                    raise EnvError(f"{path}: light {scene.light} stands on {recep!r}, which scene {scene.name!r} may lack")
    tasks = {}
    for name, spec in raw["tasks"].items():
        if name not in TASK_TYPES:
            raise EnvError(f"{path}: tasks.{name} is not an ALFWorld task type; use one of {', '.join(TASK_TYPES)}")
        tasks[name] = TaskSpec(
            name=name,
            scenes=tuple(spec["scenes"]),
            goals=tuple(spec.get("goals") or ()),
            needs=spec.get("needs"),
            count=rng_pair(spec["count"], f"tasks.{name}.count"),
        )
    missing = set(TASK_TYPES) - set(tasks)
    if missing:
        raise EnvError(f"{path}: tasks lacks {', '.join(sorted(missing))}")
    return Priors(
        openable=frozenset(raw["openable"]),
        inside=frozenset(raw["inside"]),
        stations=dict(raw["stations"]),
        scenes=scenes,
        lights=lights,
        objects=objects,
        tasks=tasks,
        distractor_count=rng_pair(raw["distractor_count"], "distractor_count"),
        can_contain=can_contain,
    )


def prior_hint(object_type: str, priors: Priors | None = None) -> str:
    """The placement prior of one object type as a sentence an experience entry could hold,
    e.g. "Apples are usually on a countertop (50%), in a fridge (35%) or on a diningtable (15%)."
    """
    priors = priors or load_priors()
    placement = priors.placement(object_type)
    if not placement:
        return f"There is no placement prior for {object_type}; search the receptacles one by one."
    plural = priors.objects[object_type].plural if object_type in priors.objects else f"{object_type}s"
    ranked = sorted(placement.items(), key=lambda kv: -kv[1])
    parts = [f"{'in' if r in priors.inside else 'on'} a {r} ({p:.0%})" for r, p in ranked]
    where = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]
    order = ", then ".join(r for r, _ in ranked)
    return f"{plural[0].upper()}{plural[1:]} are usually {where}; look there first: {order}."


# ---------------------------------------------------------------------------------------------
# Generated instances
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """What a task asks for, in ALFWorld's lower-case type names."""

    task_type: str
    object_type: str
    receptacle_type: str | None = None  # None for look_at_obj_in_light
    toggle_type: str | None = None  # the light for look_at_obj_in_light


@dataclass
class Instance:
    seed: int
    scene: str
    goal: Goal
    task: str  # the goal text the game shows after "Your task is to: " (no final period)
    receptacles: list[tuple[str, str]]  # (name "cabinet 2", type "cabinet"), in scene order
    objects: list[tuple[str, str, str]] = field(default_factory=list)  # (name, type, receptacle name)
    light: tuple[str, str, str] | None = None  # (name, type, receptacle name)


def _weighted(rng: random.Random, dist: dict[str, float]) -> str:
    keys = sorted(dist)
    return rng.choices(keys, weights=[dist[k] for k in keys])[0]


def generate_instance(task_type: str, seed: int, priors: Priors | None = None) -> Instance:
    """Household instance `seed` of `task_type`, a pure function of its arguments."""
    priors = priors or load_priors()
    spec = priors.tasks[task_type]
    # A string seed hashes the same way in every process (unlike hash()).
    rng = random.Random(f"comprl-alfworld/{task_type}/{seed}")
    for _attempt in range(100):
        inst = _try_generate(rng, spec, priors, seed)
        if inst is not None:
            return inst
    raise RuntimeError(f"priors.yaml admits no feasible {task_type} instance (seed {seed}); check tasks.{task_type}")


def _try_generate(rng: random.Random, spec: TaskSpec, priors: Priors, seed: int) -> Instance | None:
    scene = priors.scenes[rng.choice(sorted(spec.scenes))]
    receptacles: list[tuple[str, str]] = []
    by_type: dict[str, list[str]] = {}
    for rtype, (lo, hi) in scene.receptacles.items():
        for i in range(1, rng.randint(lo, hi) + 1):
            receptacles.append((f"{rtype} {i}", rtype))
            by_type.setdefault(rtype, []).append(f"{rtype} {i}")

    def place(object_type: str, dist: dict[str, float]) -> str:
        return rng.choice(by_type[_weighted(rng, dist)])

    pool = sorted(o.name for o in priors.objects.values() if scene.name in o.scenes)
    if spec.needs:
        candidates = [o for o in pool if spec.needs in priors.objects[o].properties]
    else:
        candidates = list(pool)
    if spec.name != "look_at_obj_in_light":
        # Only objects some present goal receptacle may hold.
        candidates = [o for o in candidates
                      if any(g in by_type and o in priors.can_contain.get(g, ()) for g in spec.goals)]
    if not candidates:
        return None
    obj_type = rng.choice(candidates)
    objects: list[tuple[str, str, str]] = []
    n_target = rng.randint(*spec.count)
    for i in range(1, n_target + 1):
        objects.append((f"{obj_type} {i}", obj_type, place(obj_type, priors.objects[obj_type].placement)))

    light = None
    if scene.light:
        light = (f"{scene.light} 1", scene.light, place(scene.light, priors.lights[scene.light]))
    if spec.name == "look_at_obj_in_light":
        if light is None:
            return None
        goal = Goal(spec.name, obj_type, None, scene.light)
    else:
        # A goal receptacle type that already holds the object would make the task trivial.
        occupied = {dict(receptacles)[r] for _, _, r in objects}
        goals = [g for g in spec.goals
                 if g in by_type and g not in occupied and obj_type in priors.can_contain.get(g, ())]
        if not goals:
            return None
        goal = Goal(spec.name, obj_type, rng.choice(goals), None)

    n_types = rng.randint(*scene.object_types)
    others = [o for o in pool if o != obj_type]
    for other in rng.sample(others, min(len(others), n_types - 1)):
        for i in range(1, rng.randint(*priors.distractor_count) + 1):
            objects.append((f"{other} {i}", other, place(other, priors.objects[other].placement)))

    from alfworld.gen import goal_library

    template = rng.choice(goal_library.gdict[ALFWORLD_TASK_NAMES[spec.name]]["templates"])
    task = template.format(obj=goal.object_type, recep=goal.receptacle_type or "", toggle=goal.toggle_type or "", mrecep="")
    return Instance(seed=seed, scene=scene.name, goal=goal, task=task, receptacles=receptacles,
                    objects=objects, light=light)

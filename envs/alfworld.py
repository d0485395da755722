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
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import pickle
import random
import re
import sys
import tempfile
import threading
import weakref
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.base import EnvError

ASSET_DIR = Path(__file__).resolve().parents[1] / "assets" / "alfworld"
PRIORS_PATH = ASSET_DIR / "priors.yaml"

TASK_TYPES = (
    "pick_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "pick_two_obj",
)

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


def _pddl_id(name: str, count: int) -> str:
    """A PDDL id that AlfredDemangler turns back into `name`.

    The demangler numbers the ids of one type in *descending* sorted order (it pops from
    [1..n]), so instance i of n gets the suffix n - i. "basin" in an id appends "basin" to the
    type, which is how ALFWorld spells sinkbasin / bathtubbasin ids."""
    kind, number = name.rsplit(" ", 1)
    suffix = f"{count - int(number):02d}"
    if kind.endswith("basin"):
        return f"{kind[:-5]}_bar_{suffix}_bar_{kind}"
    return f"{kind}_bar_{suffix}"


def instance_to_pddl(inst: Instance, priors: Priors | None = None) -> str:
    """The PDDL problem of an instance, in the shape of ALFWorld's initial_state.pddl files."""
    priors = priors or load_priors()
    from alfworld.gen import goal_library

    counts: dict[str, int] = {}
    things = [n for n, _ in inst.receptacles] + [o[0] for o in inst.objects] + ([inst.light[0]] if inst.light else [])
    for name in things:
        kind = name.rsplit(" ", 1)[0]
        counts[kind] = counts.get(kind, 0) + 1
    pid = {name: _pddl_id(name, counts[name.rsplit(" ", 1)[0]]) for name in things}

    rtypes = {t for _, t in inst.receptacles} | set(priors.stations.values())
    # The domain names KnifeType / ButterKnifeType in SliceObject, so they must exist as otypes.
    otypes = {t for _, t, _ in inst.objects} | {"knife", "butterknife"} | ({inst.light[1]} if inst.light else set())
    loc = {name: f"loc_bar_{i + 1}" for i, (name, _) in enumerate(inst.receptacles)}

    objs = ["agent1 - agent", "loc_bar_0 - location"]
    objs += [f"{loc[n]} - location" for n, _ in inst.receptacles]
    objs += [f"{t}type - rtype" for t in sorted(rtypes)]
    objs += [f"{t}type - otype" for t in sorted(otypes)]
    objs += [f"{pid[n]} - receptacle" for n, _ in inst.receptacles]
    objs += [f"{pid[o[0]]} - object" for o in inst.objects]
    init = ["(atLocation agent1 loc_bar_0)"]
    for name, rtype in inst.receptacles:
        init += [f"(receptacleType {pid[name]} {rtype}type)", f"(receptacleAtLocation {pid[name]} {loc[name]})"]
        if rtype in priors.openable:
            init.append(f"(openable {pid[name]})")
    for name, otype, recep in inst.objects:
        init += [f"(objectType {pid[name]} {otype}type)", f"(inReceptacle {pid[name]} {pid[recep]})",
                 f"(objectAtLocation {pid[name]} {loc[recep]})", f"(pickupable {pid[name]})"]
        init += [f"({prop} {pid[name]})" for prop in sorted(priors.objects[otype].properties)]
    if inst.light:
        name, ltype, recep = inst.light
        objs.append(f"{pid[name]} - object")
        init += [f"(objectType {pid[name]} {ltype}type)", f"(inReceptacle {pid[name]} {pid[recep]})",
                 f"(objectAtLocation {pid[name]} {loc[recep]})", f"(toggleable {pid[name]})"]
    for rtype in sorted(rtypes):
        for otype in sorted(otypes):
            if otype in priors.can_contain.get(rtype, ()):
                init.append(f"(canContain {rtype}type {otype}type)")
    goal = goal_library.gdict[ALFWORLD_TASK_NAMES[inst.goal.task_type]]["pddl"].format(
        obj=inst.goal.object_type, recep=inst.goal.receptacle_type or "", toggle=inst.goal.toggle_type or "", mrecep="")
    # The goal library writes "?o # object" (it is a format string); PDDL wants "?o - object".
    # Its text also closes the (define ...) form.
    goal = goal.replace(" # ", " - ")
    return ("(define (problem comprl_alfworld)\n  (:domain alfred)\n  (:objects\n    " + "\n    ".join(objs)
            + "\n  )\n  (:init\n    " + "\n    ".join(init) + "\n  )\n" + goal)


@functools.lru_cache(maxsize=1)
def _game_logic() -> tuple[str, str]:
    """ALFWorld's PDDL domain and text grammar, as the alfworld package ships them."""
    import alfworld

    data = Path(alfworld.__file__).resolve().parent / "data"
    try:
        return (data / "alfred.pddl").read_text(), (data / "alfred.twl2").read_text()
    except FileNotFoundError as exc:
        raise EnvError(f"the alfworld package lacks {data}/alfred.pddl or alfred.twl2; reinstall alfworld>=0.4.2") from exc


def game_json(inst: Instance) -> dict[str, Any]:
    """A `.tw-pddl` game, the format ALFWorld's game.tw-pddl files use."""
    domain, grammar = _game_logic()
    return {
        "pddl_domain": domain,
        "grammar": grammar.replace("UNKNOWN GOAL", inst.task),
        "pddl_problem": instance_to_pddl(inst),
        "solvable": True,
        "comprl": {"seed": inst.seed, "scene": inst.scene, "task_type": inst.goal.task_type,
                   "object_type": inst.goal.object_type, "receptacle_type": inst.goal.receptacle_type,
                   "toggle_type": inst.goal.toggle_type},
    }


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "comprl" / "alfworld"


def _writable_dir(path: Path | None) -> Path:
    path = Path(path) if path is not None else default_cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, delete=True)
        probe.close()
        return path
    except OSError:
        # A read-only home (CI sandboxes) should not stop the env: fall back to a temp dir.
        # Per user and private: the cache holds pickles, which only their writer should supply.
        fallback = Path(tempfile.gettempdir()) / f"comprl-alfworld-cache-{os.getuid()}"
        fallback.mkdir(mode=0o700, parents=True, exist_ok=True)
        return fallback


def write_game(inst: Instance, cache_dir: Path) -> Path:
    """The instance's game file under `cache_dir`, named by content hash (written once)."""
    data = json.dumps(game_json(inst), sort_keys=True)
    path = cache_dir / f"{hashlib.sha1(data.encode()).hexdigest()[:20]}.tw-pddl"
    if not path.exists():
        # Write-then-rename: parallel workers never read a half-written file.
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------
# Official ALFWorld data
# ---------------------------------------------------------------------------------------------


def _official_root(data_dir: str | os.PathLike[str] | None) -> Path:
    raw = data_dir or os.environ.get("ALFWORLD_DATA")
    if not raw:
        raise EnvError("ALFWorld's official games need their data: set ALFWORLD_DATA to the folder holding "
                       "json_2.1.1 (from `alfworld-download`), or drop `split` to use generated games offline")
    root = Path(os.path.expandvars(str(raw))).expanduser()
    for candidate in (root / "json_2.1.1", root):
        if (candidate / "train").is_dir() or (candidate / "valid_seen").is_dir() or (candidate / "valid_unseen").is_dir():
            return candidate
    raise EnvError(f"ALFWORLD_DATA={raw} holds no json_2.1.1/{{train,valid_seen,valid_unseen}} folders; point it at "
                   "the folder `alfworld-download` filled, or drop `split` to use generated games offline")


def official_game_files(root: Path, split: str, task_types: tuple[str, ...]) -> list[Path]:
    """The game.tw-pddl files of a split, as AlfredTWEnv.collect_game_files selects them:
    only the wanted task types, no movable-receptacle or sliced tasks, sorted for determinism."""
    if split not in SPLIT_DIRS:
        raise EnvError(f"unknown ALFWorld split {split!r}; use one of {', '.join(SPLIT_DIRS)}")
    split_dir = root / SPLIT_DIRS[split]
    if not split_dir.is_dir():
        raise EnvError(f"{split_dir} is missing; the ALFWorld data under {root} lacks the {split!r} split")
    wanted = {ALFWORLD_TASK_NAMES[t] for t in task_types}
    files = []
    for game in sorted(split_dir.glob("*/*/game.tw-pddl")):
        task_dir = game.parent.parent.name  # e.g. pick_and_place_simple-Apple-None-Fridge-1
        if "movable" in task_dir or "Sliced" in task_dir:
            continue
        if task_dir.split("-", 1)[0] in wanted and (game.parent / "traj_data.json").exists():
            files.append(game)
    if not files:
        raise EnvError(f"no ALFWorld games of type {', '.join(task_types)} under {split_dir}")
    return files


def _official_goal(game: Path) -> Goal:
    traj = json.loads((game.parent / "traj_data.json").read_text())
    params = traj["pddl_params"]
    ours = {v: k for k, v in ALFWORLD_TASK_NAMES.items()}[traj["task_type"]]
    low = lambda s: s.lower() if s else None  # noqa: E731 - one-line normaliser
    if ours == "look_at_obj_in_light":
        return Goal(ours, low(params["object_target"]), None, low(params["toggle_target"]))
    return Goal(ours, low(params["object_target"]), low(params["parent_target"]), None)


# ---------------------------------------------------------------------------------------------
# Engine speed-ups
# ---------------------------------------------------------------------------------------------
#
# Measured on a 2-core CPU for an 18-receptacle kitchen, TextWorld's PDDL backend spends a new
# game's reset almost entirely in two places: fast-downward's PDDL->SAS translation (~0.4 s,
# done four times: normal and "optimized" translations, once in load() and again in reset())
# and parsing text with TatSu: the grammar document (~0.3 s per load) and, on every step, each
# admissible command's template and fact query (~0.1 s per step). All are pure functions of their
# text inputs, so they are memoised here (in memory, and on disk for the two slow per-game ones).
# Last, the text generator deep-copies its derivation context for every symbol; a one-level copy
# is equivalent (see _shallow_copy_context). The game logic itself is untouched.

_MEMO: dict[tuple[str, str], Any] = {}
_MEMO_SIZE = 128
_disk_cache_dir: Path | None = None  # set by the env that is about to load or reset a game


def _cached(kind: str, text: str, compute: Any) -> Any:
    """compute() memoised by the hash of `text`, in this process and on disk (compressed pickles
    under <cache_dir>/<kind>/, written by this module only; a torn or stale file is recomputed)."""
    key = (kind, hashlib.sha1(text.encode()).hexdigest())
    if key in _MEMO:
        return _MEMO[key]
    disk = _disk_cache_dir / kind / f"{key[1]}.pkl" if _disk_cache_dir is not None else None
    value = None
    if disk is not None and disk.exists():
        try:
            value = pickle.loads(zlib.decompress(disk.read_bytes()))
        except (OSError, zlib.error, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            value = None
    if value is None:
        value = compute()
        if disk is not None:
            disk.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=disk.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                # Compressed: ~200 KB -> ~25 KB a game, for caches of thousands of games.
                f.write(zlib.compress(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), 1))
            os.replace(tmp, disk)  # write-then-rename: parallel workers never read half a file
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[key] = value
    return value


def _memo_pddl2sas(original: Any) -> Any:
    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> tuple[Any, str]:
        # The "optimized" translation only feeds fast-downward's re-planner (policy_commands /
        # walkthrough), which this env never requests; the unpruned translation describes the
        # same task, so one translation serves both.
        def translate() -> tuple[Any, str]:
            argv = list(sys.argv)  # fast-downward's translator overwrites sys.argv
            try:
                return original(domain, problem, verbose=verbose, optimize=False)
            finally:
                sys.argv[:] = argv

        return _cached("sas", f"{len(domain)}\0{domain}\0{problem}", translate)

    pddl2sas.comprl_memo = True  # type: ignore[attr-defined]
    return pddl2sas


def _forgetful(parse: Any) -> Any:
    """A textworld module's `_parse_and_convert` that leaves nothing behind in the module's tatsu
    parser (a module-level singleton). The parser keeps its last parse's furthest failure (tatsu
    raises and catches FailedParse while backtracking), whose traceback holds every frame up the
    stack at that moment: the env that called step/reset, its game and its fast-downward library
    copy, until the next parse. Memoised, parses are rare, so that env would stay alive."""
    parser = getattr(sys.modules.get(getattr(parse, "__module__", "") or ""), "_PARSER", None)
    reset = getattr(parser, "_initialize_caches", None)
    if reset is None:
        return parse

    @functools.wraps(parse)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return parse(*args, **kwargs)
        finally:
            reset()

    return run


def _memo_twl2_parse(original: Any) -> Any:
    """The game's grammar document (alfred.twl2 + goal text) -> (actions, grammar), read-only
    afterwards: GameLogic copies the rules into its own grammar and only reads the actions."""
    original = _forgetful(original)

    def parse_and_convert(text: str, rule_name: str = "", **kwargs: Any) -> Any:
        if rule_name != "pddlStart" or kwargs:
            return original(text, rule_name=rule_name, **kwargs)
        return _cached("twl2", text, lambda: original(text, rule_name=rule_name))

    parse_and_convert.comprl_memo = True  # type: ignore[attr-defined]
    return parse_and_convert


def _memo_csg_parse(original: Any) -> Any:
    """A text-grammar string -> its symbols. Derivation mutates the symbols' contexts, so every
    caller gets a fresh copy of the cached parse."""
    original = _forgetful(original)
    cached = functools.lru_cache(maxsize=8192)(lambda text, rule_name, trace: original(text, rule_name=rule_name, trace=trace))

    def parse_and_convert(text: str, rule_name: str = "symbols", trace: bool = False, **kwargs: Any) -> Any:
        if kwargs:
            return original(text, rule_name=rule_name, trace=trace, **kwargs)
        return copy.deepcopy(cached(text, rule_name, bool(trace)))

    parse_and_convert.comprl_memo = True  # type: ignore[attr-defined]
    return parse_and_convert


def _memo_query_parse(original: Any) -> Any:
    """A fact query ("atlocation(a:agent, l:location) & ...") -> its predicates, which are
    immutable values; each caller gets its own list."""
    original = _forgetful(original)
    cached = functools.lru_cache(maxsize=4096)(lambda text: tuple(original(text, rule_name="conjunctiveQuery")))

    def parse_and_convert(text: str, rule_name: str = "", **kwargs: Any) -> Any:
        if rule_name != "conjunctiveQuery" or kwargs:
            return original(text, rule_name=rule_name, **kwargs)
        return list(cached(text))

    parse_and_convert.comprl_memo = True  # type: ignore[attr-defined]
    return parse_and_convert


def _shallow_copy_context(context: dict[str, Any]) -> dict[str, Any]:
    """textgen.copy_context without its deep copies (~80% of a step's time). Derivation only
    adds keys to the `variables` and `mapping` dicts and reads the entities and variables in
    them, so copying the two dicts one level deep keeps every caller's context independent."""
    return {
        "state": context["state"],
        "facts": context["facts"],
        "variables": dict(context["variables"]),
        "mapping": dict(context["mapping"]),
        "entity_infos": context["entity_infos"],
    }


_shallow_copy_context.comprl_memo = True  # type: ignore[attr-defined]


def _install_speedups() -> None:
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as tw_logic

    for module, attr, wrap in ((fast_downward, "pddl2sas", _memo_pddl2sas),
                               (pddl_logic, "_parse_and_convert", _memo_twl2_parse),
                               (textgen, "_parse_and_convert", _memo_csg_parse),
                               (tw_logic, "_parse_and_convert", _memo_query_parse)):
        if not getattr(getattr(module, attr), "comprl_memo", False):
            setattr(module, attr, wrap(getattr(module, attr)))
    textgen.copy_context = _shallow_copy_context


# ---------------------------------------------------------------------------------------------
# fast-downward library copies
# ---------------------------------------------------------------------------------------------
#
# Every textworld PddlEnv loads a private copy of libdownward.so (fast_downward.load_lib copies
# the file to a temp dir and dlopens it), because the library keeps the game state in globals.
# The copies are NOT independent, though: options::RawRegistry::instance()::instance_ (a
# function-local static) is an STB_GNU_UNIQUE symbol, so the dynamic loader binds it in every
# copy to the first copy's object. Each new copy's static initialisers therefore append their
# plugin entries (std::function objects and `options::Any` holders whose vtables live in *that*
# copy) to the first copy's registry. fast_downward.close_lib dlcloses a copy and unmaps its
# code, leaving those entries dangling; the next dlopen of a copy appends to the registry, the
# vector reallocates, copies every entry through its vtable and jumps into unmapped memory:
# "Segmentation fault" inside load_lib (seen with several envs alive, then closed, then new
# ones made). Whether it crashes depends (most likely) on whether a later copy is mapped at the
# freed address: making and closing one env at a time happened to survive.
#
# So no copy is ever unloaded in this process: a closed env hands its copy back to a pool (its
# planner state freed with `cleanup()`), and the next env takes it instead of loading another.
# The process holds as many copies as it had envs alive at once, each loaded exactly once.


class _DownwardLibPool:
    """Loaded copies of fast-downward's library, reused across envs and never dlclosed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[Any] = []
        self._free_ids: set[int] = set()
        self.loaded = 0  # copies loaded in this process (they stay loaded)
        self._load: Any = None  # fast_downward's own load_lib

    def acquire(self) -> Any:
        with self._lock:
            if self._free:
                lib = self._free.pop()
                self._free_ids.discard(id(lib))
                return lib
            load = self._load
        lib = load()  # outside the lock: dlopen takes the loader's own lock
        with self._lock:
            self.loaded += 1
        return lib

    def release(self, lib: Any) -> None:
        """Take back a copy nobody uses any more; releasing one twice is a no-op."""
        with self._lock:
            if id(lib) in self._free_ids:
                return
            lib.cleanup()  # frees the game's state registry; load_sas starts afresh
            self._free.append(lib)
            self._free_ids.add(id(lib))

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)


_LIB_POOL = _DownwardLibPool()


def _install_lib_pool() -> None:
    """Route every load_lib / close_lib in this process (textworld's PddlEnv calls
    `fast_downward.load_lib()`) through the pool, so no caller can unload a copy."""
    import fast_downward
    import fast_downward.interface as fd_interface

    with _LIB_POOL._lock:
        if _LIB_POOL._load is None:
            _LIB_POOL._load = fd_interface.load_lib
        for module in (fast_downward, fd_interface):
            module.load_lib = _LIB_POOL.acquire
            module.close_lib = _LIB_POOL.release


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
        task_type = self.task_types[random.Random(f"comprl-alfworld/type/{seed}").randrange(len(self.task_types))]
        inst = generate_instance(task_type, seed, self.priors)
        self.instance = inst
        self.goal = inst.goal
        return write_game(inst, self.cache_dir)

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

        global _disk_cache_dir
        _install_speedups()
        _disk_cache_dir = self.cache_dir
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


# ---------------------------------------------------------------------------------------------
# Experts
# ---------------------------------------------------------------------------------------------


def alfworld_expert(env: AlfworldEnv, mode: str = "oracle") -> str:
    """The next expert action for the env's current state.

    mode="oracle": knows where every object is and goes straight to it.
    mode="prior": knows only the receptacles the agent has looked into this episode and searches
    the others in order of the object's placement prior (most likely receptacle type first).
    """
    if mode not in ("oracle", "prior"):
        raise ValueError(f"unknown expert mode {mode!r}; use 'oracle' or 'prior'")
    if env.goal is None or env.done:
        raise RuntimeError("alfworld_expert needs a running episode: call env.reset() first")
    view, goal, priors = env.world, env.goal, env.priors
    known = set(view.receptacles) if mode == "oracle" else set(env.observed)

    def known_objects(of_type: str) -> list[str]:
        return [o for r in view.receptacles if r in known for o in view.contents.get(r, []) if view.kind.get(o) == of_type]

    def goto(recep: str) -> str | None:
        """None when already there (and the receptacle is open), else the action to get there."""
        if recep not in view.here:
            return f"go to {recep}"
        if recep in view.openable and recep not in view.opened:
            return f"open {recep}"
        return None

    def search(of_type: str) -> str:
        placement = priors.placement(of_type)
        # In the order the room's first observation lists them (the one order a policy can read back
        # from its prompt), most likely receptacle type first.
        unseen = [r for r in (env.listing or view.receptacles) if r not in known]
        if not unseen:
            return "look"  # everything seen and nothing found: nothing useful left to do
        unseen.sort(key=lambda r: -placement.get(view.kind.get(r, ""), 0.0))  # stable: listing order breaks ties
        return goto(unseen[0]) or f"examine {unseen[0]}"

    def fetch(candidates: list[str]) -> str:
        obj = candidates[0]
        recep = view.where[obj]
        return goto(recep) or f"take {obj} from {recep}"

    if goal.task_type == "look_at_obj_in_light":
        held = view.holding
        if held is None:
            targets = known_objects(goal.object_type)
            return fetch(targets) if targets else search(goal.object_type)
        if view.kind.get(held) != goal.object_type:
            return _put_back(view, held)
        lamps = known_objects(goal.toggle_type or "")
        if not lamps:
            return search(goal.toggle_type or "")
        lamp_at = view.where[lamps[0]]
        if lamp_at not in view.here:
            return f"go to {lamp_at}"
        return f"use {lamps[0]}"

    goal_receps = [r for r in view.receptacles if view.kind.get(r) == goal.receptacle_type]
    if not goal_receps:
        raise RuntimeError(f"{env.name}: the room has no {goal.receptacle_type} for the goal {env.task!r}")
    need = _STATE_NEED.get(goal.task_type)

    def ready(obj: str) -> bool:
        return need is None or need[1] in view.props.get(obj, set())

    # pick_two needs both objects in one receptacle: aim at the one already holding most.
    target_r = max(goal_receps, key=lambda r: sum(1 for o in view.contents.get(r, [])
                                                    if view.kind.get(o) == goal.object_type and ready(o)))
    placed = [o for o in view.contents.get(target_r, []) if view.kind.get(o) == goal.object_type and ready(o)]
    held = view.holding
    if held is not None:
        if view.kind.get(held) != goal.object_type:
            return _put_back(view, held)
        if not ready(held):
            verb = need[0]
            stations = [r for r in view.receptacles if view.kind.get(r) == priors.stations[verb]]
            station = stations[0]
            if station not in view.here:
                return f"go to {station}"
            return f"{verb} {held} with {station}"
        return goto(target_r) or f"move {held} to {target_r}"
    candidates = [o for o in known_objects(goal.object_type) if o not in placed]
    return fetch(candidates) if candidates else search(goal.object_type)


def _put_back(view: WorldView, held: str) -> str:
    """Recover from holding the wrong object: set it down where the agent stands."""
    for recep in sorted(view.here, key=_name_key):
        if recep not in view.openable or recep in view.opened:
            return f"move {held} to {recep}"
    recep = sorted(view.here, key=_name_key)[0] if view.here else None
    return f"open {recep}" if recep else f"go to {view.receptacles[0]}"


def make_alfworld(task_type: str = "all", **options: Any) -> AlfworldEnv:
    """Registry factory (envs/registry.py): options are AlfworldEnv's keyword arguments."""
    return AlfworldEnv(task_type, **options)

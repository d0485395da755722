"""Game files: a generated instance as a PDDL problem in a `.tw-pddl` JSON game (cached on disk by content
hash), and the official ALFWorld game files under `$ALFWORLD_DATA`."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from envs.base import EnvError
from envs.alfworld.generation import ALFWORLD_TASK_NAMES, Goal, Instance, load_priors, Priors, SPLIT_DIRS

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

"""The ALFWorld expert: `alfworld_expert(env, mode)`, oracle (knows where everything is) or prior (searches
receptacles in order of the placement prior)."""
from __future__ import annotations


from envs.alfworld.generation import _STATE_NEED
from envs.alfworld.env import _name_key, AlfworldEnv, WorldView

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

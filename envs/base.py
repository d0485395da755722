"""The text-environment protocol every task speaks (DESIGN.md habit 5: Gymnasium's contract, in text).

    obs, info = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step("north")

Rules every env keeps:
- `env.task` is the goal text (the retrieval query); set after `reset`.
- `env.action_format` is one paragraph the actor's prompt shows: which actions exist and their form.
- `env.max_turns` bounds an episode; the step that reaches it returns `truncated=True`.
- An action the env cannot parse is not an exception: the observation says what was wrong and
  which forms are valid, `info["invalid_action"] = True`, and it counts as a turn.
- At episode end (terminated or truncated) `info["success"]` is a bool.
- `info["admissible_actions"]` lists valid actions where the env knows them.
- Optional: `env.keep_intro = True` keeps the episode's first observation in the actor's prompt
  after the history window has moved past it (ALFWorld names the room's receptacles only there).
"""
from __future__ import annotations

import hashlib
import re
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class TextEnv(Protocol):
    name: str
    task: str
    action_format: str
    max_turns: int

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]: ...

    def close(self) -> None: ...


def keeps_intro(env: object) -> bool:
    """Whether the env asks for its first observation to stay in the actor's prompt (`keep_intro`)."""
    return bool(getattr(env, "keep_intro", False))


class EnvError(RuntimeError):
    """An env cannot be built or run here (missing data, Docker, a package); the message says how to fix it."""


def check_env(env: TextEnv, *, seed: int = 0, actions: list[str] | None = None, max_steps: int | None = None) -> None:
    """Assert the protocol on one episode: types, task text, bad-action feedback, the turn limit.

    Plays `actions` in order (cycled), or the env's admissible actions / a fixed probe otherwise,
    until the episode ends or `max_steps` (default: the env's turn limit) is reached.
    """
    for attr, typ in (("name", str), ("action_format", str), ("max_turns", int)):
        assert isinstance(getattr(env, attr, None), typ), f"env.{attr} must be a {typ.__name__}"
    assert env.max_turns > 0, "env.max_turns must be positive"
    obs, info = env.reset(seed=seed)
    assert isinstance(obs, str) and obs.strip(), "reset() must return a non-empty observation string"
    assert isinstance(info, dict), "reset() must return an info dict"
    assert isinstance(env.task, str) and env.task.strip(), "env.task must be set to the goal text after reset()"

    # Same seed, same start: the determinism the trainer's per-sample seeds rely on.
    obs2, _ = env.reset(seed=seed)
    assert obs2 == obs, "reset(seed=s) must be deterministic"

    # A nonsense action is feedback, not a crash, and counts as a turn.
    out = env.step("@@ not an action @@")
    assert len(out) == 5, "step() must return (obs, reward, terminated, truncated, info)"
    obs, reward, terminated, truncated, info = out
    assert isinstance(obs, str) and obs.strip(), "an invalid action must produce an explanatory observation"
    assert isinstance(reward, (int, float)) and isinstance(terminated, bool) and isinstance(truncated, bool)
    assert info.get("invalid_action") is True, "an unparseable action must set info['invalid_action']"

    limit = max_steps if max_steps is not None else env.max_turns
    turns = 1
    i = 0
    while not (terminated or truncated) and turns < limit + 1:
        if actions:
            action = actions[i % len(actions)]
        else:
            adm = info.get("admissible_actions") or []
            action = adm[i % len(adm)] if adm else "look"
        i += 1
        obs, reward, terminated, truncated, info = env.step(action)
        turns += 1
        assert isinstance(obs, str)
        assert isinstance(reward, (int, float))
    if max_steps is None:
        assert terminated or truncated, f"episode did not end within max_turns={env.max_turns}"
    if terminated or truncated:
        assert isinstance(info.get("success"), bool), "info['success'] must be a bool at episode end"


# -- recurring task sets (env.task_set) ----------------------------------------------------------
# A run with a finite set of training tasks names each task instance by an id that the actor sees
# in its task text and that keys retrieval ("Dungeon 17: Reach the staircase ..."), so an entry
# written from one episode of a task is found when that task comes round again (docs/method.md: the
# paper's ALFWorld games and WebShop instructions recur the same way). The id fixes the instance:
# its seed is a hash of (env, id), the same in every run and on every machine.

_INSTANCE_NOUNS = {"minihack": "Dungeon", "alfworld": "Household", "webshop": "Shop", "swe": "Repository"}
_INSTANCE = re.compile(r"^(?:Dungeon|Household|Shop|Repository|Task) (\d+): ", re.S)


def task_seed(env_name: str, task_id: int) -> int:
    """The env seed of task `task_id` of `env_name` (31 bits: every env's seed range takes it)."""
    h = hashlib.blake2b(f"{env_name}/task/{int(task_id)}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFFFFFF


def instance_task(env_name: str, task_id: int, task: str) -> str:
    """The task text of instance `task_id`: 'Dungeon 17: <the env's goal text>'."""
    noun = _INSTANCE_NOUNS.get(env_name.split("/", 1)[0], "Task")
    return f"{noun} {int(task_id)}: {task}"


def task_id_of(task: str) -> int | None:
    """The instance id in a task text written by `instance_task`, or None (a random-seed task)."""
    m = _INSTANCE.match(task or "")
    return int(m.group(1)) if m else None

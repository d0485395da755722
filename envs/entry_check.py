"""Is an experience entry's claim about its task true? Checked against the task's real layout.

    checker = EntryChecker()
    checker.verdict("minihack/Room-Ultimate-5x5", "Dungeon 17: Reach the staircase ...", entry_text)
    # -> "right" | "wrong" | "no_claim" | "unknown"

On a recurring MiniHack task (a task text with an instance id, envs/base.py `instance_task`) the
level is fixed, so a lesson such as "the staircase down (>) is 2 south and 1 east of the square
where you start" is either right or wrong for it. The checker learns each level once by letting the
scripted expert play it (envs/experts.py `minihack_facts`) and compares. `no_claim`: the entry states
no offset (it may still be useful; it is not checkable). `unknown`: the task has no instance id, the
env has no checker, or the expert never saw the staircase. Other envs have no checker yet.
"""
from __future__ import annotations

from typing import Any

from envs.base import task_id_of, task_seed

VERDICTS = ("right", "wrong", "no_claim", "unknown")


class EntryChecker:
    """Verdicts on entries of recurring MiniHack tasks; one env per env name, one expert play per level."""

    def __init__(self, max_turns: int = 100) -> None:
        self.max_turns = max_turns  # the expert's turn budget for learning a level (not the run's limit)
        self._envs: dict[str, Any] = {}
        self._facts: dict[tuple[str, int], dict[str, Any]] = {}

    @staticmethod
    def supports(env_name: str) -> bool:
        return env_name.startswith("minihack/")

    def facts(self, env_name: str, task_id: int) -> dict[str, Any]:
        """The level of recurring task `task_id` (envs/experts.py `minihack_facts`)."""
        return self.level(env_name, task_seed(env_name, task_id))

    def level(self, env_name: str, seed: int) -> dict[str, Any]:
        """The level an env seed makes, learned once."""
        key = (env_name, int(seed))
        if key not in self._facts:
            from envs.experts import minihack_facts
            from envs.registry import make_env

            env = self._envs.get(env_name)
            if env is None:
                env = self._envs[env_name] = make_env(env_name, max_turns=self.max_turns)
            self._facts[key] = minihack_facts(env, int(seed))
        return self._facts[key]

    def verdict(self, env_name: str, task: str, text: str) -> str:
        from envs.minihack import claimed_offset

        task_id = task_id_of(task)
        if task_id is None or not self.supports(env_name):
            return "unknown"
        claim = claimed_offset(text)
        if claim is None:
            return "no_claim"
        truth = self.facts(env_name, task_id)["offset"]
        if truth is None:
            return "unknown"
        return "right" if tuple(claim) == tuple(truth) else "wrong"

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()


def correct_share(verdicts: list[str]) -> float | None:
    """Right over checkable entries (right + wrong + no_claim); None when none is checkable."""
    n = sum(v in ("right", "wrong", "no_claim") for v in verdicts)
    return sum(v == "right" for v in verdicts) / n if n else None

"""Is an experience entry's claim about its task true? Checked against the task's real layout.

    checker = EntryChecker()
    checker.verdict("minihack/Room-Ultimate-5x5", "Dungeon 17: Reach the staircase ...", entry_text)
    # -> "right" | "wrong" | "no_claim" | "unknown"

On a recurring MiniHack task (a task text with an instance id, envs/base.py `instance_task`) the
level is fixed, so a lesson such as "the staircase down (>) is 2 south and 1 east of the square
where you start" is either right or wrong for it. The checker learns each level once by letting the
scripted expert play it (envs/experts.py `minihack_facts`) and compares. On a recurring ALFWorld household
("Household 17: put a watch in safe.") the placements are fixed, so "the watch is in drawer 3" is right if a watch
starts in drawer 3 of that household, wrong if it names another receptacle (envs/alfworld/claims.py:
`household_facts` reads the generated household, no engine needed; `claimed_location` reads the entry).
`no_claim`: the entry states no offset / names no numbered receptacle for the task's object (it may still be
useful; it is not checkable). `unknown`: the task has no instance id, the env has no checker, or the expert never
saw the staircase. Other envs have no checker yet.
"""
from __future__ import annotations

from typing import Any

from envs.base import task_id_of, task_seed

VERDICTS = ("right", "wrong", "no_claim", "unknown")


class EntryChecker:
    """Verdicts on entries of recurring MiniHack tasks and ALFWorld households; one env per env name, each level
    or household learned once."""

    def __init__(self, max_turns: int = 100, options: dict[str, Any] | None = None) -> None:
        self.max_turns = max_turns  # the expert's turn budget for learning a level (not the run's limit)
        self.options = dict(options or {})  # the run's env.options, so the checker builds the envs the run plays
        self._envs: dict[str, Any] = {}
        self._facts: dict[tuple[str, int], dict[str, Any]] = {}

    @staticmethod
    def supports(env_name: str) -> bool:
        return env_name.startswith(("minihack/", "alfworld/"))

    def facts(self, env_name: str, task_id: int) -> dict[str, Any]:
        """The level of recurring task `task_id` (envs/experts.py `minihack_facts`; ALFWorld: the household,
        envs/alfworld/claims.py `household_facts`)."""
        return self.level(env_name, task_seed(env_name, task_id))

    def level(self, env_name: str, seed: int) -> dict[str, Any]:
        """The level (or household) an env seed makes, learned once."""
        key = (env_name, int(seed))
        if key not in self._facts:
            from envs.registry import make_env

            env = self._envs.get(env_name)
            if env is None:
                env = self._envs[env_name] = make_env(env_name, **{**self.options, "max_turns": self.max_turns})
            if env_name.startswith("alfworld/"):
                from envs.alfworld.claims import household_facts

                self._facts[key] = household_facts(env, int(seed))
            else:
                from envs.experts import minihack_facts

                self._facts[key] = minihack_facts(env, int(seed))
        return self._facts[key]

    def verdict(self, env_name: str, task: str, text: str) -> str:
        from envs.minihack import claimed_offset

        task_id = task_id_of(task)
        if task_id is None or not self.supports(env_name):
            return "unknown"
        if env_name.startswith("alfworld/"):
            from envs.alfworld.claims import location_verdict

            return location_verdict(text, self.facts(env_name, task_id))
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

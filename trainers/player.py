"""One episode a turn at a time, for the workbench's demo: the Roller's own loop (trainers/rollout.py) on a one-slot
pool in this process, so what a person watches is what training does, prompt for prompt.

    p = EpisodePlayer("minihack/Room-5x5", 3, checkpoint=FOLDER, db_url=...)   # the policy, greedy
    p = EpisodePlayer("minihack/Room-5x5", 3, expert=True)                # the env's scripted expert
    p.reset() -> turn dict; p.step() -> turn dict, until turn["done"]

A turn dict: turn, observation, experience, action, reward, done, success, tool_query, tool_answer. A search-and-ask
call is answered with the best library entry as it stands (the demo runs no extractor to rewrite it).

Plain Python at import (the workbench imports it without the trainer's torch): the policy's back end is loaded only
when a policy plays.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from envs.pool import LocalPool
from trainers.rollout import Batch, EpisodeSpec, Roller


class EpisodePlayer:
    def __init__(self, env_name: str, seed: int, *, db_url: str = "", checkpoint: str = "", use_library: bool = True,
                 max_new_tokens: int = 24, search_and_ask: int | None = None, history_turns: int | None = None,
                 history_chars: int | None = None, prompt_style: str = "compact", actor: Any = None,
                 constrain_actions: bool = False, expert: bool = False, task_id: int | None = None, max_turns: int = 0):
        """`task_id`: a recurring task (env.task_set) played as a run plays it, "Dungeon N: ..." in its task text, which
        keys retrieval (`seed` is then that task's instance seed); `max_turns` caps the episode as env.max_turns does
        (0: the env's own limit)."""
        from trainers.config import ModelSection, RolloutSection

        if not expert and actor is None:
            actor = _load_policy(checkpoint)
        self.manager = _manager(db_url) if use_library and db_url else None
        # Unset: the prompt the embedded policy was trained on (trainers/config.py PROMPT_DEFAULTS: no history, no
        # search-and-ask offer). The expert and a player without a library make no search-and-ask calls.
        told = {"history_turns": history_turns, "history_chars": history_chars, "search_and_ask": search_and_ask}
        rc = RolloutSection(**{k: v for k, v in told.items() if v is not None}, prompt_style=prompt_style,
                            constrain_actions=bool(constrain_actions), reuse_cache=False)
        if expert or self.manager is None:
            rc.search_and_ask = 0
        self.pool = LocalPool([env_name])
        self.roller = Roller(None if expert else actor, self.pool, self.manager, rollout_cfg=rc,
                             actor_cfg=ModelSection(max_new_tokens=max_new_tokens, temperature=0.0),
                             tool_fn=self._answer if self.manager is not None else None)
        self.roller.max_turns = int(max_turns or 0)
        self.env_name, self.seed, self.task_id = env_name, seed, task_id
        self.batch: Batch | None = None

    @property
    def env(self) -> Any:
        """The slot's env (after reset)."""
        return self.pool.envs.get(0)

    @property
    def task(self) -> str:
        """The episode's task text as retrieval sees it ("Dungeon 3: ..." for a recurring task)."""
        if self.batch is not None:
            return self.batch.lives[0].ep.traj.task
        env = self.env
        return getattr(env, "task", "") if env is not None else ""

    @property
    def experience(self) -> str:
        return self.batch.lives[0].ep.traj.experience_text if self.batch else ""

    @experience.setter
    def experience(self, text: str) -> None:
        """What the episode shows as its experience (the expert does not read it; the demo shows what retrieval would)."""
        if self.batch is not None:
            self.batch.lives[0].ep.traj.experience_text = text

    @property
    def done(self) -> bool:
        return bool(self.batch and self.batch.lives[0].done)

    def reset(self) -> dict[str, Any]:
        spec = EpisodeSpec(self.env_name, self.seed, with_experience=self.manager is not None, group_id=0,
                           task_id=self.task_id)
        self.batch = self.roller.begin([(0, spec)], step=0)
        if self.batch.lives[0].ep.error:  # the env could not start here (missing data, Docker): say why
            raise RuntimeError(self.batch.lives[0].ep.error.splitlines()[0])
        return self._turn_dict()

    def step(self) -> dict[str, Any]:
        if self.batch is None or self.done:
            raise RuntimeError("the episode is over; call reset() to play it again")
        self.roller.play_turn(self.batch)
        return self._turn_dict()

    def _answer(self, task: str, query: str, env: str, step: int) -> tuple[str, list[int], None]:
        hits = self.manager.search_sync([query or task], task=env)[0]
        return (hits[0].text if hits else ""), [h.entry_id for h in hits[:1]], None

    def _turn_dict(self) -> dict[str, Any]:
        lv = self.batch.lives[0]
        traj = lv.ep.traj
        last = traj.steps[-1] if traj.steps else None
        return {"turn": lv.turns, "observation": lv.observation, "experience": traj.experience_text,
                "action": last.action if last else "", "reward": last.reward if last else 0.0, "done": lv.done,
                "success": traj.success if lv.done else None,
                "tool_query": last.tool_query if last else "", "tool_answer": last.tool_answer if last else "",
                **({"error": lv.ep.error} if lv.ep.error else {})}

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()
        self.pool.close()


def _load_policy(checkpoint: str) -> Any:
    """The policy's back end: a model folder or a training checkpoint folder (the workbench resolves the embedded
    default, building it on first use, before it makes a player)."""
    from trainers.models import HFBackend

    if not checkpoint:
        raise ValueError("EpisodePlayer needs a policy: a model folder (checkpoint=...) or a back end (actor=...)")
    path = checkpoint
    if (Path(checkpoint) / "policy" / "config.json").exists():
        path = str(Path(checkpoint) / "policy")  # a training checkpoint folder
    import torch

    return HFBackend(path, device="auto" if torch.cuda.is_available() else "cpu", num_threads=1)


def _manager(db_url: str) -> Any:
    import dataclasses

    from core.config import LibraryConfig
    from core.embedding import Embedder
    from core.manager import ExperienceManager
    from core.store import ExperienceStore

    lib = LibraryConfig()
    return ExperienceManager(ExperienceStore(db_url), Embedder(lib.embedding),
                             dataclasses.replace(lib.manager, record_usage=False, random_demote=False), lib.index)

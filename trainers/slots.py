"""Episode specs onto env-pool slots: which tasks a step plays, which pool slot plays each, and the picklable env
factories the pool's worker processes build their envs from. Used by the training loop (trainers/cotrain.py) and by
evaluation (trainers/evaluate.py), beside the Roller that plays the slots (trainers/rollout.py).

The pool's slots are fixed per env (`pool_slots`); `SlotRouter` maps a list of specs onto free slots of the right
env, and `collect` / `play` hand them to `Roller.collect_on` and return the episodes in the specs' order (`collect`
with the call's metrics)."""
from __future__ import annotations

import copy
import dataclasses
import random

from envs.base import task_seed
from envs.pool import TaskMixture
from envs.registry import make_env
from trainers.config import RunConfig
from trainers.rollout import Episode, EpisodeSpec, Roller, derive_seed


def make_specs(cfg: RunConfig, mixture: TaskMixture, rng: random.Random, step: int, *, with_exp: int | None = None) -> list[EpisodeSpec]:
    """tasks_per_step task groups of K rollouts; the first `with_experience` of each group get experience."""
    k = cfg.rollout.group_size
    n_exp = cfg.rollout.with_experience if with_exp is None else with_exp
    specs = []
    drawn: dict[str, set[int]] = {}  # task-set ids already drawn this step, per env
    for t in range(cfg.rollout.tasks_per_step):
        env = mixture.sample()
        task_id = None
        if cfg.env.task_set:
            # Distinct tasks within a step while the set has any left; the set recurs across steps.
            used = drawn.setdefault(env, set())
            left = cfg.env.task_set - len(used)
            task_id = rng.randrange(cfg.env.task_set)
            while left > 0 and task_id in used:
                task_id = rng.randrange(cfg.env.task_set)
            used.add(task_id)
            seed = task_seed(env, task_id)
        else:
            seed = rng.randrange(cfg.env.train_seeds)
        gid = step * cfg.rollout.tasks_per_step + t
        specs += [EpisodeSpec(env, seed, i < n_exp, gid, task_id) for i in range(k)]
    return specs


def pool_slots(cfg: RunConfig) -> list[str]:
    """One slot per concurrent episode of each env in the mixture."""
    per_env = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    return [name for name in cfg.env.names for _ in range(per_env)]


class SlotRouter:
    """Maps episode specs onto pool slots of the right env (the pool's slots are fixed per env)."""

    def __init__(self, slots: list[str]):
        self.by_env: dict[str, list[int]] = {}
        for i, name in enumerate(slots):
            self.by_env.setdefault(name, []).append(i)

    def assign(self, specs: list[EpisodeSpec]) -> list[int]:
        used: dict[str, int] = {}
        out = []
        for s in specs:
            i = used.get(s.env, 0)
            out.append(self.by_env[s.env][i])
            used[s.env] = i + 1
        return out


def env_factory(name: str, cfg: RunConfig):
    """What the pool builds slot `name` from: the env's name, or an `EnvFactory` when the run sets env options."""
    opts = dict(cfg.env.options)
    if cfg.env.max_turns:
        opts.setdefault("max_turns", cfg.env.max_turns)
    return name if not opts else EnvFactory(name, opts)


@dataclasses.dataclass(frozen=True)
class EnvFactory:
    """A picklable env factory (pool workers are separate processes)."""

    name: str
    options: dict

    def __call__(self):
        return make_env(self.name, **self.options)


def collect(roller: Roller, router: SlotRouter, specs: list[EpisodeSpec], step: int, *,
            retrieval: bool) -> tuple[list[Episode], dict[str, float]]:
    """Run `specs` on their env's slots; Roller plays slot i for spec i, so reorder through the router. Returns the
    episodes in the specs' order and the Roller's measurements of this call (rollout/*, critic/*, ...)."""
    slots = router.assign(specs)
    ordered: list[EpisodeSpec | None] = [None] * roller.pool.num_slots
    for s, i in zip(specs, slots):
        ordered[i] = s
    used = [i for i, s in enumerate(ordered) if s is not None]
    metrics: dict[str, float] = {}
    eps = roller.collect_on([(i, ordered[i]) for i in used], step=step, retrieval=retrieval, metrics=metrics)
    by_slot = dict(zip(used, eps))
    return [by_slot[i] for i in slots], metrics


def play(roller: Roller, router: SlotRouter, specs: list[EpisodeSpec], *, step: int, retrieval: bool = True) -> list[Episode]:
    """Play any number of specs through the pool, as many at a time as each env has slots. Each chunk after the
    first samples from its own stream (the Roller seeds a turn's sampling by (seed, step, turn)): without it a task
    played again in a later chunk, as an A/B test's repeats are, would replay the same episode."""
    out: list[Episode] = []
    cap = min(len(v) for v in router.by_env.values())
    for c, s in enumerate(range(0, len(specs), cap)):
        chunk = specs[s:s + cap]
        slots = router.assign(chunk)
        r = roller
        if c:
            r = copy.copy(roller)
            r.seed = derive_seed(roller.seed, "chunk", c)
        out += r.collect_on(list(zip(slots, chunk)), step=step, retrieval=retrieval)
    return out

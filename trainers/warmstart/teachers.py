"""The scripted teachers: per env, the entry a demonstration shows (right, wrong or none) and the expert's
action under it; the demonstrations themselves (collect_demos) and the seeds they are played on."""
from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from typing import Any

from core.types import format_entry_text
from envs.base import keeps_intro
from envs.pool import LocalPool
from trainers.config import ModelSection, RolloutSection
from trainers.rollout import EpisodeSpec, Roller, derive_seed
from trainers.warmstart.common import Demo, Turn, WarmStartConfig, _DELTAS, _INVALID_WORDS


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


# ---------------------------------------------------------------------------- MiniHack

def _minihack_entry(task: str, facts: dict[str, Any], *, wrong: bool, rng: random.Random) -> str:
    """A correct entry states where the staircase is and how to get there; a wrong one points elsewhere."""
    dr, dc = facts["offset"] or (0, 0)
    if wrong:
        choices = [(a, b) for a in range(-4, 5) for b in range(-4, 5) if (a, b) != (0, 0)
                   and (_sign(a), _sign(b)) != (_sign(dr), _sign(dc))]
        if rng.random() < 0.3:  # irrelevant: advice for another kind of task
            return format_entry_text("Pick up the key first", "Locked rooms with a key",
                                     "Pick up the key, stand next to the locked door and apply the key, then walk in.")
        dr, dc = rng.choice(choices)
    # The form the extractor's teacher writes (_lesson), so the actor learns to read what a run's library holds.
    return format_entry_text("Where the staircase is", "Reaching the staircase down", _stairs_lesson(dr, dc))


def _stairs_lesson(dr: int, dc: int) -> str:
    """The content of a MiniHack entry: the env's debrief sentence word for word (the offset and the first
    heading; the extractor copies one span, `claimed_offset` reads it back), nothing before it: each token in front
    puts the copy one place further from the think's quote it repeats."""
    from envs.minihack import stairs_sentence

    s = stairs_sentence(dr, dc)
    return f"{s[0].upper()}{s[1:]}."


def _named_step(env: Any) -> str:
    """The step the observation names once the staircase is on the map ("a step south brings you closer"),
    '' before: the move toward it, read off the prompt."""
    from envs.minihack import heading_word

    for r, line in enumerate(env.grid):
        c = line.find(">")
        if c >= 0:
            return heading_word(r - env.agent_pos[0], c - env.agent_pos[1])
    return ""


# ---------------------------------------------------------------------------- ALFWorld

class _NoPlacement:
    """Priors without placement knowledge: the ALFWorld expert then searches receptacles in the
    order the room lists them, which is what an agent without an entry can do."""

    def __init__(self, priors: Any) -> None:
        self._priors = priors

    def placement(self, object_type: str) -> dict[str, float]:
        return {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._priors, name)


def _alfworld_action(env: Any, informed: bool) -> str:
    from envs.alfworld import alfworld_expert

    if informed:
        return alfworld_expert(env, mode="prior")
    real = env.priors
    env.priors = _NoPlacement(real)
    try:
        return alfworld_expert(env, mode="prior")
    finally:
        env.priors = real


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def household_lesson(object_type: str, receptacle: str, household: int | None) -> str:
    """The content of an ALFWorld entry: where the task's object starts in one household ("In household 17 the watch
    is in drawer 3."), the sentence the entry checker reads back (envs/alfworld/claims.py `claimed_location`). The
    receptacle's name comes last, so the actor's copy of it into "go to drawer 3" lies at the same place in every
    entry; without a household id (random-seed tasks) the sentence is about this game only."""
    head = f"In household {household} the" if household is not None else "The"
    return f"{head} {object_type} is in {receptacle}."


def _alfworld_entry(facts: dict[str, Any], *, wrong: bool, rng: random.Random) -> str:
    """A household's entry (issue 38): a correct one names the receptacle the task's object starts in (the first,
    in the game's name order, of those holding one: where the oracle goes), a wrong one a receptacle of the same
    household that holds none (the entry checker scores it wrong). The form the extractor's teacher writes
    (examples.py `_lesson`), so the actor learns to read what a run's library holds."""
    obj, recep = facts["object"], facts["where"]
    if wrong:
        others = [r for r in facts["receptacles"] if r not in facts["targets"][obj]
                  and r.rpartition(" ")[0] != facts["receptacle"]]
        recep = rng.choice(others) if others else recep
    return format_entry_text(f"Where the {obj} is", f"Finding the {obj}",
                             household_lesson(obj, recep, facts.get("household")))


def _alfworld_facts(env: Any, env_seed: int, household: int | None) -> dict[str, Any]:
    """What the ALFWorld teacher knows of a household before the episode (`household_facts`, the entry checker's
    view) and the receptacle a correct entry names. Read before the env's reset: an official game's facts come
    from a reset of their own."""
    from envs.alfworld.claims import household_facts
    from envs.alfworld.env import _name_key

    hf = household_facts(env, env_seed)
    obj = hf["object"]
    return {"object": obj, "receptacle": hf["receptacle"], "household": household,
            "targets": {t: list(r) for t, r in hf["targets"].items()}, "receptacles": list(hf["receptacles"]),
            "where": sorted(hf["targets"][obj], key=_name_key)[0] if hf["targets"][obj] else ""}


def _alfworld_reader(env: Any, named: str) -> str:
    """The ALFWorld expert under an entry that names `named`: walk there first (and open it) while holding
    nothing and before it has been looked into; then, from what it has seen, the searcher without placement
    knowledge (it takes the object from there under a correct entry, and searches the rest in listing order
    under a wrong one: the recovery)."""
    view = env.world
    if named and view.holding is None and named not in env.observed and named in view.receptacles:
        if named not in view.here:
            return f"go to {named}"
        if named in view.openable and named not in view.opened:
            return f"open {named}"
    return _alfworld_action(env, informed=False)


# ---------------------------------------------------------------------------- episodes

def _condition(rng: random.Random, cfg: WarmStartConfig) -> str:
    u = rng.random()
    if u < cfg.share_no_entry:
        return "none"
    if u < cfg.share_no_entry + cfg.share_correct_entry:
        return "correct"
    return "wrong"


class _Teacher:
    """Per env: the entry for a task and condition, and the expert's action under that condition.

    MiniHack: with a correct entry the expert walks where it points until the staircase is in view
    (then straight to it); with a wrong one it also walks where the entry points, and when that leads
    nowhere it explores as with no entry (so a demonstration shows recovering from a wrong lesson);
    with none it explores."""

    def __init__(self, env: Any, *, task_ids: bool = False, levels: Any = None) -> None:
        from envs.entry_check import EntryChecker

        self.env = env
        self.minihack = env.name.startswith("minihack/")
        self.task_ids = task_ids
        self.task = ""
        self.facts: dict[str, Any] = {}
        self.heading = ""
        self.following = False  # walking where the entry points (MiniHack)
        self.named = ""  # the receptacle the entry places the task's object in (ALFWorld), "" without one
        self._last_pos: tuple[int, int] | None = None  # where the agent stood when it last took the entry's heading
        # learns each level with a long turn budget; teachers of one pool share one (`levels`)
        self._levels = (levels if levels is not None else EntryChecker()) if self.minihack else None

    def start(self, seed: int, condition: str, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        """Reset the env on `seed` (with task_ids: on task instance `seed`); returns (first observation,
        entry text, facts). `self.task` is the task text the actor sees."""
        from envs.alfworld.claims import claimed_location
        from envs.base import instance_task, task_seed

        env_seed = task_seed(self.env.name, seed) if self.task_ids else seed
        if self.minihack:
            self.task = instance_task(self.env.name, seed, self.env.task) if self.task_ids else self.env.task
            self.facts = self._levels.level(self.env.name, env_seed)
            obs, _ = self.env.reset(seed=env_seed)
            entry = ""
            self.heading, self.following, self._last_pos = "", False, None
            if condition != "none" and self.facts["offset"] is not None:
                entry = _minihack_entry(self.task, self.facts, wrong=condition == "wrong", rng=rng)
                claim = _claimed(entry)
                if claim is not None:  # an irrelevant wrong entry claims nothing: the expert ignores it
                    from envs.minihack import first_heading

                    self.heading, self.following = first_heading(*claim), True
        else:
            self.facts = _alfworld_facts(self.env, env_seed, seed if self.task_ids else None)
            obs, _ = self.env.reset(seed=env_seed)
            entry = "" if condition == "none" else _alfworld_entry(self.facts, wrong=condition == "wrong", rng=rng)
            self.named = (claimed_location(entry, self.facts["object"]) or "") if entry else ""
        self.task = instance_task(self.env.name, seed, self.env.task) if self.task_ids else self.env.task
        return obs, entry, dict(self.facts)

    def action(self, condition: str) -> str:
        if self.minihack:
            from envs.experts import expert_action

            env = self.env
            if "cannot escape" in env.message.lower():
                return expert_action(env)
            seen = _named_step(env)
            if seen:  # the observation names the step ("a step south brings you closer"): take it
                return seen
            if self.following:
                # A reader of the entry: its heading, every turn until the staircase is in view. A bump (the last
                # step left the agent where it was and no monster stands in the way: a wall) ends the reading;
                # then it explores.
                dr, dc = _DELTAS[self.heading]
                ahead = (env.agent_pos[0] + dr, env.agent_pos[1] + dc)
                if self._last_pos != env.agent_pos or ahead in env.monsters:
                    self._last_pos = env.agent_pos
                    return self.heading
            self.following = False
            return expert_action(env)
        return _alfworld_reader(self.env, self.named)

    def random_action(self, rng: random.Random) -> str:
        if self.minihack:
            return rng.choice(_INVALID_WORDS) if rng.random() < 0.35 else rng.choice(list(_DELTAS))
        # ALFWorld is played within its admissible commands (CONSTRAINED_ENVS): a noisy turn is one of them
        adm = [a for a in self.env._state.admissible_commands if a not in ("help", "inventory")]
        return rng.choice(adm) if adm else "look"


def _claimed(entry: str) -> tuple[int, int] | None:
    from envs.minihack import claimed_offset

    return claimed_offset(entry)


class TeacherEnv:
    """An env with its scripted teacher beside it, as a pool slot (envs.pool.LocalPool) the Roller plays.

    Reset options: "condition" (none / correct / wrong: the entry the episode shows), "entry_seed" (the random
    choices of a wrong entry and of noise), "noise_eps" (a scripted episode's share of random actions). Its reset
    info names the entry ("experience": the Roller shows it, no retrieval), and every observation's info the
    teacher's action for that state ("expert_action": the DAgger label) and the action a scripted episode takes
    ("expert_play": the label, or a random one)."""

    def __init__(self, cfg: WarmStartConfig, name: str, levels: Any = None) -> None:
        self.env = _make_env(cfg, name)
        self.teacher = _Teacher(self.env, task_ids=cfg.task_ids, levels=levels)
        self.name, self.action_format, self.max_turns = name, self.env.action_format, self.env.max_turns
        self.keep_intro = keeps_intro(self.env)
        self.condition, self.entry, self.facts, self.eps = "none", "", {}, 0.0
        self.rng = random.Random(0)

    @property
    def task(self) -> str:
        return self.teacher.task or self.env.task

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        o = options or {}
        self.condition, self.eps = str(o.get("condition", "none")), float(o.get("noise_eps", 0.0))
        self.rng = random.Random(o.get("entry_seed", seed))
        obs, self.entry, self.facts = self.teacher.start(int(seed or 0), self.condition, self.rng)
        info: dict[str, Any] = {"experience": self.entry, **self._labels()}
        if not self.teacher.minihack:  # what a constrained reply may be on the first turn (CONSTRAINED_ENVS)
            info["admissible_actions"] = list(self.env._state.admissible_commands)
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, term, trunc, info = self.env.step(action)
        return obs, reward, term, trunc, info if term or trunc else {**info, **self._labels()}

    def _labels(self) -> dict[str, str]:
        label = self.teacher.action(self.condition)  # once per state: the teacher keeps track of its reading
        play = self.teacher.random_action(self.rng) if self.eps > 0 and self.rng.random() < self.eps else label
        return {"expert_action": label, "expert_play": play}

    def close(self) -> None:
        self.env.close()


# Env families a model plays within the env's admissible commands (rollout.constrain_actions) in the warm start's
# DAgger and evaluation rollouts and the entry probe: ALFWorld lists every valid command, and a tiny policy that
# types them freely had a quarter of its actions refused (benchmarks/results/entry_probe_alfworld_curriculum.md).
# Runs on an ALFWorld warm start set rollout.constrain_actions: true (configs/alfworld_recurring_cpu.yaml).
CONSTRAINED_ENVS = ("alfworld/",)

# (env name, seed or task id, condition, noise share)
TeacherSpec = tuple[str, int, str, float]


def play_episodes(cfg: WarmStartConfig, specs: Sequence[TeacherSpec], *, source: str, seed: int, actor: Any = None,
                  temperature: float = 0.0, max_turns: int | None = None, max_new_tokens: int | None = None,
                  tick: Callable[[int], None] | None = None) -> list[Demo]:
    """Episodes on (env, seed, condition, noise) with the teacher labelling every state, played by the Roller
    (trainers/rollout.py): by `actor` (a back end; DAgger and evaluation, `cfg.rollout_batch` episodes in lockstep)
    or, with none, by the scripted expert (demonstrations). `max_turns` cuts episodes short (they count as
    failures); `max_new_tokens` per reply defaults to `cfg.action_max_new_tokens`."""
    from envs.entry_check import EntryChecker

    batch = cfg.rollout_batch if actor is not None else 1
    ac = ModelSection(max_new_tokens=max_new_tokens or cfg.action_max_new_tokens, temperature=temperature)
    levels = EntryChecker()
    out: list[Demo | None] = [None] * len(specs)
    for name in dict.fromkeys(sp[0] for sp in specs):  # one pool per env, specs in their given order
        mine = [i for i, sp in enumerate(specs) if sp[0] == name]
        rc = RolloutSection(history_turns=cfg.history_turns, history_chars=cfg.history_chars,
                            search_and_ask=1 if cfg.allow_tool else 0, reuse_cache=False,
                            constrain_actions=actor is not None and name.startswith(CONSTRAINED_ENVS))
        with LocalPool([functools.partial(TeacherEnv, cfg, name, levels)] * min(batch, len(mine))) as pool:
            # search-and-ask (cfg.allow_tool) finds nothing here: the warm start has no library
            roller = Roller(actor, pool, None, rollout_cfg=rc, actor_cfg=ac, max_turns=max_turns or 0, seed=seed,
                            tool_fn=(lambda *a: ("", [], None)) if cfg.allow_tool else None)
            for c in range(0, len(mine), batch):
                chunk = mine[c : c + batch]
                eps = roller.collect([EpisodeSpec(name, specs[i][1], False, i, options={
                    "condition": specs[i][2], "noise_eps": specs[i][3], "entry_seed": derive_seed(seed, *specs[i][:3])})
                    for i in chunk], step=c // batch)
                for k, (i, ep) in enumerate(zip(chunk, eps)):
                    out[i] = _demo(pool.envs[k], ep, source, model=actor is not None)
                if tick:
                    tick(len(chunk))
    return [d for d in out if d is not None]


def _demo(te: TeacherEnv, ep: Any, source: str, *, model: bool) -> Demo:
    """A played episode as a demonstration: each state with the history before it, the teacher's label and the action."""
    if ep.error:
        raise RuntimeError(f"warm start: {ep.spec.env} seed {ep.spec.seed} failed: {ep.error.splitlines()[0]}")
    turns: list[Turn] = []
    history: list[tuple[str, str]] = []
    for st in ep.traj.steps:
        turns.append(Turn(st.observation, list(history), st.info.get("expert_action", ""), st.action))
        history.append((st.observation, st.action))
    return Demo(ep.spec.env, ep.spec.seed, ep.traj.task, te.action_format, te.condition, te.entry, turns, ep.traj.success,
                source, dict(te.facts), keep_intro=te.keep_intro, invalid_actions=ep.invalid_actions if model else 0,
                final_observation=ep.traj.final_observation)


def collect_demos(cfg: WarmStartConfig, *, tick: Callable[[int], None] | None = None) -> list[Demo]:
    """Scripted-expert episodes from every env of `cfg` (step 1), seeds disjoint from evaluation's."""
    demos: list[Demo] = []
    for ei, name in enumerate(cfg.envs):
        rng = random.Random(f"{cfg.seed}/demos/{name}")
        specs: list[TeacherSpec] = []
        sources: list[str] = []
        for i in range(cfg.demo_episodes):
            noisy = rng.random() < cfg.noisy_share
            specs.append((name, _demo_seed(cfg, ei, i), _condition(rng, cfg), cfg.noise_eps if noisy else 0.0))
            sources.append("noisy" if noisy else "expert")
        for d, src in zip(play_episodes(cfg, specs, source="expert", seed=cfg.seed, tick=tick), sources):
            d.source = src
            demos.append(d)
    return demos


def _make_env(cfg: WarmStartConfig, name: str) -> Any:
    from envs.registry import make_env

    return make_env(name, max_turns=cfg.max_turns) if cfg.max_turns else make_env(name)


# With task_ids these numbers are task instance ids (ids from 1000 on: never one of a run's tasks), else env seeds.
def _demo_seed(cfg: WarmStartConfig, env_index: int, i: int) -> int:
    if cfg.task_ids:
        return 1_000 + 100_000 * (cfg.seed * 10 + env_index) + i
    return 1_000_000 * (cfg.seed + 1) + 10_000 * env_index + i


def _dagger_seed(cfg: WarmStartConfig, env_index: int, i: int) -> int:
    if cfg.task_ids:
        return 1_000 + 100_000 * (cfg.seed * 10 + env_index) + 50_000 + i
    return 1_000_000 * (cfg.seed + 1) + 10_000 * env_index + 5_000 + i


def _eval_seed(env_index: int, i: int) -> int:
    return 900_000_000 + 10_000 * env_index + i  # held out: never a demo or DAgger seed (or task id)


# ============================================================================ SFT examples


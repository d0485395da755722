"""Episodes: stored ones replayed, and live play step by step, by the scripted expert or the trainer's policy."""
from __future__ import annotations

import html
import importlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from app import views
from app.service.common import ENV_LOCK, _err, _maybe_id, task_noun, UserInputError, whole_number
from core import build_progress
from core.store import StoreError
from envs.base import instance_task, task_id_of, task_seed
from envs.registry import list_envs
from trainers.player import EpisodePlayer

# What the demo opens on when no run has been made yet: the default run's config (its recurring dark rooms).
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "minihack_room_cpu.yaml"


class TaskPlayer(EpisodePlayer):
    """An EpisodePlayer on one recurring task (env.task_set) of any env: task id N is played as a run plays it, its
    instance seed and its id in the task text, which keys retrieval ("Dungeon N: ..." on MiniHack, "Household N: ..."
    on ALFWorld: envs/base.py instance_task); `max_turns` caps the episode as the run's env.max_turns does (0: the
    env's own limit)."""

    def __init__(self, env_name: str, task_id: int | None, *, max_turns: int = 0, **kw: Any):
        seed = int(kw.pop("seed", 0))
        super().__init__(env_name, task_seed(env_name, task_id) if task_id is not None else seed, task_id=task_id,
                         max_turns=max_turns, **kw)


def _run_settings(run: dict[str, Any]) -> dict[str, Any]:
    """A run's env (its first), recurring task set, turn limit and whether its policy's replies are decoded within the
    env's admissible actions (rollout.constrain_actions, as configs/alfworld_recurring_cpu.yaml's), read from its
    stored config (YAML)."""
    import yaml

    try:
        cfg = yaml.safe_load(run.get("config") or "") or {}
    except yaml.YAMLError:
        cfg = {}
    env_cfg = cfg.get("env") if isinstance(cfg, dict) and isinstance(cfg.get("env"), dict) else {}
    names = env_cfg.get("names")
    names = list(names) if isinstance(names, (dict, list)) else []
    env = str(names[0]) if names else str(run.get("env") or "").split(",")[0].strip()

    def whole(x: Any) -> int:
        return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else 0

    rollout = cfg.get("rollout") if isinstance(cfg, dict) and isinstance(cfg.get("rollout"), dict) else {}
    return {"env": env, "task_set": whole(env_cfg.get("task_set")), "max_turns": whole(env_cfg.get("max_turns")),
            "constrain_actions": rollout.get("constrain_actions") is True}

@dataclass
class _Play:
    player: Any
    mode: str
    turns: list[dict[str, Any]] = field(default_factory=list)
    experience: str = ""
    note: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def done(self) -> bool:
        return bool(self.turns and self.turns[-1].get("done"))


def _episode_status(play: _Play) -> str:
    last = play.turns[-1]
    if last.get("done"):
        return f"episode over after {last['turn']} turns: {'success' if last.get('success') else 'failure'}"
    return f"turn {last['turn']}"


def demo_actor_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """EpisodePlayer arguments for the demo's configured actor: its back end (an openai endpoint, say), its
    folder (tokenizer and chat template), prompt style and whether its replies are constrained to the env's
    admissible actions (`constrain_actions`, as rollout.constrain_actions)."""
    from core.config import ConfigError, from_dict
    # the trainer is optional in the workbench (common.trainer_available): imported only where it is used
    from trainers.config import ModelSection
    from trainers.models import inference_backend

    spec = dict(spec)
    style = spec.pop("prompt_style", "compact")
    constrain = spec.pop("constrain_actions", False)
    if not isinstance(constrain, bool):
        raise ConfigError(f"demo actor: constrain_actions must be true or false, not {constrain!r}")
    section = from_dict(ModelSection, spec)
    return {"checkpoint": section.path, "prompt_style": style, "constrain_actions": constrain,
            "actor": inference_backend(section, section.path, num_threads=1)}


class DemoPart:
    """The Workbench's demo methods (app/service/__init__.py composes the Workbench from these parts; its state
    is set up in Workbench.__init__)."""

    def episodes(self, run_id: Any = None, ab_id: Any = None, limit: int = 200) -> pd.DataFrame:
        run_id, ab_id = (None if isinstance(x, str) and not x.strip() else x for x in (run_id, ab_id))
        ids = [_maybe_id(x) for x in (run_id, ab_id)]
        if any(i is None and x not in (None, "") for i, x in zip(ids, (run_id, ab_id))):
            return views.episodes_table([])  # an id no run or test can have: nothing to show (not every episode)
        return views.episodes_table(self.store.list_trajectories(run_id=ids[0], ab_test_id=ids[1], limit=limit))

    def replay(self, traj_id: Any) -> str:
        try:
            t = self.store.get_trajectory(whole_number(traj_id, "episode id"))
        except UserInputError as e:
            return f"<em>give an episode id from the table ({html.escape(str(e))})</em>"
        except StoreError as e:
            return f"<div class='comprl-error'>{html.escape(str(e))}</div>"
        return views.trajectory_html(t)

    def source_episode_html(self, entry_id: Any) -> str:
        """The episode an extracted entry was written from, as a replay."""
        try:
            e = self.store.get(self._entry_id(entry_id))
        except (UserInputError, StoreError) as err:
            return f"<div class='comprl-error'>{html.escape(str(err))}</div>"
        if e.source_episode_id is None:
            return f"<em>entry #{e.id} was not written from a stored episode</em>"
        return self.replay(e.source_episode_id)

    def envs(self) -> list[str]:
        return list_envs()

    def policy_status(self) -> str:
        try:
            importlib.import_module("trainers.models")  # noqa: B018
        except Exception as e:
            return (f"Live policy play needs the trainer's models (`trainers.models` is not importable here: "
                    f"{type(e).__name__}: {e}). Watch the scripted expert instead, or replay stored episodes.")
        return "Live policy play is available."

    def _retrieved_for(self, env_name: str, task: str) -> tuple[str, str]:
        with self.searching() as m:
            hits = m.search_sync([task], k=1, task=env_name)[0]
        if not hits:
            return "", "the library has no entry for this env"
        return hits[0].text, f"entry #{hits[0].entry_id}, similarity {hits[0].score:.2f} (the expert does not read it)"

    def _run_policy(self, run: dict[str, Any] | None) -> tuple[str | None, str]:
        """The policy the demo opens on: (model folder, or "" for the default, or None for none; what it is)."""
        try:
            importlib.import_module("trainers.models")
        except Exception:
            return None, "the trainer's models are not importable here"
        if run is not None and run.get("checkpoint_dir"):
            from trainers.engine import latest_checkpoint  # the one place that knows a checkpoint folder's layout

            ck = latest_checkpoint(Path(run["checkpoint_dir"]))
            if ck is not None and (ck / "policy" / "config.json").is_file():
                return str(ck), f"run #{run['id']}'s policy at its latest checkpoint ({ck.name})"
        if self.demo_actor:
            return "", "the configured demo actor"
        if build_progress.building(self.data_dir) is None and (self.data_dir / "models" / "policy" / "config.json").is_file():
            return "", "the embedded default policy"
        return None, ("the embedded default policy is not built yet (a run builds it; choosing 'policy' and Start builds "
                      "it here, which takes minutes)")

    def _seen_task(self, run_id: int | None, env: str, task_set: int) -> int | None:
        """A recurring task that the library holds an entry for (the run's own entries first, then the most successes,
        the most retrieved, the lowest id): its id, or None when there is none."""
        page = self.store.list_entries(env=env, sort="successes", descending=True, limit=2000)
        seen = [(run_id is not None and e.run_id == run_id, e.successes, e.retrieved_count, -tid) for e in page.entries
                if (tid := task_id_of(e.task)) is not None and (not task_set or tid < task_set)]
        return -max(seen)[3] if seen else None

    def demo_defaults(self) -> dict[str, Any]:
        """What the Agent demo opens on: the newest run's env and a recurring task of it that its library holds an
        entry for, played by that run's policy (else the embedded default if built, else the scripted expert),
        with the library; with no run yet, the default config's env. `note` says which and why."""
        runs = self.store.list_runs()
        run = runs[0] if runs else None
        envs = self.envs()
        if run is not None:
            settings, source = _run_settings(run), f"the newest run, #{run['id']} {run['name']}"
        else:
            settings = _run_settings({"config": DEFAULT_CONFIG.read_text() if DEFAULT_CONFIG.is_file() else ""})
            source = f"no run yet: the default config ({DEFAULT_CONFIG.name})"
        env = settings["env"] if settings["env"] in envs else ("minihack/Room-5x5" if "minihack/Room-5x5" in envs else
                                                                (envs[0] if envs else ""))
        task_ids = bool(settings["task_set"]) and env == settings["env"]
        seed, task_note = 0, ""
        if task_ids:
            seen = self._seen_task(run["id"] if run is not None else None, env, settings["task_set"])
            noun = task_noun(env)
            if seen is not None:
                seed, task_note = seen, f"task {seen} ({noun} {seen}), one its library holds an entry for"
            else:
                task_note = f"task 0 ({noun} 0; its library has no entry for any of its tasks yet)"
        ckpt, who = self._run_policy(run)
        mode = "policy" if ckpt is not None else "expert"
        if mode == "expert":
            who = f"the scripted expert ({who})"
        where = f"`{env}`" + (f", recurring {task_note}" if task_ids else ", seed 0")
        turns = f", at most {settings['max_turns']} turns" if settings["max_turns"] and env == settings["env"] else ""
        constrain = settings["constrain_actions"] and env == settings["env"]
        how = ", its replies within the env's admissible actions as the run's were" if constrain and mode == "policy" else ""
        note = f"Opens on {source}: {where}{turns}; {who} plays{how}, with the current library. Press Start."
        return {"mode": mode, "env": env, "seed": seed, "task_ids": task_ids,
                "max_turns": settings["max_turns"] if env == settings["env"] else 0, "checkpoint": ckpt or "",
                "library": "current", "constrain_actions": constrain, "note": note}

    def demo_start(self, token: str | None, mode: str, env_name: str, seed: Any, checkpoint: str = "",
                   library: str = "current", task_ids: bool = False, max_turns: Any = 0,
                   constrain_actions: bool = False) -> tuple[str, str, str]:
        """(session token, episode HTML, status). mode: 'expert' or 'policy'. `task_ids`: the seed is a recurring
        task id, on any env, as runs with env.task_set name their tasks ("Dungeon N: ..." on MiniHack, "Household N:
        ..." on ALFWorld, which keys retrieval; the status quotes the task text); `max_turns`: the episode's turn
        limit (0: the env's); `constrain_actions`: the policy's replies are decoded within the env's admissible
        actions, as a run with rollout.constrain_actions plays (the configured demo actor's own setting stands)."""
        with self._sessions_lock:
            old = self._plays.pop(token, None) if token else None
        if old is not None:
            with ENV_LOCK:
                old.player.close()
        try:
            seed_i = whole_number(seed, "the task id" if task_ids else "the task seed", lo=0)
            turns = whole_number(max_turns, "max turns", lo=0) if max_turns not in (None, "") else 0
        except UserInputError as e:
            return token or "", views.live_episode_html([]), _err(str(e))
        if env_name not in self.envs():
            return token or "", views.live_episode_html([]), _err(f"unknown env {env_name!r}")
        use_library = library != "none"
        try:
            if mode == "policy":
                try:
                    importlib.import_module("trainers.models")
                except Exception:
                    return token or "", views.live_episode_html([]), _err(self.policy_status())
                ckpt = (checkpoint or "").strip()
                if ckpt and not Path(ckpt).is_dir():
                    return token or "", views.live_episode_html([]), _err(f"checkpoint {ckpt!r} is not a model folder")
                b = build_progress.building(self.data_dir)
                if not ckpt and b is not None:
                    # The default models are being built (one build at a time): say so now, rather than hold this
                    # request for the rest of the build.
                    return token or "", views.live_episode_html([]), _err(
                        f"the default models are being built ({build_progress.describe(b)}); the policy can play once "
                        "they are ready. Watch the scripted expert meanwhile, or name a model folder.")
                extra: dict[str, Any] = {"constrain_actions": bool(constrain_actions)}
                if self.demo_actor and not ckpt:
                    extra = demo_actor_kwargs(self.demo_actor)
                    ckpt = extra.pop("checkpoint")
                    extra["constrain_actions"] = extra["constrain_actions"] or bool(constrain_actions)
                if not ckpt:  # the embedded default policy: built here on first use (one build at a time)
                    from trainers.config import resolve_model_path
                    from trainers.warmstart import ensure_models

                    ensure_models(self.data_dir)
                    ckpt = str(resolve_model_path("embedded:policy", self.data_dir))
                player = TaskPlayer(env_name, seed_i if task_ids else None, seed=seed_i, max_turns=turns,
                                    db_url=self.db_url, checkpoint=ckpt, use_library=use_library, **extra)
                play = _Play(player, "policy")
            else:
                player = TaskPlayer(env_name, seed_i if task_ids else None, seed=seed_i, max_turns=turns, expert=True,
                                    use_library=False)
                play = _Play(player, "expert")
            with ENV_LOCK:  # builds the env and resets it (app/service/common.py)
                first = play.player.reset()
            if mode != "policy" and use_library:
                task = player.task
                play.experience, play.note = self._retrieved_for(env_name, task) if task else ("", "")
                player.experience = play.experience
                first["experience"] = play.experience
            elif mode == "policy":
                play.experience = first.get("experience", "")
            play.turns.append(first)
        except Exception as e:  # an env that cannot start here (missing data, Docker) says why
            return token or "", views.live_episode_html([]), _err(f"could not start {env_name}: {type(e).__name__}: {e}")
        token, _ = self._session(self._plays, None, lambda: play)
        who = "the scripted expert" if mode != "policy" else "the policy"
        what = f"task {seed_i} (recurring)" if task_ids else f"seed {seed_i}"
        shown = ("" if not use_library else "; the library's entry for it is shown" if play.experience
                 else "; no library entry for it")
        if mode == "policy" and player.roller.rc.constrain_actions:
            shown += "; its replies within the env's admissible actions"
        said = f" · task text “{player.task}”" if task_ids and player.task else ""
        return (token, views.live_episode_html(play.turns, play.experience, play.note),
                f"{who} on {env_name}, {what}: ready{shown}{said}")

    def demo_step(self, token: str | None) -> tuple[str, str, bool]:
        """(episode HTML, status, done): one more turn of the session's episode."""
        with self._sessions_lock:
            play = self._plays.get(token or "")
        if play is None:
            return views.live_episode_html([]), "start an episode first", True
        with play.lock:
            if play.done:
                return views.live_episode_html(play.turns, play.experience, play.note), _episode_status(play), True
            try:
                # Under ENV_LOCK too: a policy's turn holds it through its generation as well (the player does both
                # in one call), which at worst delays another env's build by one turn.
                with ENV_LOCK:
                    turn = play.player.step()
            except Exception as e:
                return (views.live_episode_html(play.turns, play.experience, play.note),
                        _err(f"the episode stopped: {type(e).__name__}: {e}"), True)
            play.turns.append(turn)
            if play.mode == "policy" and turn.get("experience") and not play.experience:
                play.experience = turn["experience"]
            return views.live_episode_html(play.turns, play.experience, play.note), _episode_status(play), play.done

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
from app.service.common import ENV_LOCK, _err, _maybe_id, UserInputError, whole_number
from core import build_progress
from core.store import StoreError
from envs.registry import list_envs
from trainers.player import EpisodePlayer

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

    def demo_start(self, token: str | None, mode: str, env_name: str, seed: Any, checkpoint: str = "",
                   library: str = "current") -> tuple[str, str, str]:
        """(session token, episode HTML, status). mode: 'expert' or 'policy'."""
        with self._sessions_lock:
            old = self._plays.pop(token, None) if token else None
        if old is not None:
            with ENV_LOCK:
                old.player.close()
        try:
            seed_i = whole_number(seed, "the task seed", lo=0)
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
                extra: dict[str, Any] = {}
                if self.demo_actor and not ckpt:
                    extra = demo_actor_kwargs(self.demo_actor)
                    ckpt = extra.pop("checkpoint")
                if not ckpt:  # the embedded default policy: built here on first use (one build at a time)
                    from trainers.config import resolve_model_path
                    from trainers.warmstart import ensure_models

                    ensure_models(self.data_dir)
                    ckpt = str(resolve_model_path("embedded:policy", self.data_dir))
                player = EpisodePlayer(env_name, seed_i, db_url=self.db_url, checkpoint=ckpt,
                                    use_library=use_library, **extra)
                play = _Play(player, "policy")
            else:
                player = EpisodePlayer(env_name, seed_i, expert=True, use_library=False)
                play = _Play(player, "expert")
            with ENV_LOCK:  # builds the env and resets it (app/service/common.py)
                first = play.player.reset()
            if mode != "policy" and use_library:
                task = getattr(player.env, "task", "")
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
        return token, views.live_episode_html(play.turns, play.experience, play.note), f"{who} on {env_name}, seed {seed_i}: ready"

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

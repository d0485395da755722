"""A/B tests of two library states on held-out tasks: create (validated), list, details with the paired test."""
from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd

from app import views
from app.service.common import (
    _err, _ok, parse_ids, parse_seeds, _tail, task_noun, trainer_available, UserInputError, whole_number,
)
from app.service.demo import DEFAULT_CONFIG, _run_settings
from core import build_progress, library_io
from core.config import ARM_KINDS, AbTestConfig, ab_sampling_error
from core.metrics import mcnemar_test, paired_outcomes
from core.store import ExperienceStore, StoreError
from envs.registry import list_envs


def ab_pairs(store: ExperienceStore, test: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(an A/B test's episodes, oldest first, each with its "arm"; McNemar's paired test, or None before both arms
    have played). The evaluator plays arm A's episodes, then arm B's, `episodes_per_task` per seed each, and stores
    each arm's at once: the first n episodes of the test are A's. Pairs are matched by (seed, which of its episodes):
    the k-th episode of a seed in A with the k-th in B, which played the same sampling stream (trainers/evaluate.py
    ab_specs). (The workbench and `comprl eval --ab-test` both report it.)"""
    c = test["config"]
    n = len(c.get("seeds", [])) * int(c.get("episodes_per_task", 1))
    eps = sorted(store.list_trajectories(ab_test_id=test["id"], limit=2 * n + 10), key=lambda t: t["id"])
    for i, t in enumerate(eps):
        t["arm"] = "A" if i < n else "B"
    if not n or len(eps) < 2 * n:
        return eps, None
    by_arm: dict[str, dict[tuple[int, int], bool]] = {"A": {}, "B": {}}
    seen: Counter = Counter()
    for t in eps:
        key = (t["arm"], t["seed"])
        by_arm[t["arm"]][(t["seed"], seen[key])] = t["success"]
        seen[key] += 1
    counts = paired_outcomes(by_arm["A"], by_arm["B"])
    p, method = mcnemar_test(counts["a_only"], counts["b_only"])
    return eps, {**counts, "p_value": p, "method": method}


class AbTestsPart:
    """The Workbench's abtests methods (app/service/__init__.py composes the Workbench from these parts; its state
    is set up in Workbench.__init__)."""

    def _arm(self, kind: str, arg: str, file_path: str | None, label: str) -> dict[str, Any]:
        if kind not in ARM_KINDS:
            raise UserInputError(f"arm {label}: kind must be one of {', '.join(ARM_KINDS)}")
        arm: dict[str, Any] = {"kind": kind}
        if kind == "version":
            try:
                v = whole_number(arg, f"arm {label}: the library version", lo=0)
            except UserInputError:
                raise UserInputError(f"arm {label}: give the library version as a number") from None
            current = self.store.library_version()
            if not 0 <= v <= current:
                raise UserInputError(f"arm {label}: library version {v} does not exist (the library is at {current})")
            arm["version"] = v
        elif kind == "file":
            if not file_path or not Path(file_path).is_file():
                raise UserInputError(f"arm {label}: upload an exported library file (JSONL)")
            src = Path(file_path)
            if src.stat().st_size > self.upload_cap_bytes:
                raise UserInputError(f"arm {label}: {src.name} is over the upload cap of {views.fmt_bytes(self.upload_cap_bytes)}")
            try:
                library_io.parse_library_lines(library_io.read_library_file(src))
            except library_io.LibraryFileError as e:
                raise UserInputError(f"arm {label}: {src.name}: {e}") from None
            dest = self.data_dir / "ab" / f"arm-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}-{label}.jsonl"
            shutil.copyfile(src, dest)
            arm["path"] = str(dest)
        elif kind in ("minus", "plus"):
            ids = parse_ids(arg)
            if not ids:
                raise UserInputError(f"arm {label}: name the entries to {'leave out' if kind == 'minus' else 'add'} by id")
            found = self.store.get_many(ids)
            missing = [i for i in ids if i not in found]
            if missing:
                raise UserInputError(f"arm {label}: no entry with id {missing[0]}")
            arm["ids"] = ids
        return arm

    def create_ab_test(self, name: str, env: str, seeds: str, checkpoint: str, max_turns: Any,
                       a_kind: str, a_arg: str, a_file: str | None, b_kind: str, b_arg: str, b_file: str | None,
                       task_ids: bool = False, episodes_per_task: Any = 1, decoding: str = "greedy",
                       constrain_actions: bool = False) -> tuple[str, int | None]:
        """`task_ids`: the seeds are recurring task ids, on any env, as runs with env.task_set name them ("Dungeon 3:
        ..." on MiniHack, "Household 3: ..." on ALFWorld), so a library written by such a run is retrieved for its own
        tasks. `episodes_per_task` > 1 plays each task that many times per arm, sampled (`decoding`) at the rollout
        temperature, paired across the arms. `constrain_actions`: the policy's replies are decoded within the env's
        admissible actions, as a run with rollout.constrain_actions plays (ALFWorld's recurring config)."""
        try:
            if not (name or "").strip():
                raise UserInputError("give the test a name")
            if env not in list_envs():
                raise UserInputError(f"unknown env {env!r}; choose one of {', '.join(list_envs())}")
            seed_list = parse_seeds(seeds)
            ckpt = (checkpoint or "").strip()
            if ckpt and not Path(ckpt).is_dir():
                raise UserInputError(f"checkpoint {ckpt!r} is not a model folder; leave it empty for the default policy")
            mt: int | None = None
            if max_turns not in (None, "", 0):
                mt = whole_number(max_turns, "max turns", lo=1)
            reps = whole_number(episodes_per_task if episodes_per_task not in (None, "") else 1, "episodes per task", lo=1)
            why = ab_sampling_error(reps, decoding)
            if why:
                raise UserInputError(why)
            arms = {"A": self._arm(a_kind, a_arg, a_file, "A"), "B": self._arm(b_kind, b_arg, b_file, "B")}
            if arms["A"] == arms["B"]:
                raise UserInputError("the two arms are the same library; change one of them")
        except UserInputError as e:
            return _err(str(e)), None
        ok, why = trainer_available()
        if not ok:
            return _err(f"cannot run the evaluation: {why}"), None
        config = dataclasses.asdict(AbTestConfig(env=env, seeds=seed_list, arms=arms, checkpoint=ckpt, max_turns=mt,
                                                 task_ids=bool(task_ids), episodes_per_task=reps, decoding=decoding,
                                                 constrain_actions=bool(constrain_actions)))
        ab_id = self.store.create_ab_test(name.strip(), config)
        launched = self._spawn("ab", ["eval", "--ab-test", str(ab_id)], f"ab-{ab_id}.log", ab_id=ab_id)
        # The brief's place for the log: <data-dir>/ab/<id>.log (a link to the file being written).
        link = self.data_dir / "ab" / f"{ab_id}.log"
        if not link.exists():
            try:
                link.symlink_to(launched.log_path)
            except OSError:
                pass
        return _ok(f"A/B test {ab_id} started: {len(seed_list) * reps} episodes per arm (process {launched.proc.pid})"), ab_id

    def ab_defaults(self) -> dict[str, Any]:
        """What the A/B tab opens on: the newest run with a recurring task set (env.task_set) on an env listed here —
        its env, its task ids (the first 16 at most), its turn limit — else the default config's (the recurring dark
        rooms). `note` says which."""
        envs = list_envs()
        for run in self.store.list_runs():
            settings = _run_settings(run)
            if settings["task_set"] and settings["env"] in envs:
                source = f"the newest run with recurring tasks, #{run['id']} {run['name']}"
                break
        else:
            settings = _run_settings({"config": DEFAULT_CONFIG.read_text() if DEFAULT_CONFIG.is_file() else ""})
            source = f"no run with recurring tasks yet: the default config ({DEFAULT_CONFIG.name})"
        env, n = settings["env"], min(settings["task_set"], 16)
        if env not in envs or not n:  # no default config here: the tab as it was, env seeds
            return {"env": None, "seeds": "0-15", "task_ids": False, "max_turns": 0, "constrain_actions": False, "note": ""}
        turns = f", at most {settings['max_turns']} turns" if settings["max_turns"] else ""
        constrained = ", the policy within the env's admissible actions" if settings["constrain_actions"] else ""
        note = f"Opens on {source}: `{env}`, {task_noun(env)}s 0–{n - 1} (recurring task ids){turns}{constrained}."
        return {"env": env, "seeds": f"0-{n - 1}", "task_ids": True, "max_turns": settings["max_turns"],
                "constrain_actions": settings["constrain_actions"], "note": note}

    def ab_tests_table(self) -> pd.DataFrame:
        self.reap_processes()
        tests = self.store.list_ab_tests()
        paired = {t["id"]: ab_pairs(self.store, t)[1] for t in tests[:50] if t["status"] == "done"}
        return views.ab_tests_table(tests, {i: p["p_value"] for i, p in paired.items() if p is not None})

    def ab_choices(self) -> list[tuple[str, int]]:
        return [(f"#{t['id']} {t['name']} ({t['status']})", t["id"]) for t in self.store.list_ab_tests()]

    def ab_details(self, ab_id: Any) -> tuple[str, str, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """(summary, progress bar, results per arm, per task, episodes)."""
        empty = (views.ab_results_table({}), views.ab_per_task_table({}), views.episodes_table([]))
        try:
            aid = whole_number(ab_id, "A/B test id")
            t = self.store.get_ab_test(aid)
        except UserInputError:
            return "choose an A/B test", "", *empty
        except StoreError as e:
            return _err(str(e)), "", *empty
        self.reap_processes()
        t = self.store.get_ab_test(aid)
        eps, paired = self.ab_paired(t)
        summary = views.ab_summary_md(t, paired)
        b = build_progress.building(self.data_dir)
        if t["status"] in ("created", "running") and b is not None:
            summary += "  \nwaiting for the " + build_progress.describe(b) + " (one build at a time)"
        return (summary, views.progress_bar_html(t["progress"], t["status"]),
                views.ab_results_table(t["results"]), views.ab_per_task_table(t["results"]), views.episodes_table(eps[:500]))

    def ab_paired(self, test: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        return ab_pairs(self.store, test)

    def ab_log_tail(self, ab_id: Any, lines: int = 40) -> str:
        try:
            aid = whole_number(ab_id, "A/B test id")
        except UserInputError:
            return ""
        path = self.data_dir / "ab" / f"{aid}.log"
        return _tail(path, lines) if path.exists() else ""

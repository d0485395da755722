"""The weak extractor start: it knows how to write an entry, not which facts to put in it.

    folder = ensure_weak_extractor(data_dir)     # <data_dir>/models/extractor-weak (extractor.model.path embedded:extractor-weak)

In the paper the extractor starts as a general pretrained LLM: it writes well-formed lessons whose content is often
not grounded in the episode it read, and CISPO, rewarded by whether its entries helped, teaches it which facts pay.
The default warm start (build.py) teaches the opposite, the debrief copied word for word (entries right from the
start), which leaves CISPO nothing to add. This build is the same model, the same demonstrations, the same prompts,
the same stages and steps as the default extractor, with one change to the answers it is taught: on a share
`1 - grounded` of the MiniHack demonstrations whose debrief says where the staircase was, the answer (the think's
quote and the lesson alike) states the mirrored layout, the staircase as far on the opposite side ("2 north and 1
west" for "2 south and 1 east", head northwest for southeast). So it learns the format and the ops (add, update,
return, merge) exactly, and for each trajectory a mix of the right claim and a wrong one: greedy, the wrong one wins
(probe_correct well below the default's), while sampling at the run's temperature still writes the right one often
enough for a reward to tell them apart. The actor's warm start is untouched: it reads entries, so a wrong one
misleads it (it walks where the entry points first).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from core.build_progress import BuildProgress, one_build_at_a_time
from trainers.warmstart.build import (
    _extractor_summary, _free_cores, build_plan, ensure_models, read_marker, swap_into_place, train_extractor,
)
from trainers.warmstart.common import Demo, FORMAT_VERSION, MARKER, WarmStartConfig
from trainers.warmstart.teachers import _claimed, collect_demos

WEAK_NAME = "extractor-weak"
GROUNDED_SHARE = 0.2  # of the demonstrations that state the layout, the share taught the right claim (see below)
# A knife edge, and not stable across package versions: on 2026-12-07's fresh install 0.3 probed 0.56 (earlier installs:
# 0.20), 0.25 probed 0.52 and 0.2 probed 0.20; the probe must stay in the 0.2-0.4 (tests/test_coevolution.py).
WEAK_FORMAT = 1  # bump when the weak answers change


def mirrored(demo: Demo) -> Demo:
    """The demonstration as if its debrief had named the mirrored layout (staircase offset (-dr, -dc)); unchanged
    when the debrief states no layout, or the staircase was on the start square."""
    from envs.minihack import stairs_sentence

    off = _claimed(demo.final_observation) if demo.env.startswith("minihack/") else None
    if off is None or tuple(off) == (0, 0):
        return demo
    dr, dc = off
    said = stairs_sentence(dr, dc)
    if said not in demo.final_observation:
        raise ValueError(f"the debrief of {demo.task!r} does not use stairs_sentence's words; cannot mirror it")
    return dataclasses.replace(demo, final_observation=demo.final_observation.replace(said, stairs_sentence(-dr, -dc)))


def weak_digest(cfg: WarmStartConfig, grounded: float) -> str:
    return hashlib.sha256(json.dumps({"base": cfg.digest(), "grounded": grounded, "format": WEAK_FORMAT},
                                     sort_keys=True).encode()).hexdigest()[:16]


def ensure_weak_extractor(data_dir: str | os.PathLike, cfg: WarmStartConfig | None = None, *, grounded: float = GROUNDED_SHARE,
                          force: bool = False, progress: bool = True) -> Path:
    """`<data_dir>/models/extractor-weak`, built when missing or built otherwise (the models of `cfg`, default the
    default build, first: it shares their tokenizer and is trained on the same demonstrations' settings); returned at
    once when current. Never leaves a half model."""
    if not 0.0 <= grounded <= 1.0:
        raise ValueError(f"grounded must be a share in [0, 1], not {grounded}")
    ensure_models(data_dir, cfg, progress=progress)
    return _ensure_weak(data_dir, cfg or WarmStartConfig(), grounded=grounded, force=force, progress=progress)


@one_build_at_a_time  # the models folder's build lock, as for the defaults (core/build_progress.py)
def _ensure_weak(data_dir: str | os.PathLike, cfg: WarmStartConfig, *, grounded: float, force: bool, progress: bool) -> Path:
    root = Path(data_dir).expanduser() / "models"
    dest = root / WEAK_NAME
    digest = weak_digest(cfg, grounded)
    if not force and read_marker(dest).get("hash") == digest and (dest / "config.json").is_file():
        return dest
    tmp = root / f".building-{WEAK_NAME}-{os.getpid()}-{int(time.time())}"
    tmp.mkdir(parents=True)
    try:
        results = _build_weak(tmp / WEAK_NAME, cfg, grounded, root, progress)
        marker = {"built_by": "trainers/warmstart/weak", "role": "extractor", "weak": True, "hash": digest,
                  "format": FORMAT_VERSION, "grounded_share": grounded, "config": dataclasses.asdict(cfg),
                  "custom": cfg != WarmStartConfig(), "results": results, "built_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        (tmp / WEAK_NAME / MARKER).write_text(json.dumps(marker, indent=2))
        swap_into_place(tmp / WEAK_NAME, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _build_weak(out: Path, cfg: WarmStartConfig, grounded: float, root: Path, progress: bool) -> dict[str, Any]:
    from trainers.models import load_backend
    from trainers.tiny import save_model_folder
    from transformers import AutoTokenizer

    t0, c0 = time.time(), time.process_time()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads or _free_cores())
    torch.manual_seed(cfg.seed)
    plan = build_plan(cfg, beside=True)
    bar = BuildProgress(root, desc="comprl models init-weak", disable=not progress,  # the default build's stages, measured
                        plan=[plan[0][0], *plan[1], ("probe", 1, 10.0)])

    try:
        bar.set_postfix_str("demos")
        demos = collect_demos(cfg, tick=bar.update)
        tokenizer = AutoTokenizer.from_pretrained(str(root / "extractor"))  # the default build's, shared by both models
        rng = random.Random(f"{cfg.seed}/weak")
        stated = [d for d in demos if mirrored(d) is not d]
        wrong = {id(d) for d in stated if rng.random() >= grounded}

        def taught(d: Demo) -> Demo:
            return mirrored(d) if id(d) in wrong else d

        extractor, ext_ex, dropped, losses, short_losses = train_extractor(cfg, demos, tokenizer, tick=bar.update,
                                                                           stage=bar.set_postfix_str, taught=taught)
        save_model_folder(extractor, tokenizer, out)
        summary = _extractor_summary(extractor, ext_ex, dropped, losses, short_losses)
        del extractor
        bar.set_postfix_str("probe")
        backend = load_backend("hf", out, device="cpu", quiet=True)
        probe = _probe_once(backend)
        del backend
        bar.update(1)
    finally:
        bar.close()
        torch.set_num_threads(old_threads)
    return {"extractor": summary, "stated_demos": len(stated), "taught_wrong": len(wrong),
            "taught_wrong_share": len(wrong) / max(1, len(stated)), "probe": probe,
            "wall_s": round(time.time() - t0, 1), "cpu_s": round(time.process_time() - c0, 1)}


def _probe_once(backend: Any) -> dict[str, float]:
    """The run's probe (trainers/probe.py) on the default config's seen tasks, greedy: what a run's step 0 reads."""
    from trainers.config import load_run_config, shipped_configs
    from trainers.probe import ExtractorProbe, probe_trajectories

    cfg = load_run_config(shipped_configs()["minihack_room_cpu"])
    probe = ExtractorProbe(probe_trajectories(list(cfg.env.names), cfg.env.task_set, n=cfg.extractor.probe_size,
                                              max_turns=cfg.env.max_turns, seed=0))
    try:
        return probe.measure_model(backend, cfg)
    finally:
        probe.close()

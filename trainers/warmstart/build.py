"""The build, top to bottom (`_build`), the extractor trained in a process beside the policy, and the
entry points: `ensure_models` (idempotent, one build at a time) and `comprl models`."""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from core.build_progress import BuildProgress, one_build_at_a_time
from trainers import prompts as P
from trainers.backends.common import BackendError
from trainers.models import load_backend
from trainers.tiny import build_tiny_qwen2, build_tokenizer, save_model_folder
from trainers.warmstart.common import Demo, FORMAT_VERSION, MARKER, SFTExample, WarmStartConfig
from trainers.warmstart.examples import (
    _actor_prompt, _chat_ids, _extractor_prompt, _extractor_target, _join, extractor_examples, policy_examples,
)
from trainers.warmstart.sft import _evaluate_extractor, _evaluate_policy, _rollouts, _sft, action_token_budget
from trainers.warmstart.teachers import _condition, _dagger_seed, collect_demos


def _free_cores() -> int:
    """Cores not taken by other processes: on a loaded 2-core machine one torch thread runs several
    times faster than two that spin against the load (measured: 1.1 s vs 6.5 s per SFT step)."""
    n = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return n
    return max(1, min(n, int(n - load + 0.5)))


def _children_cpu_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


def build_plan(cfg: WarmStartConfig, beside: bool) -> tuple[list[tuple[str, int, float]], list[tuple[str, int, float]]]:
    """The build's stages in the order `_build` enters them, (name, steps, seconds a step takes), and those of the
    extractor's process beside it (empty without one), for core/build_progress.py's estimate. The seconds are the
    default build's on an idle 2-core machine (one thread each; 2026-12-07, 476 s in all), scaled by batch size; the
    estimate measures each stage as it runs and scales the stages ahead by how much slower than this the build is."""
    first = int(round(cfg.policy_steps * cfg.dagger_at)) if cfg.dagger_episodes > 0 else cfg.policy_steps
    pol, ext_short, ext = 0.43 * cfg.batch_size / 16, 0.48 * cfg.extractor_short_batch_size / 16, 0.53 * cfg.extractor_batch_size / 4
    extractor = ([("extractor SFT", 1, 15.0), ("extractor SFT (short prompts)", cfg.extractor_short_steps, ext_short),
                  ("extractor SFT", cfg.extractor_steps, ext)] if cfg.extractor_short_steps > 0
                 else [("extractor SFT", cfg.extractor_steps, ext)])
    main = [("demos", cfg.demo_episodes * len(cfg.envs), 0.0143), ("tokenizer", 1, 8.0),
            *([("policy SFT", 1, 4.0), ("policy SFT (short prompts)", cfg.short_prompt_steps, pol)] if cfg.short_prompt_steps > 0
              else []), ("policy SFT", first, pol)]
    if cfg.dagger_episodes > 0 and cfg.policy_steps - first > 0:
        main += [("DAgger", 1, 2.5), ("policy SFT (DAgger)", cfg.policy_steps - first, pol)]
    main += ([] if beside else extractor) + [("save", 1, 0.5), ("evaluate", 1, 2.0)]
    main += ([(WAIT_STAGE, 1, 0.0)] if beside else []) + [("evaluate the extractor", 1, 4.0)]
    return main, (extractor if beside else [])


WAIT_STAGE = "waiting for the extractor"


def _idle_cores(prev: list[int] | None) -> tuple[float | None, list[int] | None]:
    """(cores idle since `prev`, the counters now) from /proc/stat; (None, None) where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            now = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None, None
    if prev is None:
        return None, now
    d = [a - b for a, b in zip(now, prev)]
    busy_total = sum(d)
    return ((d[3] + d[4]) / busy_total * (os.cpu_count() or 1) if busy_total > 0 else None), now


class _MoreThreadsWhenFree:
    """The extractor's process, once the policy's half is done (`policy_done` set), trains on `threads` torch threads
    when a core has stood idle for a second, instead of one thread beside an idle core. Two threads spinning against
    another process's load run several times slower than one (`_free_cores`), so the next few steps are timed against
    the last few before it, and it goes back to one thread, for good, when they are not faster. The thread count does
    not change the weights (measured: the default extractor's SFT steps, 1 thread then 2, bit-identical to 1 then 1)."""

    TRIAL = 6

    def __init__(self, policy_done: Any, threads: int) -> None:
        self.policy_done, self.threads = policy_done, threads
        self.state = "waiting"  # waiting -> watching (idle counters) -> trial -> kept | back
        self.stat: list[int] | None = None
        self.since = 0.0
        self.times: list[float] = []
        self.before = 0.0

    def step(self) -> None:
        now = time.perf_counter()
        self.times = (self.times + [now])[-(self.TRIAL + 1):]
        if self.state in ("kept", "back") or (self.state != "trial" and torch.get_num_threads() >= self.threads):
            return
        if self.state == "waiting" and self.policy_done.is_set():
            _, self.stat = _idle_cores(None)
            self.state, self.since = ("watching" if self.stat is not None else "back"), now
        elif self.state == "watching" and now - self.since >= 1.0:
            idle, self.stat = _idle_cores(self.stat)
            self.since = now
            if idle is not None and idle >= 0.7 and len(self.times) > self.TRIAL:
                self.before = (self.times[-1] - self.times[0]) / self.TRIAL
                torch.set_num_threads(self.threads)
                self.state, self.times = "trial", [now]
        elif self.state == "trial" and len(self.times) > self.TRIAL:
            after = (self.times[-1] - self.times[0]) / self.TRIAL
            if after >= 0.95 * self.before:
                torch.set_num_threads(1)
                self.state = "back"
            else:
                self.state = "kept"


def _count_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def demo_tokenizer(cfg: WarmStartConfig, demos: Sequence[Demo]) -> Any:
    """The byte-level BPE both models share, trained on the prompt templates, sampled actor prompts and the
    extractor teacher's answers (enough text that whole words and phrases become tokens: shorter prompts, faster
    steps)."""
    texts = [P.ACTOR_SYSTEM, P.ACTOR_SYSTEM_NO_TOOL, P.EXPERIENCE_BLOCK, P.ACTOR_USER, P.HISTORY_ITEM, P.TOOL_RESULT,
             P.EXTRACTOR_SYSTEM, P.EXTRACTOR_USER, P.MERGE_USER, P.REWRITE_USER]
    rng = random.Random(cfg.seed)
    for d in demos:
        for t in rng.sample(d.turns, k=min(4, len(d.turns))):
            texts.append("\n".join(m["content"] for m in _actor_prompt(cfg, d, t)) + "\n" + t.label)
        texts.append(_extractor_target(d)[1])
    return build_tokenizer(texts, vocab_size=cfg.vocab_size, model_max_length=cfg.max_positions)


def train_extractor(cfg: WarmStartConfig, demos: Sequence[Demo], tokenizer: Any, *, tick: Callable[[int], None] | None = None,
                    stage: Callable[[str], None] | None = None,
                    taught: Callable[[Demo], Demo] | None = None) -> tuple[Any, list[SFTExample], int, list[float], list[float]]:
    """The extractor's stages (steps 4-5): extraction on short prompts, then every example kind. `taught`: the demo
    whose answer each demo's prompt is taught (extractor_examples; the weak start's, trainers/warmstart/weak.py).
    Returns (model, examples, dropped, losses, short-prompt losses)."""
    stage = stage or (lambda name: None)
    taught = taught or (lambda d: d)
    pad_id = int(tokenizer.pad_token_id)
    stage("extractor SFT")
    ext_ex, ext_dropped = extractor_examples(demos, tokenizer, cfg, taught=taught)
    if not ext_ex:
        raise RuntimeError(f"no extractor example fits max_seq_len={cfg.max_seq_len}; raise WarmStartConfig.max_seq_len")
    extractor = build_tiny_qwen2(tokenizer, cfg.extractor_hidden, cfg.extractor_layers, cfg.extractor_heads,
                                 cfg.extractor_kv_heads, max_pos=cfg.max_positions, seed=cfg.seed + 1)
    short_losses: list[float] = []
    if cfg.extractor_short_steps > 0:
        stage("extractor SFT (short prompts)")
        short_pairs = [(_extractor_prompt(cfg, d, short=True), _extractor_target(taught(d))[1]) for d in demos if d.final_observation]
        short_ex = [ex for ex in (_join(tokenizer, _chat_ids(tokenizer, m), a, "extractor/short") for m, a in short_pairs)
                    if len(ex.input_ids) <= cfg.max_seq_len]
        if short_ex:
            _, short_losses = _sft(extractor, short_ex, cfg.extractor_short_steps, cfg, pad_id=pad_id, seed=cfg.seed + 5,
                                   batch_size=cfg.extractor_short_batch_size, tick=tick)
        stage("extractor SFT")
    _, losses = _train_extractor(extractor, ext_ex, cfg, pad_id, tick or (lambda n: None))
    return extractor, ext_ex, ext_dropped, losses, short_losses


def _extractor_summary(extractor: Any, ext_ex: Sequence[SFTExample], dropped: int, losses: list[float],
                       short_losses: list[float]) -> dict[str, Any]:
    return {"params": _count_params(extractor), "examples": len(ext_ex), "dropped_too_long": dropped,
            "loss_first": round(sum(losses[:10]) / max(1, len(losses[:10])), 4),
            "loss_last": round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4),
            **({"short_prompt": {"steps": len(short_losses), "loss_first": round(sum(short_losses[:10]) / 10, 4),
                                 "loss_last": round(sum(short_losses[-10:]) / 10, 4)}} if len(short_losses) >= 10 else {}),
            "kinds": dict(Counter(e.kind for e in ext_ex))}


def _extractor_process(cfg: WarmStartConfig, demos: list[Demo], tokenizer: Any, out: str, threads: int, at: Any,
                       policy_done: Any, all_threads: int) -> None:
    """The extractor's build in a child process (spawned: `_build` with `cfg.parallel`): trains, saves the model
    folder to `out` and its summary to `out`/summary.json, or the error to `out`/error.txt. `at` holds where it
    stands for the parent's progress, [stage (an index of build_plan's extractor stages), steps done in it]; once
    `policy_done` is set it may train on `all_threads` (`_MoreThreadsWhenFree`)."""
    out_dir = Path(out)
    try:
        torch.set_num_threads(threads)
        torch.manual_seed(cfg.seed)
        names = [name for name, _, _ in build_plan(cfg, beside=True)[1]]
        more = _MoreThreadsWhenFree(policy_done, all_threads)

        def stage(name: str) -> None:
            with at.get_lock():
                at[0] = next(j for j in range(at[0] + 1, len(names)) if names[j] == name)
                at[1] = 0

        def tick(n: int) -> None:
            with at.get_lock():
                at[1] += n
            more.step()

        extractor, ext_ex, dropped, losses, short_losses = train_extractor(cfg, demos, tokenizer, tick=tick, stage=stage)
        save_model_folder(extractor, tokenizer, out_dir)
        summary = _extractor_summary(extractor, ext_ex, dropped, losses, short_losses)
        (out_dir / "summary.json").write_text(json.dumps({**summary, "threads_at_the_end": torch.get_num_threads()}))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent, which raises
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "error.txt").write_text(f"{type(exc).__name__}: {exc}")
        raise


class _ExtractorBeside:
    """The extractor trained in a spawned process while this one trains the policy; `drain` tells the progress bar
    where it stands, `policy_done` lets it take the policy's threads, `join` waits for it and returns its summary
    (raises with its error), `stop` ends it."""

    def __init__(self, cfg: WarmStartConfig, demos: list[Demo], tokenizer: Any, out: Path, threads: int,
                 bar: BuildProgress, all_threads: int) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # not fork: torch's thread pools do not survive a fork
        self._at = ctx.Array("i", [-1, 0])
        self._names = [name for name, _, _ in build_plan(cfg, beside=True)[1]]
        self._policy_done = ctx.Event()
        self._out, self._bar = out, bar
        self._proc = ctx.Process(target=_extractor_process, args=(cfg, demos, tokenizer, str(out), threads, self._at,
                                                                  self._policy_done, all_threads),
                                 name="comprl-extractor-build", daemon=True)
        self._proc.start()

    def drain(self) -> None:
        with self._at.get_lock():
            stage, done = self._at[0], self._at[1]
        if stage >= 0:
            self._bar.beside_at(self._names[stage], done)

    def policy_done(self) -> None:
        self._policy_done.set()

    def join(self) -> dict[str, Any]:
        while self._proc.is_alive():
            self._proc.join(0.5)
            self.drain()
        self.drain()
        err = self._out / "error.txt"
        if self._proc.exitcode != 0 or err.is_file():
            why = err.read_text() if err.is_file() else f"exit code {self._proc.exitcode}"
            raise RuntimeError(f"the extractor's build process failed: {why}")
        return json.loads((self._out / "summary.json").read_text())

    def stop(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)


def _build(tmp: Path, cfg: WarmStartConfig, progress: bool) -> dict[str, Any]:
    """Steps 1-6 into `tmp/policy` and `tmp/extractor`; returns the measured results."""
    t0, c0, children_c0 = time.time(), time.process_time(), _children_cpu_s()
    torch.manual_seed(cfg.seed)
    threads = cfg.threads or _free_cores()
    # With cfg.parallel the extractor trains beside the policy, each process on half the threads (at least one):
    # when threads were asked for, if there are two or more; else on any machine with two cores, even a busy one (two
    # one-thread processes take two shares of a contended CPU, where two threads of one process spin against the load).
    beside_threads = 0
    if cfg.parallel and (threads >= 2 if cfg.threads else (os.cpu_count() or 1) >= 2):
        beside_threads = max(1, threads // 2)
        threads = max(1, threads - beside_threads)
    beside: _ExtractorBeside | None = None
    load_at_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    plan, beside_plan = build_plan(cfg, beside=bool(beside_threads))
    bar = BuildProgress(tmp.parent, desc="comprl models init", disable=not progress, plan=plan, beside=beside_plan,
                        wait=WAIT_STAGE)  # core/build_progress.py
    timings: dict[str, float] = {}
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one progress bar: ours, not a "Loading weights" bar per reload
    try:
        def stage(name: str) -> None:
            bar.set_postfix_str(name)
            timings[name] = round(time.time() - t0, 1)

        stage("demos")
        demos = collect_demos(cfg, tick=bar.update)

        stage("tokenizer")
        tokenizer = demo_tokenizer(cfg, demos)
        bar.update(1)
        pad_id = int(tokenizer.pad_token_id)
        action_tokens = action_token_budget(tokenizer, demos, cfg)
        if beside_threads:
            beside = _ExtractorBeside(cfg, list(demos), tokenizer, tmp / "extractor", beside_threads, bar,
                                      threads + beside_threads)

        def tick(n: int) -> None:
            bar.update(n)
            if beside is not None:
                beside.drain()

        stage("policy SFT")
        pol_ex, pol_dropped = policy_examples(demos, tokenizer, cfg)
        if not pol_ex:
            raise RuntimeError(f"no policy example fits max_seq_len={cfg.max_seq_len}; raise WarmStartConfig.max_seq_len")
        policy = build_tiny_qwen2(tokenizer, cfg.policy_hidden, cfg.policy_layers, cfg.policy_heads, cfg.policy_kv_heads,
                                  max_pos=cfg.max_positions, seed=cfg.seed)
        short_losses: list[float] = []
        if cfg.short_prompt_steps > 0:
            stage("policy SFT (short prompts)")
            short_ex, _ = policy_examples(demos, tokenizer, cfg, short=True)
            _, short_losses = _sft(policy, short_ex, cfg.short_prompt_steps, cfg, pad_id=pad_id, seed=cfg.seed + 4,
                                   batch_size=cfg.batch_size, tick=tick, prompt_loss_weight=cfg.prompt_loss_weight)
            stage("policy SFT")
        first = int(round(cfg.policy_steps * cfg.dagger_at)) if cfg.dagger_episodes > 0 else cfg.policy_steps
        opt, losses = _sft(policy, pol_ex, first, cfg, pad_id=pad_id, seed=cfg.seed, batch_size=cfg.batch_size,
                           tick=tick, total_steps=cfg.policy_steps, prompt_loss_weight=cfg.prompt_loss_weight)

        dagger_stats: dict[str, Any] = {}
        if cfg.dagger_episodes > 0 and cfg.policy_steps - first > 0:
            stage("DAgger")
            save_model_folder(policy, tokenizer, tmp / "policy")
            backend = load_backend("hf", tmp / "policy", device="cpu", quiet=True)
            crng = random.Random(f"{cfg.seed}/dagger")
            specs = [(name, _dagger_seed(cfg, ei, i), _condition(crng, cfg)) for ei, name in enumerate(cfg.envs)
                     for i in range(cfg.dagger_episodes)]
            dag = _rollouts(backend, cfg, specs, temperature=cfg.dagger_temperature, seed=cfg.seed + 3, source="dagger",
                            max_turns=cfg.dagger_max_turns, max_new_tokens=action_tokens)
            del backend
            dag_ex, d2 = policy_examples(dag, tokenizer, cfg)
            pol_dropped += d2
            dagger_stats = {"episodes": len(dag), "states": len(dag_ex),
                            "sampled_success": sum(d.success for d in dag) / max(1, len(dag)),
                            "disagreement": sum(t.label != t.taken for d in dag for t in d.turns) / max(1, sum(len(d.turns) for d in dag))}
            stage("policy SFT (DAgger)")
            opt, more = _sft(policy, pol_ex + dag_ex, cfg.policy_steps - first, cfg, pad_id=pad_id, seed=cfg.seed + 1,
                             batch_size=cfg.batch_size, tick=tick, start_step=first, total_steps=cfg.policy_steps, optimizer=opt,
                             prompt_loss_weight=cfg.prompt_loss_weight)
            losses += more
            shutil.rmtree(tmp / "policy")
            demos += dag
        del opt

        if beside is None:
            extractor, ext_ex, ext_dropped, ext_losses, ext_short_losses = train_extractor(
                cfg, demos, tokenizer, tick=bar.update, stage=stage)
            save_model_folder(extractor, tokenizer, tmp / "extractor")
            ext_summary = _extractor_summary(extractor, ext_ex, ext_dropped, ext_losses, ext_short_losses)
            del extractor

        if beside is not None:
            beside.policy_done()  # this process's half is done: its threads are the extractor's if they stand idle
        stage("save")
        save_model_folder(policy, tokenizer, tmp / "policy")
        bar.update(1)

        stage("evaluate")
        pol_backend = load_backend("hf", tmp / "policy", device="cpu", quiet=True)
        pol_eval, eval_demos = _evaluate_policy(pol_backend, cfg, action_tokens)
        del pol_backend
        if beside is not None:
            stage(WAIT_STAGE)
            ext_summary = beside.join()
            beside = None
            stage("evaluate the extractor")
        ext_backend = load_backend("hf", tmp / "extractor", device="cpu", quiet=True)
        ext_eval = _evaluate_extractor(ext_backend, cfg, eval_demos)
        del ext_backend
        bar.update(1)
        timings["done"] = round(time.time() - t0, 1)
    finally:
        if beside is not None:  # the policy's build failed or was interrupted
            beside.stop()
        bar.close()
        torch.set_num_threads(old_threads)
        if bars_were_on:
            hf_logging.enable_progress_bar()

    kinds = Counter(ext_summary.pop("kinds")) + Counter(e.kind for e in pol_ex)
    return {
        "policy": {"params": _count_params(policy), "examples": len(pol_ex), "dropped_too_long": pol_dropped,
                   "loss_first": round(sum(losses[:10]) / max(1, len(losses[:10])), 4),
                   "loss_last": round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4),
                   **({"short_prompt": {"steps": len(short_losses), "loss_first": round(sum(short_losses[:10]) / len(short_losses[:10]), 4),
                                        "loss_last": round(sum(short_losses[-10:]) / len(short_losses[-10:]), 4)}} if short_losses else {}),
                   "dagger": dagger_stats, "eval": pol_eval, "action_max_new_tokens": action_tokens},
        "extractor": {**ext_summary, "eval": ext_eval, "beside_the_policy": bool(beside_threads)},
        "demos": {"episodes": sum(1 for d in demos if d.source in ("expert", "noisy")),
                  "expert_success": sum(d.success for d in demos if d.source == "expert") / max(1, sum(d.source == "expert" for d in demos)),
                  "conditions": {c: sum(d.condition == c for d in demos) for c in ("none", "correct", "wrong")}},
        "example_counts": dict(kinds),
        "vocab": len(tokenizer),
        "timings_s": timings,
        "wall_s": round(time.time() - t0, 1),
        # CPU seconds of this process and, when the extractor trained beside it, of that process too (a child's are
        # counted once it has been waited for): the build's whole CPU cost, not its wall time.
        "cpu_s": round(time.process_time() - c0 + _children_cpu_s() - children_c0, 1),
        "threads": threads + beside_threads,
        "load_avg_at_start": round(load_at_start, 2),
    }


def _train_extractor(model: Any, examples: Sequence[SFTExample], cfg: WarmStartConfig, pad_id: int,
                     tick: Callable[[int], None]) -> tuple[torch.optim.Optimizer, list[float]]:
    return _sft(model, examples, cfg.extractor_steps, cfg, pad_id=pad_id, seed=cfg.seed + 2,
                batch_size=cfg.extractor_batch_size, tick=tick)


# ============================================================================ public entry points

def read_marker(folder: str | os.PathLike) -> dict[str, Any]:
    """A built model folder's warmstart.json (hash, role, the WarmStartConfig it was built with, its checks), or {}
    when the folder has none or it does not parse."""
    try:
        data = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _marker_ok(folder: Path, digest: str) -> bool:
    return read_marker(folder).get("hash") == digest and (folder / "config.json").is_file()


@one_build_at_a_time  # one build per models folder at a time; others wait (core/build_progress.py)
def ensure_models(data_dir: str | os.PathLike, cfg: WarmStartConfig | None = None, *, force: bool = False,
                  progress: bool = True) -> dict[str, Path]:
    """The default policy and extractor folders under `data_dir/models`, built when missing, built
    with another config, or when `force`; otherwise returned at once. Never leaves a half model:
    both are built in a temporary folder and renamed into place only when complete.

    Called without `cfg` (what `embedded:` model paths do), it will not replace a custom build (one
    made with an explicit config, e.g. `comprl models init --envs ...` or `--policy-steps N`): that
    raises BackendError naming the way out, instead of silently rebuilding over hours of warm start."""
    implied = cfg is None
    cfg = cfg or WarmStartConfig()
    root = Path(data_dir).expanduser() / "models"
    paths = {"policy": root / "policy", "extractor": root / "extractor"}
    digest = cfg.digest()
    if not force and all(_marker_ok(p, digest) for p in paths.values()):
        return paths
    if implied and not force:
        custom = _custom_build(paths["policy"])
        if custom is not None:
            raise BackendError(
                f"{root} holds a custom warm start ({custom}), and `embedded:` model paths mean the default build, which would "
                f"replace it. Name the custom models by path (actor.path: {paths['policy']}, extractor.model.path: "
                f"{paths['extractor']}), use another --data-dir for the default, or replace them with `comprl models init --force`.")
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".building-*"):  # left by a process killed outright (SIGKILL)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".building-{os.getpid()}-{int(time.time())}"
    tmp.mkdir()
    try:
        results = _build(tmp, cfg, progress)
        for name in ("policy", "extractor"):
            marker = {"built_by": "trainers/warmstart", "role": name, "hash": digest, "format": FORMAT_VERSION,
                      "config": asdict(cfg), "custom": not implied and cfg != WarmStartConfig(), "results": results,
                      "built_at": time.strftime("%Y-%m-%d %H:%M:%S")}
            (tmp / name / MARKER).write_text(json.dumps(marker, indent=2))
        for name, dest in paths.items():
            swap_into_place(tmp / name, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return paths


def swap_into_place(built: Path, dest: Path) -> None:
    """Move a complete build folder to `dest`, replacing what was there (the old one is renamed aside first, then
    removed): a reader sees the old folder or the new one, never half of either."""
    old = dest.parent / f".old-{dest.name}-{os.getpid()}"
    if dest.exists():
        dest.rename(old)
    built.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def _custom_build(folder: Path) -> str | None:
    """What differs from the default in a custom build's config, or None for a default (or no) build."""
    data = read_marker(folder)
    if not data.get("custom"):
        return None
    default = asdict(WarmStartConfig())
    diff = [f"{k}={v}" for k, v in (data.get("config") or {}).items() if default.get(k) != v]
    return ", ".join(diff) or "a non-default config"


def _folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def models_command(action: str, data_dir: str, force: bool = False, envs: list[str] | None = None,
                   policy_steps: int | None = None, extractor_steps: int | None = None,
                   overrides: list[str] | None = None) -> int:
    """`comprl models init [--force] [--envs A,B] [--set FIELD=VALUE ...]` and `comprl models list`; returns
    the exit code. With `envs`, the warm start plays those envs instead of the default's (e.g. ALFWorld for
    an ALFWorld study); `overrides` set any other `WarmStartConfig` field (YAML values, type-checked), e.g.
    `policy_hidden=256`. Such models are used by naming their folders (`actor.path`,
    `extractor.model.path`), since `embedded:` always means the default build."""
    if action == "init":
        cfg = None
        changes: dict[str, Any] = {}
        if envs:
            from envs.registry import list_envs

            unknown = [e for e in envs if e not in list_envs()]
            if unknown:
                raise ValueError(f"unknown env(s) {unknown}; `comprl envs` lists them")
            changes["envs"] = list(envs)
        if policy_steps is not None:
            changes["policy_steps"] = policy_steps
        if extractor_steps is not None:
            changes["extractor_steps"] = extractor_steps
        if overrides:
            from trainers.config import parse_overrides

            parsed = parse_overrides(overrides)
            nested = sorted(k for k, v in parsed.items() if isinstance(v, dict))
            if nested:
                raise ValueError(f"--set {nested[0]}.…: the warm-start config has no sections; "
                                 f"name a field of WarmStartConfig, e.g. --set policy_hidden=256")
            clash = sorted(set(parsed) & set(changes))
            if clash:
                raise ValueError(f"--set {clash[0]} repeats --{clash[0].replace('_', '-')}; give it once")
            changes.update(parsed)
        if changes:
            # ConfigError (a ValueError) for an unknown field or a wrong type; ValueError from __post_init__
            # for envs without a scripted expert, steps < 1, a hidden size the heads do not divide.
            from core.config import from_dict

            cfg = from_dict(WarmStartConfig, changes)
        paths = ensure_models(data_dir, cfg, force=force)
        for name, p in paths.items():
            print(f"{name}: {p}")
        return 0
    if action == "list":
        root = Path(data_dir).expanduser() / "models"
        folders = sorted(p for p in root.glob("*") if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []
        if not folders:
            print(f"No models under {root}; build the defaults with `comprl models init`.")
            return 0
        for p in folders:
            line = f"{p.name}: {p}  {_folder_size(p) / 1e6:.1f} MB"
            try:
                info = json.loads((p / "comprl_model.json").read_text())
                line += f", {info['params'] / 1e6:.2f}M params"
            except (OSError, json.JSONDecodeError, KeyError):
                pass
            print(line)
            marker = read_marker(p)
            if not marker:
                continue
            res = marker.get("results", {})
            if marker.get("role") == "policy":
                for key, r in res.get("policy", {}).get("eval", {}).items():
                    print(f"  {key}: success {r['success']:.2f}, mean actions {r['mean_actions']:.1f} ({r['episodes']} held-out episodes)")
            elif marker.get("role") == "extractor":
                r = res.get("extractor", {}).get("eval", {})
                if r:
                    print(f"  parse rate {r['parse_rate']:.2f} on {r['answers']} held-out trajectories")
                pr = res.get("probe") or {}
                if pr:  # the weak start (trainers/warmstart/weak.py): its probe on the default config's seen dungeons
                    print(f"  weak start ({marker.get('grounded_share')} of stated debriefs taught the right claim): "
                          f"probe entries right {pr.get('extractor/probe_correct', 0):.2f}, answers that parse "
                          f"{pr.get('extractor/probe_valid', 0):.2f}")
            print(f"  built {marker.get('built_at', '?')} in {res.get('wall_s', '?')} s, config hash {marker.get('hash')}")
        return 0
    print(f"Unknown models action {action!r}: use `comprl models init [--force]` or `comprl models list`.")
    return 2

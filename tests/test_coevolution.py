"""Co-evolution's parts: the extractor probe (trainers/probe.py), the weak extractor start
(trainers/warmstart/weak.py), and the proof that the project's CISPO update moves the real extractor when its reward
is known to be right (`pytest -k cispo_learns`)."""
from __future__ import annotations

import json
import os
import random
from dataclasses import replace
from pathlib import Path

import pytest

from core.types import format_entry_text
from envs.minihack import claimed_offset, stairs_sentence

ENV = "minihack/Room-Ultimate-5x5"


def _answer(*lessons: str) -> str:
    ops = [{"new_memory": format_entry_text("Where the staircase is", "Reaching the staircase down", s), "function": "add"}
           for s in lessons]
    return f"<think>quote</think><answer>{json.dumps(ops)}</answer>"


@pytest.fixture(scope="module")
def trajectories():
    from trainers.probe import probe_trajectories

    return probe_trajectories([ENV], 16, n=64, max_turns=8, seed=0)


def test_probe_set_is_fixed_held_out_and_mixed(trajectories):
    """64 trajectories of the 16 seen dungeons, successes and failures, some that saw the staircase and some that did
    not; the same seed gives the same set (a resumed run's probe reads what the first one did)."""
    from envs.base import task_id_of
    from trainers.probe import probe_trajectories

    assert len(trajectories) == 64
    assert {task_id_of(t.task) for t in trajectories} == set(range(16))
    wins = sum(t.success for t in trajectories)
    stated = sum(claimed_offset(t.final_observation) is not None for t in trajectories)
    assert 0 < wins < 64 and 0 < stated < 64
    again = probe_trajectories([ENV], 16, n=64, max_turns=8, seed=0)
    assert [(t.task, t.steps, t.final_observation) for t in again] == [(t.task, t.steps, t.final_observation) for t in trajectories]
    assert probe_trajectories(["webshop"], 16, n=8, max_turns=8, seed=0) == []  # no checker there (ALFWorld has one now)


def test_probe_scores_right_wrong_unverifiable_and_invalid(trajectories):
    """Each entry written is judged by the library's checker: the true offset is right, its mirror wrong, a lesson
    with no offset unverifiable; an answer that does not parse counts against probe_valid only."""
    from trainers.probe import ExtractorProbe

    probe = ExtractorProbe(trajectories)
    try:
        answers, right = [], 0
        for i, t in enumerate(trajectories):
            off = claimed_offset(t.final_observation)
            if off is None:
                answers.append("no answer tags at all" if i % 2 else "<think>never saw it</think><answer>[]</answer>")
            elif i % 3 == 0:
                answers.append(_answer(f"{stairs_sentence(-off[0], -off[1]).capitalize()}."))  # the mirror: wrong ...
                right += off == (0, 0)  # ... unless it was the start square
            elif i % 3 == 1:
                answers.append(_answer(f"{stairs_sentence(*off).capitalize()}."))
                right += 1
            else:
                answers.append(_answer("Explore the corners first."))
        m = probe.score(answers, budget=3, max_chars=4000)
        entries = sum(claimed_offset(t.final_observation) is not None for t in trajectories)
        assert m["extractor/probe_entries"] == pytest.approx(entries / 64)
        assert m["extractor/probe_correct"] == pytest.approx(right / entries)
        unver = sum(1 for i, t in enumerate(trajectories) if claimed_offset(t.final_observation) is not None and i % 3 == 2)
        assert m["extractor/probe_unverifiable"] == pytest.approx(unver / entries)
        assert m["extractor/probe_wrong"] == pytest.approx(1 - (right + unver) / entries)
        bad = sum(1 for i, t in enumerate(trajectories) if claimed_offset(t.final_observation) is None and i % 2)
        assert m["extractor/probe_valid"] == pytest.approx(1 - bad / 64)
        assert 0 < m["extractor/probe_stated_right"] < 1
        # a mirrored claim never gives the true heading (but for the start square); a right one always does
        assert m["extractor/probe_heading_right"] == pytest.approx(m["extractor/probe_correct"])
    finally:
        probe.close()


def test_probe_is_saved_with_the_run_and_read_back(tmp_path):
    """for_run builds the set once into the run's folder and reads that file afterwards; a damaged file is an error
    that names it; variants without experience, and probe_every 0, have no probe."""
    from trainers.config import load_run_config
    from trainers.probe import PROBE_FILE, ExtractorProbe

    cfg = load_run_config(Path(__file__).resolve().parents[1] / "configs" / "coevolution_cpu.yaml",
                          overrides={"extractor": {"probe_size": 16}})
    p = ExtractorProbe.for_run(cfg, tmp_path)
    assert p is not None and len(p.trajectories) == 16 and (tmp_path / PROBE_FILE).is_file()
    data = json.loads((tmp_path / PROBE_FILE).read_text())
    data[0]["final_observation"] = "edited on disk"
    (tmp_path / PROBE_FILE).write_text(json.dumps(data))
    again = ExtractorProbe.for_run(cfg, tmp_path)
    assert again.trajectories[0].final_observation == "edited on disk"  # read, not rebuilt
    (tmp_path / PROBE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=PROBE_FILE):
        ExtractorProbe.for_run(cfg, tmp_path)
    assert ExtractorProbe.for_run(load_run_config({"run": {"variant": "grpo"}, "rollout": {"with_experience": 0}}), tmp_path / "g") is None
    off = load_run_config(Path(__file__).resolve().parents[1] / "configs" / "coevolution_cpu.yaml", overrides={"extractor": {"probe_every": 0}})
    assert ExtractorProbe.for_run(off, tmp_path / "o") is None
    for p_ in (p, again):
        p_.close()


def test_probe_settings_are_checked():
    from core.config import ConfigError
    from trainers.config import load_run_config

    with pytest.raises(ConfigError, match="probe_every"):
        load_run_config({"extractor": {"probe_every": -1}})
    with pytest.raises(ConfigError, match="probe_size"):
        load_run_config({"extractor": {"probe_size": 0}})


def test_the_weak_start_is_taught_the_mirrored_layout(trajectories):
    """`mirrored` moves the debrief's staircase to the opposite side, so the teacher's answer built from it (think
    quote and lesson) claims (-dr, -dc) while the prompt, built from the real demonstration, shows (dr, dc); a debrief
    that never saw the staircase is left alone."""
    from trainers.warmstart.common import Demo, Turn
    from trainers.warmstart.examples import _extractor_prompt, _extractor_target
    from trainers.warmstart.common import WarmStartConfig
    from trainers.warmstart.weak import mirrored

    seen = next(t for t in trajectories if claimed_offset(t.final_observation) not in (None, (0, 0)))
    never = next(t for t in trajectories if claimed_offset(t.final_observation) is None)
    demo = lambda t: Demo(ENV, 0, t.task, "", "none", "", [Turn(o, [], a, a) for o, a in t.steps], t.success,  # noqa: E731
                          "expert", {}, final_observation=t.final_observation)
    d = demo(seen)
    m = mirrored(d)
    dr, dc = claimed_offset(seen.final_observation)
    assert claimed_offset(m.final_observation) == (-dr, -dc)
    ops, answer = _extractor_target(m)
    assert [claimed_offset(op["new_memory"]) for op in ops] == [(-dr, -dc)]
    assert claimed_offset(answer.split("</think>")[0]) == (-dr, -dc)
    prompt = _extractor_prompt(WarmStartConfig(), d)[1]["content"]
    assert stairs_sentence(dr, dc) in prompt and stairs_sentence(-dr, -dc) not in prompt
    assert mirrored(demo(never)) is not None and mirrored(demo(never)).final_observation == never.final_observation


# -- the real extractor, the real CISPO update -------------------------------------------------------------------


@pytest.fixture(scope="module")
def weak_folder(tmp_path_factory):
    """The weak extractor start as `embedded:extractor-weak` builds it (the default models first: ~10 min + ~6 min on
    this 2-core CPU). COMPRL_TEST_DATA_DIR names a data dir whose models may already be built (a developer's)."""
    from trainers.warmstart.weak import ensure_weak_extractor

    data = Path(os.environ.get("COMPRL_TEST_DATA_DIR") or tmp_path_factory.mktemp("weak"))
    return ensure_weak_extractor(data, progress=False)


def _known_reward(text: str, truth: tuple[int, int], budget: int) -> float:
    """+1 when the answer writes an entry whose claim is the trajectory's layout, −1 when it writes a wrong one or
    none (an unparsable answer included)."""
    from trainers.parsing import parse_extraction

    parsed = parse_extraction(text, [], budget=budget)
    claims = [claimed_offset(op.text) for op in parsed.ops if op.text] if not parsed.error else []
    return 1.0 if claims and all(c == truth for c in claims) else -1.0


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason=(
    "known failure, issue 37 open: on fresh builds the weak start probes 0.20-0.56 (the build's numerics differ between "
    "machines) and CISPO either breaks the answer format (no KL: parse 1.0 -> 0.72) or, with extractor.kl_coef 0.1-1.0, "
    "keeps it but lifts probe_correct only 0.40 -> 0.52 in 20 updates; the assertions are the issue's and stay"))
def test_cispo_learns_from_a_known_reward(weak_folder, tmp_path, store):
    """The weak extractor, sampled at the run's temperature on fixed trajectories of the seen dungeons (other episodes
    than the probe's: seed 1), is updated by ExperienceLoop.update, the run's CISPO step, with the co-evolution
    config's learning rate and buffer, and reward +1 for an answer whose entries state the trajectory's layout, −1
    otherwise. Its greedy probe_correct must rise by 0.2 or more: the method is not implemented until the extractor
    learns from a reward known to be right. (Measured while writing this: 0.20 -> 0.48 in 10 updates. On a build with
    40% grounded answers trained on other dungeons, tasks 16-63, the sampled reward rose as much but the probe on
    dungeons 0-15 fell: at this scale the extractor learns the lessons of the dungeons it is rewarded on, not a skill
    that transfers to other layouts.)"""
    from envs.base import task_id_of
    from trainers.config import load_run_config
    from trainers.extractor import ExperienceLoop, Sample
    from trainers.probe import ExtractorProbe, probe_trajectories

    cfg = load_run_config(Path(__file__).resolve().parents[1] / "configs" / "coevolution_cpu.yaml",
                          overrides={"extractor": {"model": {"path": str(weak_folder)}, "reweight": False}})
    xc = cfg.extractor
    pool = [t for t in probe_trajectories([ENV], 16, n=128, max_turns=8, seed=1)
            if claimed_offset(t.final_observation) is not None]
    assert len(pool) >= 32 and all(task_id_of(t.task) < 16 for t in pool)
    probe = ExtractorProbe(probe_trajectories([ENV], 16, n=64, max_turns=8, seed=0))
    loop = ExperienceLoop(xc, cfg.library, store, None, seed=0, threads=1, trains=True, deterministic=True,
                          data_dir=tmp_path, run_id=store.create_run("cispo"))
    try:
        before = probe.measure(loop, 0)
        assert before["extractor/probe_correct"] <= 0.5 and before["extractor/probe_valid"] >= 0.8, before  # weak, well formed
        rng = random.Random(0)
        rewards = []
        for u in range(UPDATES):
            batch = [rng.choice(pool) for _ in range(xc.buffer_size)]
            gens = loop.generate([loop.distil_prompt(t.task, t.success, t.steps, t.final_observation) for t in batch],
                                 seed=1000 + u)
            samples = [Sample(None, g.prompt_ids, g.response_ids, g.response_logprobs,
                              _known_reward(g.response, claimed_offset(t.final_observation), xc.op_budget))
                       for g, t in zip(gens, batch)]
            rewards.append(sum(s.reward for s in samples) / len(samples))
            loop.update(samples, u)
        after = probe.measure(loop, UPDATES)
        print(f"probe_correct {before['extractor/probe_correct']:.3f} -> {after['extractor/probe_correct']:.3f} in "
              f"{UPDATES} updates; sampled reward {rewards[0]:+.2f} -> {sum(rewards[-5:]) / 5:+.2f} (last 5)")
        assert after["extractor/probe_correct"] - before["extractor/probe_correct"] >= 0.2, (before, after, rewards)
        assert after["extractor/probe_valid"] >= before["extractor/probe_valid"] - 0.1  # still writes parsable answers
    finally:
        loop.close()
        probe.close()


UPDATES = 20

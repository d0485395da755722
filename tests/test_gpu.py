"""GPU checks (issue 24), skipped without CUDA; scripts/gpu_check.sh runs them with two short training runs.
The vLLM generate + weight-sync test and the hf-on-CUDA bf16 test live in tests/test_models.py."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def cuda_model(tmp_path_factory):
    from trainers.models import build_tiny_qwen2, build_tokenizer, load_backend, save_model_folder

    tok = build_tokenizer([f"observation {i} north south east west go to fridge {i % 5}" for i in range(200)], vocab_size=400)
    model = build_tiny_qwen2(tok, hidden=64, layers=2, heads=4, kv_heads=2, mlp=128, max_pos=1024, seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)
    return load_backend("hf", save_model_folder(model, tok, tmp_path_factory.mktemp("cuda")), device="cuda", quiet=True)


def test_sessions_on_cuda_keep_greedy_replies(cuda_model):
    b = cuda_model
    assert b.dtype == torch.bfloat16
    conv = [{"role": "system", "content": "play"}]
    for t in range(3):
        conv.append({"role": "user", "content": f"observation {t} go to fridge {t}"})
        ids = b.apply_chat_template(conv, tokenize=True)
        kept = b.generate([ids], max_new_tokens=4, temperature=0.0, stop=[], sessions=["e"])[0]
        plain = b.generate([ids], max_new_tokens=4, temperature=0.0, stop=[])[0]
        assert kept.token_ids == plain.token_ids
        conv.append({"role": "assistant", "content": kept.text})
    b.drop_sessions()


def test_the_learner_steps_in_bf16_on_cuda(cuda_model):
    b = cuda_model
    out = b.generate([b.encode("observation 1 north")] * 4, max_new_tokens=6, temperature=1.0, seed=0)
    seqs = [o.prompt_ids + o.token_ids for o in out]
    opt = torch.optim.AdamW(b.trainable_parameters(), lr=1e-3)
    before = b.logprobs(seqs).clone()
    lp = b.logprobs(seqs, grad=True)
    (-lp.sum()).backward()
    opt.step()
    after = b.logprobs(seqs)
    assert torch.isfinite(after).all() and (after.sum() > before.sum())

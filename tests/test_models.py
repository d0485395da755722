"""trainers/models.py and trainers/backends/: tiny model building, the hf back end, the openai back end against a real
loopback server, and the vllm back end (GPU only)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from trainers.models import (
    BackendError,
    HFBackend,
    LoraSettings,
    OpenAIBackend,
    build_tiny_qwen2,
    build_tokenizer,
    load_backend,
    save_model_folder,
    vllm_available,
)

TEXTS = [
    f"You are in the kitchen. You see a fridge {i}, a countertop {i % 3} and a cabinet. "
    "Your task is to put a cool apple in the microwave. > go to fridge 1. > open fridge 1. "
    "> take apple 1 from fridge 1. north south east west. The door is locked. You win!"
    for i in range(200)
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = build_tokenizer(TEXTS, vocab_size=400)
    model = build_tiny_qwen2(tok, hidden=64, layers=2, heads=4, kv_heads=2, mlp=128, max_pos=512, seed=0)
    with torch.no_grad():
        # Sharper logits than the default init, so greedy choices are not near-ties that float
        # noise could flip (the batched-vs-single comparison must test positions, not rounding).
        model.model.embed_tokens.weight.mul_(4.0)
    return save_model_folder(model, tok, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def hf(model_dir):
    return load_backend("hf", model_dir, quiet=True)


def prompts_of(hf, n=5):
    texts = ["go to", "You are in the kitchen. You see a fridge 3", "open fridge 1. take apple", "> ", "north south east west. The door"]
    return [hf.encode(t) for t in texts[:n]]


# ---------------------------------------------------------------- building and loading

def test_tokenizer_has_chatml_and_specials(hf, model_dir):
    tok = hf.tokenizer
    for s in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"):
        assert s in tok.get_vocab()
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    text = hf.apply_chat_template([{"role": "system", "content": "be brief"}, {"role": "user", "content": "go north"}])
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\ngo north<|im_end|>\n<|im_start|>assistant\n"
    ids = hf.apply_chat_template([{"role": "user", "content": "go north"}], tokenize=True)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and tok.decode(ids) == "<|im_start|>user\ngo north<|im_end|>\n<|im_start|>assistant\n"
    # byte-level: unseen characters still round-trip
    assert tok.decode(hf.encode("Zürich ✓")) == "Zürich ✓"
    assert tok.convert_tokens_to_ids("<|im_end|>") in hf.end_ids
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["tie_word_embeddings"] is True


def test_the_loaded_tokenizer_splits_text_as_the_built_one(hf):
    """The warm start trains with the tokenizer it built; a run loads the saved folder (as a Qwen2
    tokenizer). Both must turn every text, numbers included, into the same ids, or a policy reads
    "drawer 3" or "2 south" at run time as tokens it never saw in training."""
    built = build_tokenizer(TEXTS, vocab_size=400)
    for text in ("open fridge 3. take apple 12 from countertop 1", "HP:12(12) Dlvl:1 5x5, it's 2 south\n\n  x",
                 "Ünïcode café 123 ✓", "## Title: Where to find a mug\n## Content: a mug 2 is in cabinet 10."):
        assert built(text, add_special_tokens=False)["input_ids"] == hf.tokenizer(text, add_special_tokens=False)["input_ids"], text
    msgs = [{"role": "system", "content": "Actions: go to X 1"}, {"role": "user", "content": "you see a drawer 3, a drawer 2"}]
    a = built.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    assert list(a if isinstance(a, list) else a["input_ids"]) == list(hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))


def test_load_backend_describes_itself(model_dir, capsys):
    b = load_backend("auto" if not (vllm_available() and torch.cuda.is_available()) else "hf", model_dir, device="cpu")
    assert isinstance(b, HFBackend)
    line = capsys.readouterr().out
    assert "[comprl] model back end: hf" in line and "cpu" in line
    assert "float32" in b.describe()


def test_inference_backend_picks_each_roles_back_end(model_dir):
    """Evaluation, A/B arms and the demo generate through inference_backend: transformers by default, the
    OpenAI-compatible client with `backend: openai` (its tokenizer from the folder)."""
    from trainers.config import ModelSection
    from trainers.models import HFBackend, OpenAIBackend, inference_backend

    assert isinstance(inference_backend(ModelSection(), model_dir, quiet=True), HFBackend)
    remote = inference_backend(ModelSection(backend="openai", base_url="http://127.0.0.1:9/v1"), model_dir, quiet=True)
    assert isinstance(remote, OpenAIBackend)


def test_bad_model_path_is_one_sentence(tmp_path):
    with pytest.raises(BackendError) as e:
        load_backend("hf", tmp_path / "nope", quiet=True)
    msg = str(e.value)
    assert "nope" in msg and "\n" not in msg and "save_pretrained" in msg
    with pytest.raises(BackendError, match="Unknown model back end"):
        load_backend("tpu", tmp_path)


def test_vllm_missing_names_the_install(model_dir, monkeypatch):
    import trainers.backends.vllm as V

    monkeypatch.setattr(V, "vllm_available", lambda: False)  # as on a machine without it
    with pytest.raises(BackendError) as e:
        load_backend("vllm", model_dir, quiet=True)
    assert "make setup" in str(e.value) and 'pip install -e ".[gpu]"' in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- sampling

def test_batched_left_padded_greedy_equals_unbatched(hf):
    # RoPE attention only sees relative positions, so a constant per-row offset would go unnoticed;
    # what breaks with left padding is an offset that differs between prefill and decoding. That
    # moves the log-probs by ~1e-3 on this model, hence the tight log-prob comparison below.
    prompts = prompts_of(hf)
    assert len({len(p) for p in prompts}) > 2  # really different lengths: real left padding
    batched = hf.generate(prompts, max_new_tokens=12, temperature=0.0)
    for p, b in zip(prompts, batched):
        single = hf.generate([p], max_new_tokens=12, temperature=0.0)[0]
        assert b.prompt_ids == p
        assert b.token_ids == single.token_ids
        assert torch.allclose(torch.tensor(b.logprobs), torch.tensor(single.logprobs), atol=1e-4)
    # and the batch is not trivially one repeated completion
    assert len({tuple(b.token_ids) for b in batched}) > 1


def test_shared_prompt_prefix_runs_once_and_changes_nothing(hf, monkeypatch):
    """Prompts that share a long head (a system prompt and task) run it once as a repeated cache;
    greedy tokens and log-probs equal single-prompt decoding and the learner's recomputation, with
    rows of different lengths (pads between the shared head and each row's own tokens)."""
    from trainers.backends import hf as M

    head = hf.encode("You are in the kitchen. You see a fridge 3, north south east west. The door " * 2)
    assert len(head) >= M.PREFIX_CACHE_MIN
    prompts = [head + p for p in prompts_of(hf)]
    assert M._common_prefix(prompts) >= len(head) and hf.prefix_cache
    calls = []
    forward = hf._forward
    monkeypatch.setattr(hf, "_forward", lambda **kw: calls.append(kw["input_ids"].shape) or forward(**kw))
    batched = hf.generate(prompts, max_new_tokens=8, temperature=0.0)
    assert calls[0][0] == 1 and calls[1] == (len(prompts), max(len(p) for p in prompts) - calls[0][1])  # the head once, then the rest
    monkeypatch.setattr(hf, "_forward", forward)
    lp = hf.logprobs([b.prompt_ids + b.token_ids for b in batched])
    for p, b in zip(prompts, batched):
        single = hf.generate([p], max_new_tokens=8, temperature=0.0)[0]
        assert b.token_ids == single.token_ids
        assert torch.allclose(torch.tensor(b.logprobs), torch.tensor(single.logprobs), atol=1e-4)
    for i, b in enumerate(batched):
        assert torch.allclose(lp[i, len(b.prompt_ids):len(b.prompt_ids) + len(b.token_ids)], torch.tensor(b.logprobs), atol=1e-4)
    assert len({tuple(b.token_ids) for b in batched}) > 1


def test_identical_prompts_are_prefilled_once_and_sample_as_before(hf, monkeypatch):
    """A group's rollouts of one task share their first prompt: it is prefilled once and its cache
    rows repeated; each row still samples on its own, exactly as without the dedupe."""
    ps = prompts_of(hf)
    prompts = [ps[0], ps[1], ps[0], ps[0], ps[2], ps[1]]
    assert hf.dedupe_prompts and len({tuple(p) for p in ps[:3]}) == 3
    calls = []
    forward = hf._forward
    monkeypatch.setattr(hf, "_forward", lambda **kw: calls.append(kw["input_ids"].shape) or forward(**kw))
    got = hf.generate(prompts, max_new_tokens=8, temperature=1.0, seed=3)
    assert calls[-2][0] == 6 and sum(c[0] for c in calls if c[1] > 1) <= 3  # prefill: 3 rows (and any shared head: 1)
    monkeypatch.setattr(hf, "_forward", forward)
    hf.dedupe_prompts = False
    try:
        plain = hf.generate(prompts, max_new_tokens=8, temperature=1.0, seed=3)
    finally:
        hf.dedupe_prompts = True
    for p, a, b in zip(prompts, got, plain):
        assert a.prompt_ids == b.prompt_ids == list(p)  # outputs in the order given
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    assert len({tuple(g.token_ids) for g in got if g.prompt_ids == list(ps[0])}) > 1  # one prompt, three samples
    same = hf.generate([ps[1]] * 4, max_new_tokens=8, temperature=0.0)  # every prompt the same: one prefill row
    assert all(g.token_ids == hf.generate([ps[1]], max_new_tokens=8, temperature=0.0)[0].token_ids for g in same)


def test_stop_string_cuts_text_but_keeps_ids(hf):
    p = hf.encode("You are in the kitchen. You see")
    full = hf.generate([p], max_new_tokens=24, temperature=0.0)[0]
    text = full.text
    k = next(k for k in range(3, len(text) - 2) if "\ufffd" not in text[k : k + 2] and text.find(text[k : k + 2]) == k)
    stop = text[k : k + 2]
    cut = hf.generate([p], max_new_tokens=24, temperature=0.0, stop=[stop, "never-seen-stop"])[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[:k]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert stop in hf.tokenizer.decode(cut.token_ids)  # ids run through the token that completed the stop
    assert len(cut.logprobs) == len(cut.token_ids)
    assert full.finish_reason == "length" and len(full.token_ids) == 24


def test_end_token_ends_a_completion(model_dir):
    b = load_backend("hf", model_dir, quiet=True)
    im_end = b.tokenizer.convert_tokens_to_ids("<|im_end|>")
    bias = torch.zeros(len(b.tokenizer))
    bias[im_end] = 1e4  # a forward hook on the head makes <|im_end|> the certain next token
    handle = b.model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    try:
        out = b.generate([b.encode("go to"), b.encode("open")], max_new_tokens=5, temperature=1.0, seed=0)
    finally:
        handle.remove()
    for o in out:
        assert o.finish_reason == "eos" and o.token_ids == [im_end] and o.text == ""
        assert o.logprobs[0] == pytest.approx(0.0, abs=1e-4)


def test_logprobs_recomputed_match_sampling_time(hf):
    prompts = prompts_of(hf, 4)
    outs = hf.generate(prompts, max_new_tokens=10, temperature=1.0, top_p=1.0, seed=7)
    lp = hf.logprobs([o.prompt_ids + o.token_ids for o in outs])  # (N, T)
    assert lp.shape == (4, max(len(o.prompt_ids) + len(o.token_ids) for o in outs))
    for i, o in enumerate(outs):
        start = len(o.prompt_ids)
        got = lp[i, start : start + len(o.token_ids)]
        assert torch.allclose(got, torch.tensor(o.logprobs), atol=1e-4)
        assert torch.allclose(torch.tensor(o.sample_logprobs), torch.tensor(o.logprobs), atol=1e-6)  # T=1, top-p 1
        assert lp[i, 0] == 0.0 and torch.all(lp[i, start + len(o.token_ids) :] == 0.0)


def test_tempered_sampling_logprobs_are_the_sampling_distribution(hf):
    prompts = prompts_of(hf, 3)
    outs = hf.generate(prompts, max_new_tokens=8, temperature=0.7, seed=3)
    raw = hf.logprobs([o.prompt_ids + o.token_ids for o in outs])
    tempered = hf.logprobs([o.prompt_ids + o.token_ids for o in outs], temperature=0.7)
    for i, o in enumerate(outs):
        s = len(o.prompt_ids)
        assert torch.allclose(raw[i, s : s + len(o.token_ids)], torch.tensor(o.logprobs), atol=1e-4)
        assert torch.allclose(tempered[i, s : s + len(o.token_ids)], torch.tensor(o.sample_logprobs), atol=1e-4)


def _plain_logprobs(model, seqs, temperature):
    """The obvious version: one unpadded forward per sequence, log_softmax over every position."""
    out = []
    for s in seqs:
        ids = torch.tensor([s])
        lp = torch.log_softmax(model(input_ids=ids).logits.float()[0, :-1] / temperature, dim=-1)  # (L-1, V)
        out.append(lp.gather(-1, ids[0, 1:, None]).squeeze(-1))  # (L-1,): log p(s[t] | s[:t]), t >= 1
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("masked", [False, True])
def test_the_one_logprob_path_equals_a_plain_log_softmax(hf, masked, temperature):
    """trainers/backends/logprobs.py `row_logprobs`, behind HFBackend.logprobs() and both learners (the actor's GRPO
    step, the extractor's CISPO step), against a plain log_softmax of one unpadded forward per sequence: right padding,
    with a loss mask (logits_to_keep and the shared-prefix cache) and without, temperature != 1; the gradients equal
    the reference's, and logprobs() (no grad, batched) gives the same numbers."""
    from trainers.backends.logprobs import PREFIX_CACHE_MIN, row_logprobs, shared_prefix
    from trainers.models import pad_right

    g = torch.Generator().manual_seed(5)
    v = len(hf.tokenizer)
    head = torch.randint(3, v, (20,), generator=g).tolist()  # a shared prompt head, long enough for the prefix cache
    seqs = [head + torch.randint(3, v, (n,), generator=g).tolist() for n in (7, 3, 12, 5)]  # different lengths
    replies = [2, 1, 4, 3]  # the last k tokens of each row carry the loss
    ids, attn = pad_right(seqs, hf.pad_id)  # (4, T)
    mask = torch.zeros(ids.shape)
    for i, (s, k) in enumerate(zip(seqs, replies)):
        mask[i, len(s) - k:len(s)] = 1.0
    if masked:
        assert hf.supports_logits_to_keep and hf.prefix_cache and shared_prefix(ids, mask) >= PREFIX_CACHE_MIN
    on = mask if masked else torch.nn.functional.pad(attn[:, 1:], (1, 0)).float()  # where a number is due; 0 elsewhere
    w = torch.rand(ids.shape, generator=g)  # a loss weighting each position differently

    hf.model.zero_grad(set_to_none=True)
    want = _plain_logprobs(hf.model, seqs, temperature)
    ref = torch.zeros(ids.shape)
    for i, r in enumerate(want):
        ref[i, 1:len(seqs[i])] = r
    (ref * on * w).sum().backward()
    ref_grads = [p.grad.clone() for p in hf.trainable_parameters()]
    hf.model.zero_grad(set_to_none=True)

    logp, ent = row_logprobs(hf, ids, attn, mask if masked else None, temperature=temperature, entropy=True)
    assert logp.requires_grad and logp.shape == ids.shape
    assert torch.allclose(logp.detach(), ref.detach() * on, atol=1e-5)
    assert torch.all(logp.detach()[on == 0] == 0.0) and torch.all(ent[on == 0] == 0.0) and torch.all(ent[on == 1] > 0)
    (logp * w).sum().backward()
    for got, exp in zip([p.grad for p in hf.trainable_parameters()], ref_grads):
        assert torch.allclose(got, exp, atol=1e-5, rtol=1e-4)
    hf.model.zero_grad(set_to_none=True)

    scored = hf.logprobs(seqs, temperature=temperature, batch_size=3)  # no grad, batches of 3 and 1
    assert not scored.requires_grad
    full = torch.nn.functional.pad(attn[:, 1:], (1, 0)).float()
    assert torch.allclose(scored, ref.detach() * full, atol=1e-5)


def test_the_exact_kl_to_a_reference_is_a_plain_sum_over_the_vocabulary(hf, model_dir):
    """trainers/backends/logprobs.py `row_logprobs_kl` (the extractor's KL penalty): its logp equals row_logprobs',
    its KL at each masked position is Σ_v p(v) (log p(v) − log p_ref(v)) of two plain forwards, 0 against itself, and
    it carries the learner's gradient only."""
    from trainers.backends.logprobs import row_logprobs, row_logprobs_kl
    from trainers.models import load_backend, pad_right

    other = load_backend("hf", model_dir, quiet=True)
    with torch.no_grad():
        for p in other.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    g = torch.Generator().manual_seed(6)
    v = len(hf.tokenizer)
    head = torch.randint(3, v, (20,), generator=g).tolist()
    seqs = [head + torch.randint(3, v, (n,), generator=g).tolist() for n in (6, 3, 9)]
    ids, attn = pad_right(seqs, hf.pad_id)
    mask = torch.zeros(ids.shape)
    for i, s in enumerate(seqs):
        mask[i, len(s) - 3:len(s)] = 1.0
    logp, kl = row_logprobs_kl(hf, other, ids, attn, mask)
    assert torch.allclose(logp.detach(), row_logprobs(hf, ids, attn, mask)[0].detach(), atol=1e-5)
    want = torch.zeros(ids.shape)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            x = torch.tensor([s])
            a = torch.log_softmax(hf.model(input_ids=x).logits.float()[0, :-1], -1)
            b = torch.log_softmax(other.model(input_ids=x).logits.float()[0, :-1], -1)
            want[i, 1:len(s)] = (a.exp() * (a - b)).sum(-1)
    assert torch.allclose(kl.detach(), want * mask, atol=1e-5) and torch.all(kl.detach()[mask == 1] > 0)
    kl.sum().backward()
    assert any(p.grad is not None for p in hf.trainable_parameters())
    assert all(p.grad is None for p in other.model.parameters())
    hf.model.zero_grad(set_to_none=True)
    _, self_kl = row_logprobs_kl(hf, hf, ids, attn, mask)
    assert torch.allclose(self_kl.detach(), torch.zeros(ids.shape), atol=1e-6)


def test_warmstart_sft_losses_equal_plain_cross_entropy_step_by_step():
    """_sft's losses come from trainers/backends/logprobs.py (no prompt weight: only the target's positions reach the
    output layer, the shared system prompt runs once). Six steps match plain F.cross_entropy over every position's
    logits (target + weight x prompt's next tokens) trained beside it (same batches, clipping, AdamW) within 1e-5."""
    import copy
    import random

    from trainers import warmstart as W
    from trainers.backends.logprobs import PREFIX_CACHE_MIN, forward_switches, shared_prefix

    system = "You play a maze. Each turn, answer with one compass word; the entry, if any, says where to go."
    tasks = [f"Task {i}: reach the {w} stairs." + " Dark." * i for i, w in enumerate(["north", "far", "east", "odd", "west"])]
    tok = build_tokenizer([system] + tasks + ["north", "south east"], vocab_size=300)
    examples = [W._join(tok, W._chat_ids(tok, [{"role": "system", "content": system}, {"role": "user", "content": t}]),
                        " south east" if i % 2 else " north", "t") for i, t in enumerate(tasks)]
    pad, cfg, steps = int(tok.pad_token_id), W.WarmStartConfig(lr=3e-3, warmup_steps=2), 6

    def padded(batch):
        ids = torch.full((len(batch), max(len(e.input_ids) for e in batch)), pad)  # (B, T) right-padded
        labels, attn = torch.full_like(ids, W.IGNORE), torch.zeros_like(ids)
        for i, e in enumerate(batch):
            ids[i, :len(e.input_ids)], labels[i, :len(e.labels)], attn[i, :len(e.input_ids)] = (
                torch.tensor(e.input_ids), torch.tensor(e.labels), 1)
        return ids, labels, attn

    model0, (ids, labels, _) = build_tiny_qwen2(tok, 32, 2, 2, 1, max_pos=512, seed=0), padded(examples)
    assert forward_switches(model0)["logits_to_keep"] and forward_switches(model0)["prefix_cache"]  # the fast path
    assert shared_prefix(ids, labels != W.IGNORE) >= PREFIX_CACHE_MIN
    runs = {}
    for w in (0.0, 1.0):
        model, ref = copy.deepcopy(model0), copy.deepcopy(model0)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
        opt, got, want = None, [], []
        for s in range(steps):
            opt, (loss,) = W._sft(model, examples, 1, cfg, pad_id=pad, seed=s, batch_size=4, start_step=s,
                                  total_steps=steps, optimizer=opt, prompt_loss_weight=w)
            got.append(loss)
            rng = random.Random(s)  # _sft's draw for this step
            ids, labels, attn = padded([examples[rng.randrange(len(examples))] for _ in range(4)])
            flat = ref(input_ids=ids, attention_mask=attn).logits[:, :-1].reshape(-1, len(tok))  # (B*(T-1), V)
            target = torch.nn.functional.cross_entropy(flat, labels[:, 1:].reshape(-1), ignore_index=W.IGNORE)
            prompt = ((labels[:, 1:] == W.IGNORE) & (attn[:, 1:] == 1)).reshape(-1)
            ref_opt.zero_grad()
            (target + w * torch.nn.functional.cross_entropy(flat[prompt], ids[:, 1:].reshape(-1)[prompt])).backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
            ref_opt.param_groups[0]["lr"] = opt.param_groups[0]["lr"]  # the step's scheduled rate
            ref_opt.step()
            want.append(target.item())
        assert got == pytest.approx(want, abs=1e-5), w
        runs[w] = got
    assert runs[0.0][0] == runs[1.0][0] and abs(runs[0.0][-1] - runs[1.0][-1]) > 1e-3  # the weight shows


def test_seed_determinism_and_top_p(hf):
    prompts = prompts_of(hf, 3) * 2
    a = hf.generate(prompts, max_new_tokens=10, temperature=1.0, seed=11)
    b = hf.generate(prompts, max_new_tokens=10, temperature=1.0, seed=11)
    c = hf.generate(prompts, max_new_tokens=10, temperature=1.0, seed=12)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    assert a[0].token_ids != a[3].token_ids  # the same prompt twice in a call samples differently
    greedy = hf.generate(prompts[:3], max_new_tokens=10, temperature=0.0)
    tiny_p = hf.generate(prompts[:3], max_new_tokens=10, temperature=1.0, top_p=1e-6, seed=5)
    assert [o.token_ids for o in greedy] == [o.token_ids for o in tiny_p]


def test_input_errors(hf):
    with pytest.raises(ValueError, match="exceeds"):
        hf.generate([[1] * 500], max_new_tokens=20)
    with pytest.raises(ValueError):
        hf.generate([[]], max_new_tokens=2)


# ---------------------------------------------------------------- training-side use

def test_logprobs_with_grad_and_weight_sync(model_dir, hf):
    learner = load_backend("hf", model_dir, quiet=True)
    seqs = [o.prompt_ids + o.token_ids for o in hf.generate(prompts_of(hf, 3), max_new_tokens=6, seed=1)]
    lp = learner.logprobs(seqs, grad=True)
    assert lp.requires_grad
    opt = torch.optim.SGD(learner.trainable_parameters(), lr=0.5)
    (-lp.sum()).backward()
    opt.step()
    after = learner.logprobs(seqs)
    assert not torch.allclose(after, hf.logprobs(seqs))  # the learner moved
    rollout = load_backend("hf", model_dir, quiet=True)
    rollout.sync_weights(learner.state_dict_for_sync())
    assert torch.allclose(rollout.logprobs(seqs), after, atol=1e-6)
    saved = learner.save(model_dir.parent / "after-step")
    assert torch.allclose(load_backend("hf", saved, quiet=True).logprobs(seqs), after, atol=1e-6)
    rollout.load_weights(saved)  # from a folder, as after a checkpoint
    # the single-file path the vllm back end ships to its workers (tied weights written once)
    from trainers.backends.common import write_weights

    write_weights(learner.state_dict_for_sync(), model_dir.parent / "sync.safetensors")
    fresh = load_backend("hf", model_dir, quiet=True)
    fresh.load_weights(model_dir.parent / "sync.safetensors")
    assert torch.allclose(fresh.logprobs(seqs), after, atol=1e-6)
    with pytest.raises(BackendError):
        rollout.load_weights({"not.a.weight": torch.zeros(1)})


def test_lora_trains_adapters_only_and_merges(model_dir, hf):
    b = load_backend("hf", model_dir, lora=LoraSettings(r=4, alpha=8), quiet=True)
    params = b.trainable_parameters()
    assert params and all(p.numel() < 64 * 64 for p in params)
    seqs = [o.prompt_ids + o.token_ids for o in hf.generate(prompts_of(hf, 2), max_new_tokens=5, seed=2)]
    base = hf.logprobs(seqs)
    assert torch.allclose(b.logprobs(seqs), base, atol=1e-5)  # LoRA B starts at 0
    opt = torch.optim.SGD(params, lr=1.0)
    for _ in range(3):
        opt.zero_grad()
        (-b.logprobs(seqs, grad=True).sum()).backward()
        opt.step()
    trained = b.logprobs(seqs)
    assert not torch.allclose(trained, base, atol=1e-4)
    target = load_backend("hf", model_dir, quiet=True)
    target.sync_weights(b.state_dict_for_sync())  # merged weights under plain names
    assert torch.allclose(target.logprobs(seqs), trained, atol=1e-4)
    assert torch.allclose(b.logprobs(seqs), trained)  # unmerged again after the export
    assert "LoRA r=4" in b.describe()
    saved = b.save(model_dir.parent / "lora-merged")  # a plain HF folder with the adapters merged
    assert torch.allclose(load_backend("hf", saved, quiet=True).logprobs(seqs), trained, atol=1e-4)


# ---------------------------------------------------------------- openai back end, real loopback server

class _Server:
    """A minimal OpenAI-compatible HTTP server over an HFBackend (completions and chat)."""

    def __init__(self, backend, fail_first: int = 0):
        self.backend, self.fail_left, self.requests = backend, fail_first, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                if outer.fail_left > 0:
                    outer.fail_left -= 1
                    return self._send(503, {"error": "warming up"})
                if body.get("model") != "tiny":
                    return self._send(404, {"error": f"model {body.get('model')!r} not found"})
                kw = dict(max_new_tokens=body.get("max_tokens", 16), temperature=body.get("temperature", 1.0),
                          top_p=body.get("top_p", 1.0), stop=body.get("stop"), seed=body.get("seed"))
                as_ids = bool(body.get("return_tokens_as_token_ids"))
                tok = outer.backend.tokenizer

                def names(ids):
                    return [f"token_id:{t}" if as_ids else tok.decode([t]) for t in ids]

                if self.path == "/v1/completions":
                    prompts = body["prompt"]
                    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
                        prompts = [prompts]
                    outs = outer.backend.generate(prompts, **kw)
                    choices = [{"index": i, "text": o.text, "finish_reason": "length" if o.finish_reason == "length" else "stop",
                                "logprobs": {"tokens": names(o.token_ids), "token_logprobs": o.logprobs}} for i, o in enumerate(outs)]
                    return self._send(200, {"object": "text_completion", "model": "tiny", "choices": choices})
                if self.path == "/v1/chat/completions":
                    o = outer.backend.chat([body["messages"]], **kw)[0]
                    content = [{"token": n, "logprob": lp} for n, lp in zip(names(o.token_ids), o.logprobs)]
                    choice = {"index": 0, "message": {"role": "assistant", "content": o.text},
                              "finish_reason": "length" if o.finish_reason == "length" else "stop", "logprobs": {"content": content}}
                    return self._send(200, {"object": "chat.completion", "model": "tiny", "choices": [choice]})
                return self._send(404, {"error": "no such route"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_openai_round_trip_against_loopback_server(hf, model_dir):
    prompts = prompts_of(hf, 3)
    local = hf.generate(prompts, max_new_tokens=8, temperature=0.0)
    with _Server(hf) as srv:
        client = load_backend("openai", "tiny", base_url=srv.url, quiet=True, token_ids_from_server=True)
        assert isinstance(client, OpenAIBackend) and srv.url in client.describe()
        remote = client.generate(prompts, max_new_tokens=8, temperature=0.0)
        assert [r.text for r in remote] == [o.text for o in local]
        assert [r.token_ids for r in remote] == [o.token_ids for o in local]
        assert torch.allclose(torch.tensor(remote[0].logprobs), torch.tensor(local[0].logprobs), atol=1e-5)
        # string prompts and chat
        s = client.generate(["go to"], max_new_tokens=4, temperature=0.0)[0]
        assert s.text == hf.generate(["go to"], max_new_tokens=4, temperature=0.0)[0].text
        conv = [{"role": "user", "content": "go north"}]
        chat = client.chat([conv, conv], max_new_tokens=6, temperature=0.0)
        assert chat[0].text == chat[1].text == hf.chat([conv], max_new_tokens=6, temperature=0.0)[0].text
        # a local tokenizer folder gives templates; without server ids, text is re-tokenised
        with_tok = OpenAIBackend(srv.url, "tiny", tokenizer_path=model_dir)
        assert with_tok.apply_chat_template(conv) == hf.apply_chat_template(conv)
        assert with_tok.generate(["go to"], max_new_tokens=4, temperature=0.0)[0].text == s.text
        with pytest.raises(BackendError, match="inference only"):
            client.logprobs([[1, 2, 3]])
        with pytest.raises(BackendError, match="refused"):
            OpenAIBackend(srv.url, "other-model", max_retries=0).generate(["x"], max_new_tokens=2)


def test_openai_retries_then_succeeds_and_gives_up_on_a_dead_port(hf):
    with _Server(hf, fail_first=2) as srv:
        client = OpenAIBackend(srv.url, "tiny", max_retries=3, backoff_s=0.01, timeout=10)
        out = client.generate(["go to"], max_new_tokens=3, temperature=0.0)
        assert out[0].text == hf.generate(["go to"], max_new_tokens=3, temperature=0.0)[0].text
        assert srv.requests == 3
        port = srv.httpd.server_address[1]
    dead = OpenAIBackend(f"http://127.0.0.1:{port}", "tiny", max_retries=1, backoff_s=0.01, timeout=2)
    with pytest.raises(BackendError, match="did not answer after 2 tries"):
        dead.generate(["go to"], max_new_tokens=2)


# ---------------------------------------------------------------- GPU only

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_hf_on_cuda_uses_bf16_and_matches_cpu_greedy(model_dir, hf):
    g = load_backend("hf", model_dir, device="cuda", quiet=True)
    assert g.dtype == torch.bfloat16 and "cuda" in g.describe()
    outs = g.generate(prompts_of(hf, 3), max_new_tokens=6, temperature=1.0, seed=0)
    lp = g.logprobs([o.prompt_ids + o.token_ids for o in outs]).cpu()
    for i, o in enumerate(outs):
        s = len(o.prompt_ids)
        assert torch.allclose(lp[i, s : s + len(o.token_ids)], torch.tensor(o.logprobs), atol=0.1)  # bf16

"""The GRPO learner: loss mask, subgroup averaging under micro-batching, an update that moves the policy."""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from core.losses import clipped_surrogate_loss
from core.types import Trajectory
from trainers.actor_step import _tensors, actor_update, build_rows, episode_advantages, policy_gradient, reply_tensors
from trainers.backends.logprobs import row_logprobs
from trainers.config import LossSection, ModelSection
from trainers.models import pad_right
from trainers.rollout import Episode, EpisodeSpec, TurnSample


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trainers.models import HFBackend, build_tiny_qwen2, build_tokenizer, save_model_folder

    d = tmp_path_factory.mktemp("tiny")
    tok = build_tokenizer(["north east south west observation task experience"] * 50, vocab_size=300)
    save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1), tok, d)
    return HFBackend(d, device="cpu")


def make_episode(backend, gid, with_exp, reward, obs="observation text", exp="experience text"):
    prompt = backend.encode(f"task {exp if with_exp else ''} {obs}")
    reply = backend.encode(" north") + [backend.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    with torch.no_grad():
        old = backend.logprobs([prompt + reply])[0, len(prompt):len(prompt) + len(reply)].tolist()
    traj = Trajectory(env="e", task="t", seed=gid, with_experience=with_exp, group_id=gid, reward=reward, success=reward > 0)
    ep = Episode(EpisodeSpec("e", gid, with_exp, gid), traj)
    ep.turns = [TurnSample(prompt, reply, old), TurnSample(prompt + reply, reply, old)]
    return ep, len(prompt), len(reply)


def batch(backend):
    eps = []
    for gid in range(2):
        for i, (we, r) in enumerate([(True, 1.0), (True, 0.0), (True, 1.0), (False, 0.0), (False, 1.0), (False, 0.0)]):
            eps.append(make_episode(backend, gid, we, r if gid == 0 else 1 - r)[0])
    return eps


def test_loss_mask_gives_zero_gradient_to_observation_and_experience_tokens(tiny):
    ep, n_prompt, n_reply = make_episode(tiny, 0, True, 1.0)
    rows = build_rows([ep], torch.tensor([1.0]))
    ids, attn, mask, old = _tensors(rows, tiny.pad_id)
    logp = (old + 0.01 * torch.randn(ids.shape)).requires_grad_()  # the model's log-probs, near the sampling ones (unclipped)
    loss, _ = clipped_surrogate_loss(logp, old, torch.tensor([1.0] * len(rows)), mask, None, level="token")
    loss.backward()
    g = logp.grad[0]
    assert (g[:n_prompt] == 0).all(), "prompt tokens (task, experience, observation) must get no gradient"
    assert (g[n_prompt:n_prompt + n_reply] != 0).all(), "every reply token carries loss"
    assert mask[0].sum() == n_reply and mask[0, :n_prompt].sum() == 0


def test_reply_tensors_by_hand():
    """The learners' one batch builder (actor rows and the extractor's CISPO samples): right padding, loss on the
    reply tokens only, the old log-probs at the reply positions."""
    ids, attn, mask, old = reply_tensors([([1], [2], [-0.5]), ([5, 6], [7, 8, 9], [-1.0, -2.0, -3.0])], pad_id=0)
    assert ids.tolist() == [[1, 2, 0, 0, 0], [5, 6, 7, 8, 9]]
    assert attn.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert mask.tolist() == [[0, 1, 0, 0, 0], [0, 0, 1, 1, 1]]
    assert old.tolist() == [[0, -0.5, 0, 0, 0], [0, 0, -1, -2, -3]]
    assert mask.dtype == old.dtype == torch.float32


@pytest.mark.parametrize("shared", [0, 24])
def test_fast_learner_forward_matches_the_full_one(tiny, shared):
    """The learner projects only reply positions onto the vocabulary (logits_to_keep) and runs the
    rows' shared leading tokens once (a repeated key/value cache); log-probs, entropy and gradients
    at the reply tokens equal those of one plain forward over every position."""
    from trainers.actor_step import Row
    from trainers.backends.logprobs import shared_prefix
    from trainers.models import PREFIX_CACHE_MIN

    g = torch.Generator().manual_seed(shared)
    head = torch.randint(3, 200, (shared,), generator=g).tolist()
    rows = []
    for i, n in enumerate((5, 9, 2, 7)):  # different prompt lengths, reply positions and reply lengths
        prompt = head + torch.randint(3, 200, (n,), generator=g).tolist()
        reply = torch.randint(3, 200, (1 + i % 3,), generator=g).tolist()
        rows.append(Row(prompt + reply, len(prompt), [0.0] * len(reply), 1.0, True, i))
    ids, attn, mask, _ = _tensors(rows, tiny.pad_id)
    assert tiny.supports_logits_to_keep
    assert (shared_prefix(ids, mask) >= PREFIX_CACHE_MIN) == (shared > 0)
    out = {}
    for fast in (True, False):
        tiny.model.zero_grad(set_to_none=True)
        logp, ent = row_logprobs(tiny, ids, attn, mask if fast else None, entropy=True)
        (logp * mask).sum().backward()
        out[fast] = (logp.detach() * mask, ent * mask, [p.grad.clone() for p in tiny.trainable_parameters()])
    tiny.model.zero_grad(set_to_none=True)
    assert torch.allclose(out[True][0], out[False][0], atol=1e-5) and (out[True][0] != 0).sum() == mask.sum()
    assert torch.allclose(out[True][1], out[False][1], atol=1e-5) and (out[True][1] > 0).sum() == mask.sum()
    for x, y in zip(out[True][2], out[False][2]):
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-4)


def test_advantages_are_split_by_subgroup(tiny):
    eps = batch(tiny)
    adv = episode_advantages(eps, normalize_std=False, joint=False)
    # group 0, with experience: rewards 1, 0, 1 -> mean 2/3
    assert torch.allclose(adv[:3], torch.tensor([1 / 3, -2 / 3, 1 / 3]))
    # group 0, without: 0, 1, 0 -> mean 1/3
    assert torch.allclose(adv[3:6], torch.tensor([-1 / 3, 2 / 3, -1 / 3]))


def batch_with_equal_subgroups(backend):
    """One subgroup of every group is all-equal (zero advantages); episodes of 1..3 turns."""
    eps = []
    spec = {0: [(True, 1.0), (True, 0.0), (True, 1.0), (False, 1.0), (False, 1.0), (False, 1.0)],
            1: [(True, 0.0), (True, 0.0), (True, 0.0), (False, 0.0), (False, 1.0), (False, 0.0)]}
    words = ["north", "east", "south", "west", "observation", "task"]
    for gid, outcomes in spec.items():
        for k, (we, r) in enumerate(outcomes):  # different prompts: different ratios once off-policy
            e = make_episode(backend, gid, we, r, obs=f"{words[k]} {words[(k + gid + 1) % 6]} observation text")[0]
            e.turns = e.turns[:1] * (1 + (k + gid) % 3)
            eps.append(e)
    return eps


@contextlib.contextmanager
def moved_off_policy(backend):
    """Move the policy away from the one that sampled (ratios differ from 1, some clip), then restore it."""
    state = copy.deepcopy(backend.model.state_dict())
    try:
        with torch.no_grad():
            for p in backend.trainable_parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        yield
    finally:
        backend.model.load_state_dict(state)


def full_batch_reference(backend, eps, adv, level):
    """docs/method.md's loss in one call over every turn of every episode, zero advantages included."""
    rows = [(t, a, e.spec.with_experience) for e, a in zip(eps, adv.tolist()) for t in e.turns]
    ids, attn = pad_right([t.prompt_ids + t.response_ids for t, _, _ in rows], backend.pad_id)
    mask = torch.zeros(ids.shape)
    old = torch.zeros(ids.shape)
    for i, (t, _, _) in enumerate(rows):
        mask[i, len(t.prompt_ids):len(t.prompt_ids) + len(t.response_ids)] = 1.0
        old[i, len(t.prompt_ids):len(t.prompt_ids) + len(t.response_ids)] = torch.tensor(t.logprobs)
    logp, _ = row_logprobs(backend, ids, attn)
    return clipped_surrogate_loss(logp, old, torch.tensor([a for _, a, _ in rows]), mask,
                                  torch.tensor([w for _, _, w in rows]), level=level)[0]


@pytest.mark.parametrize("equal_subgroups", [False, True])
def test_micro_batching_gives_the_full_batch_gradient(tiny, equal_subgroups):
    eps = batch_with_equal_subgroups(tiny) if equal_subgroups else batch(tiny)
    adv = episode_advantages(eps, normalize_std=True, joint=False)
    assert (adv == 0).any() == equal_subgroups
    rows = build_rows(eps, adv)
    cfg = LossSection(ratio_level="sequence")
    grads = []
    with moved_off_policy(tiny):
        for mb in (1, 3, 100):
            tiny.model.zero_grad(set_to_none=True)
            got = policy_gradient(tiny, rows, cfg, mb)["policy/loss"]
            grads.append([p.grad.clone() for p in tiny.trainable_parameters()])
        # the reference: one call of the loss over the whole batch, every row, with the subgroup flag
        tiny.model.zero_grad(set_to_none=True)
        loss = full_batch_reference(tiny, eps, adv, "sequence")
        loss.backward()
        ref = [p.grad.clone() for p in tiny.trainable_parameters()]
    assert got == pytest.approx(float(loss.detach()), rel=1e-4, abs=1e-6)
    for g in grads:
        for x, y in zip(g, ref):
            assert torch.allclose(x, y, atol=1e-6, rtol=1e-4)
    tiny.model.zero_grad(set_to_none=True)


def test_zero_advantage_rows_count_in_the_denominators_by_hand(tiny):
    """At ratio 1 (the sampling policy) the loss is −mean over subgroups of Σ A·T / Σ T. Every reply has
    n tokens; no std normalisation. With subgroup: group 0 rewards (1, 0) -> A (0.5, −0.5) over 1 and 2
    turns; group 1 (1, 1) -> A 0, 1 turn each: objective (0.5n − n + 0) / 5n = −0.1. Without: group 0
    (1, 1) -> 0 over 3 turns each; group 1 (1, 0) -> (0.5, −0.5) over 2 and 1 turns: (n − 0.5n) / 9n = 1/18.
    Loss = −(−0.1 + 1/18) / 2 = 1/45 = 0.02222. Dropping the zero rows would give −(−1/6 + 1/6) / 2 = 0."""
    spec = [(0, True, 1.0, 1), (0, True, 0.0, 2), (1, True, 1.0, 1), (1, True, 1.0, 1),
            (0, False, 1.0, 3), (0, False, 1.0, 3), (1, False, 1.0, 2), (1, False, 0.0, 1)]
    eps = []
    for gid, we, r, turns in spec:
        e = make_episode(tiny, gid, we, r)[0]
        e.turns = e.turns[:1] * turns
        eps.append(e)
    adv = episode_advantages(eps, normalize_std=False, joint=False)
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0, 0.0, 0.0, 0.5, -0.5]
    tiny.model.zero_grad(set_to_none=True)
    got = policy_gradient(tiny, build_rows(eps, adv), LossSection(ratio_level="token"), 2)["policy/loss"]
    tiny.model.zero_grad(set_to_none=True)
    assert got == pytest.approx(1 / 45, abs=1e-4)


def test_update_raises_likelihood_of_advantaged_actions(tiny):
    backend = tiny
    state = copy.deepcopy(backend.model.state_dict())
    try:
        good, n_p, n_r = make_episode(backend, 0, False, 1.0)
        bad, _, _ = make_episode(backend, 0, False, 0.0)
        bad.turns = [TurnSample(t.prompt_ids, backend.encode(" south") + t.response_ids[-1:], [], "action") for t in bad.turns]
        with torch.no_grad():
            for t in bad.turns:
                t.logprobs = backend.logprobs([t.prompt_ids + t.response_ids])[0, len(t.prompt_ids):].tolist()
        eps = [good, bad]
        seq = good.turns[0].prompt_ids + good.turns[0].response_ids
        before = backend.logprobs([seq])[0, n_p:].sum()
        opt = torch.optim.AdamW(backend.trainable_parameters(), lr=1e-2)
        st = actor_update(backend, opt, eps, LossSection(), ModelSection(micro_batch=4))
        after = backend.logprobs([seq])[0, n_p:].sum()
        assert after > before and st["policy/frac_nonzero_adv"] == 1.0 and st["policy/grad_norm"] > 0
        # identical outcomes -> nothing to learn, no step
        st = actor_update(backend, opt, [good, copy.deepcopy(good)], LossSection(), ModelSection())
        assert st["policy/skipped"] == 1.0 and st["policy/frac_nonzero_adv"] == 0.0
    finally:
        backend.model.load_state_dict(state)


def test_episode_aggregation_weighs_every_episode_equally(tiny):
    """loss.aggregation="episode": the full-batch objective equals, per subgroup, the mean over episodes
    of each episode's own token mean (slow reference: one loss call per episode); a 6-turn failure no
    longer outweighs a 1-turn success."""
    from trainers.actor_step import weight_by_episode

    eps = batch_with_equal_subgroups(tiny)
    for k, e in enumerate(eps):  # episodes of 1..6 turns
        e.turns = e.turns[:1] * (1 + k % 6)
    adv = episode_advantages(eps, normalize_std=True, joint=False)
    assert (adv == 0).sum() == 6  # one all-equal subgroup per group: its episodes count in the episode mean
    with moved_off_policy(tiny):  # at ratio 1 the episode mean of A is 0 in every subgroup: nothing to compare
        rows = weight_by_episode(build_rows(eps, adv))
        tiny.model.zero_grad(set_to_none=True)
        got = policy_gradient(tiny, rows, LossSection(), 4)["policy/loss"]
        tiny.model.zero_grad(set_to_none=True)
        per_group = {True: [], False: []}
        with torch.no_grad():
            for e, a in zip(eps, adv.tolist()):
                if a == 0.0:  # counts as one episode with objective 0
                    per_group[e.spec.with_experience].append(0.0)
                    continue
                one = build_rows([e], torch.tensor([a]))
                ids, attn, mask, old = _tensors(one, tiny.pad_id)
                logp, _ = row_logprobs(tiny, ids, attn)
                loss, _ = clipped_surrogate_loss(logp, old, torch.tensor([a] * len(one)), mask, level="sequence")
                per_group[e.spec.with_experience].append(float(loss))
        want = sum(sum(v) / len(v) for v in per_group.values() if v) / sum(1 for v in per_group.values() if v)
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
        # and the token mean is a different objective on the same batch
        plain = policy_gradient(tiny, build_rows(eps, adv), LossSection(), 4)["policy/loss"]
        tiny.model.zero_grad(set_to_none=True)
        assert plain != pytest.approx(want, rel=1e-3)


def test_aggregation_is_checked():
    from core.config import ConfigError

    with pytest.raises(ConfigError, match="loss.aggregation"):
        LossSection(aggregation="turn")


def test_outcome_reward_ignores_the_envs_step_penalties(tiny):
    """All four episodes of a subgroup failed, with different step penalties: the env reward gives them
    full-size advantages (noise), the outcome reward gives 0."""
    eps = [make_episode(tiny, 0, False, r)[0] for r in (-0.01, -0.05, -0.02, -0.03)]
    for e in eps:
        e.traj.success = False
    assert episode_advantages(eps, normalize_std=True, joint=False).abs().max() > 1.0  # penalty noise at full size
    assert episode_advantages(eps, normalize_std=True, joint=False, reward="outcome").abs().max() == 0
    eps[0].traj.success = True
    a = episode_advantages(eps, normalize_std=False, joint=False, reward="outcome")
    assert torch.allclose(a, torch.tensor([1.5, -0.5, -0.5, -0.5]))
    with pytest.raises(Exception, match="loss.reward"):
        LossSection(reward="score")


def test_lr_warmup_ramps_linearly_and_resumes_from_the_optimisers_step_count():
    from trainers.actor_step import warmed_lr

    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p], lr=1.0)
    seen = []
    for _ in range(5):
        seen.append(warmed_lr(opt, 1e-3, 4))
        p.grad = torch.ones(3)
        opt.step()
    assert seen == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    resumed = torch.optim.AdamW([p], lr=1.0)
    resumed.load_state_dict(opt.state_dict())  # a checkpoint keeps the step count, so the ramp does not restart
    assert warmed_lr(resumed, 1e-3, 4) == pytest.approx(1e-3)
    assert warmed_lr(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 1e-3, 0) == pytest.approx(1e-3)

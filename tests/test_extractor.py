"""The extractor's side: a bad answer in a distillation batch costs only itself, Eq. 7 by entry id,
CISPO updates that change the weights, search-and-ask through a real manager and rollout, merges.
The parsers themselves: tests/test_parsing.py."""
from __future__ import annotations

import json

import pytest
import torch

from core.config import IndexConfig, ManagerConfig
from core.manager import ExperienceManager, OpContext
from core.types import Experience, Operation, format_entry_text
from trainers.extractor import Sample

MEM = format_entry_text("Stairs", "Room-5x5", "Move diagonally towards the > first.")


def ans(ops) -> str:
    return f"<think>reasoning</think><answer>{json.dumps(ops)}</answer>"


@pytest.fixture()
def loop(tmp_path, store, embedder):
    """An ExperienceLoop over a real store and manager with a tiny random extractor."""
    from trainers.config import load_run_config
    from trainers.extractor import ExperienceLoop
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder
    from trainers import prompts as P

    tok = build_tokenizer([P.EXTRACTOR_USER, P.REWRITE_USER, MEM] * 20, vocab_size=400)
    save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1), tok, tmp_path / "extractor")
    cfg = load_run_config({"run": {"variant": "complementary", "threads": 1},
                           "extractor": {"model": {"path": str(tmp_path / "extractor"), "max_new_tokens": 12}, "buffer_size": 4}})
    mgr = ExperienceManager(store, embedder, ManagerConfig(random_demote=False), IndexConfig(use_gpu="never"))
    run = store.create_run("t")
    lp = ExperienceLoop(cfg.extractor, cfg.library, store, mgr, seed=cfg.run.seed, threads=cfg.run.threads,
                        trains=cfg.trains_extractor, deterministic=cfg.run.deterministic, data_dir=tmp_path, run_id=run)
    yield lp
    lp.close()
    mgr.close()


def _entry_with_generation(loop, text, task):
    g = loop.generate([f"distil {task}"], seed=1)[0]  # a real generation of the extractor
    r = loop.manager.apply_operations([Operation("add", text=text, generation=g)], OpContext(env="e", task=task))[0]
    return r.new_id, g


@pytest.mark.slow
def test_eq7_weights_are_looked_up_by_entry_id_and_change_the_update(loop, store):
    a, _ = _entry_with_generation(loop, MEM, "task a")
    b, _ = _entry_with_generation(loop, format_entry_text("Keys", "d", "Take the key first."), "task b")
    ga, gb = store.get(a).generation, store.get(b).generation

    def sample(i, g, r):
        return Sample(i, list(g.prompt_ids), list(g.response_ids), list(g.response_logprobs), r)

    first = [sample(a, ga, 1.0), sample(b, gb, -1.0)]
    assert loop.eq7_weights(first).tolist() == [1.0, 1.0]  # never trained
    w_before = [p.detach().clone() for p in loop.backend.trainable_parameters()]
    st = loop.update(first, step=1)
    assert any(not torch.equal(x, p) for x, p in zip(w_before, loop.backend.trainable_parameters())), "weights must change"
    assert st["extractor/updates"] == 1.0 and store.training_stats([a, b]) == {a: (1, 0), b: (1, 0)}
    # one update later: (1 + 1)^-0.5 for both; an entry never trained keeps 1
    c, _ = _entry_with_generation(loop, format_entry_text("Doors", "d", "Open doors."), "task c")
    w = loop.eq7_weights([sample(a, ga, 1.0), sample(b, gb, 1.0), sample(c, store.get(c).generation, 1.0)])
    assert torch.allclose(w, torch.tensor([2 ** -0.5, 2 ** -0.5, 1.0]))
    # cooldown: trained at the update about to run -> weight 0
    store.record_trained([c], loop.updates)
    assert loop.eq7_weights([sample(c, store.get(c).generation, 1.0)]).tolist() == [0.0]


def test_search_and_ask_round_trip(loop, store):
    a, _ = _entry_with_generation(loop, MEM, "Reach the staircase down")
    answer, ids, gen = loop.tool_fn("Reach the staircase down", "how do I reach the stairs quickly?", "e", step=3)
    assert ids == [a] and gen is not None and gen.response_ids
    assert answer  # the extractor's rewrite, or the entry itself when the rewrite does not parse
    assert "how do I reach the stairs quickly?" in gen.prompt and MEM in gen.prompt
    assert loop.counters["tool_calls"] == 1 and loop.counters["tool_hits"] == 1
    assert loop.tool_fn("task", "anything", "no-such-env", step=3) == ("", [], None)


def test_parse_critic_reply():
    from trainers.prompts import parse_critic_reply

    assert parse_critic_reply("accept") == 1.0 and parse_critic_reply(" Refine.") == 0.5
    assert parse_critic_reply("reject\n") == 0.0 and parse_critic_reply("north") is None and parse_critic_reply("") is None


class TeacherForced:
    """The loop's real tiny extractor made to answer `answer_fn(prompt text)`: the text is forced, but
    its token ids and log-probs are the real model's (what CISPO would train on)."""

    def __init__(self, real, answer_fn):
        self.real, self.answer_fn, self.prompts = real, answer_fn, []

    def apply_chat_template(self, *a, **k):
        return self.real.apply_chat_template(*a, **k)

    def sync_weights(self, weights):  # the learner is `real` itself: nothing to copy
        self.synced = getattr(self, "synced", 0) + 1

    def generate(self, prompts, **kw):
        from trainers.models import GenerationOutput

        outs = []
        self.batches = getattr(self, "batches", []) + [len(prompts)]
        for p in prompts:
            text = self.answer_fn(self.real.tokenizer.decode(p))
            self.prompts.append(text)
            ids = self.real.encode(text)
            lp = self.real.logprobs([list(p) + ids])[0, len(p):].tolist()
            outs.append(GenerationOutput(list(p), ids, text, lp, lp, "eos"))
        return outs


def test_merge_driver_with_the_extractor_on_a_small_library(loop, store):
    task = "Reach the staircase down"
    dup = format_entry_text("Stairs", "d", "Walk diagonally toward the staircase.")
    ids = [_entry_with_generation(loop, t, task)[0] for t in
           (dup, format_entry_text("Keys", "d", "Take the key first."), dup, format_entry_text("Wrong", "d", "Stairs are always north."))]
    before = store.count()

    # 1. the real (random-weight) extractor: its answers do not parse, so every chunk keeps its entries
    rep = loop.merge(step=5)
    assert rep["library/merge_unparsed"] >= 1 and rep["library/merges"] == 0 and store.count() == before

    # 2. an extractor that answers like the warm-started one: merge the two duplicates, discard the wrong entry
    def answer(prompt):
        import re

        lines = re.split(r"^\[\d+\] ", prompt.split("numbered:", 1)[1], flags=re.M)[1:]  # one item per entry
        same = [i for i, ln in enumerate(lines) if "Walk diagonally" in ln]
        wrong = [i for i, ln in enumerate(lines) if "always north" in ln]
        ops = [{"function": "merge", "idx_list": same, "merged_memory": dup}] if len(same) > 1 else []
        ops += [{"function": "discard", "idx_list": wrong}] if wrong else []
        return ans(ops)

    loop.infer = TeacherForced(loop.backend, answer)
    rep = loop.merge(step=10)
    assert rep["library/merges"] == 1 and rep["library/merge_discards"] == 1 and rep["library/merge_unparsed"] == 0
    assert store.count() == before - 2  # two duplicates became one, the wrong entry is archived
    merged = [e for e in store.list_entries(limit=100).entries if e.parent_ids]
    assert len(merged) == 1 and sorted(merged[0].parent_ids) == sorted([ids[0], ids[2]])  # lineage
    g = merged[0].generation
    assert g is not None and g.response_ids and "merge" in g.response  # the merge generation is kept for credit
    assert loop.counters["merges"] == 1


def test_merge_decides_the_walks_of_every_task_in_one_batched_call(loop, store):
    """Two tasks' libraries are two walks: each round's chunks go to the extractor as one batch, and
    what it merged in one task never touches the other."""
    import dataclasses
    import re

    a = [_entry_with_generation(loop, format_entry_text("Stairs", "d", f"Walk diagonally, tip {i}."), "task A")[0] for i in range(3)]
    b = [_entry_with_generation(loop, format_entry_text("Keys", "d", f"Take the key, tip {i}."), "task B")[0] for i in range(3)]

    def answer(prompt):  # merge the chunk's first two entries
        return ans([{"function": "merge", "idx_list": [0, 1]}]) if re.search(r"^\[1\] ", prompt, re.M) else ans([])

    loop.library = dataclasses.replace(loop.library, merge=dataclasses.replace(loop.library.merge, order="id", batch=8))
    loop.infer = TeacherForced(loop.backend, answer)
    rep = loop.merge(step=5)
    assert loop.infer.batches[0] == 2  # both tasks' first chunks in one call
    assert rep["library/merge_walks"] == 2 and rep["library/merges"] == 2 and rep["library/merge_chunks"] == 2
    merged = [e for e in store.list_entries(limit=100).entries if e.parent_ids]
    assert sorted(sorted(e.parent_ids) for e in merged) == [a[:2], b[:2]]
    assert {e.task for e in merged} == {"task A", "task B"} and rep["time/merge_s"] > 0


@pytest.mark.slow
def test_eq7_weights_differ_from_one_on_a_real_buffer(loop, store):
    """Real episodes -> distillation -> retrieval -> credit -> buffer -> CISPO update, twice: after the
    first update the buffer's Eq. 7 weights are looked up by entry id and are no longer all 1
    (the authors' release keys them wrongly and they are silently 1)."""
    from envs.pool import EnvPool
    from trainers.config import ModelSection, RolloutSection
    from trainers.rollout import EpisodeSpec, Roller

    n = {"i": 0}

    def add_answer(prompt):  # the first step's episodes each add an entry; later ones learn nothing new
        n["i"] += 1
        if n["i"] > 4:
            return ans([])
        return ans([{"function": "add", "new_memory": format_entry_text(f"Lesson {n['i'] % 3}", "Room-5x5",
                                                                       f"Step southeast; lesson {n['i'] % 3}.")}])

    loop.infer = TeacherForced(loop.backend, add_answer)
    # The entries share one key (the task), so with s_rank = −rank and no random demotion the top entry
    # would be retrieved at almost every step and the buffer would fill too slowly for two updates in
    # six steps; the cosine reading spreads retrievals over the entries (tests/test_manager.py).
    loop.manager.cfg.rank_score = "cosine"
    pool = EnvPool(["minihack/Room-5x5"] * 4, num_workers=2)
    try:
        roller = Roller(loop.backend, pool, loop.manager, rollout_cfg=RolloutSection(), actor_cfg=ModelSection(max_new_tokens=3),
                        max_turns=2, seed=0)
        weights_seen, updates = [], []
        for step in range(1, 7):
            eps = roller.collect([EpisodeSpec("minihack/Room-5x5", 100 * step + i, i < 2, 0) for i in range(4)], step=step)
            for e in eps:
                e.traj.success = e.spec.seed % 2 == 0  # both outcomes, so rewards are not all equal
            loop.score(eps, step)
            loop.queue_distillation(eps, step)
            loop.wait_idle()
            if loop.buffer:
                weights_seen.append(loop.eq7_weights(loop.buffer[: loop.xc.buffer_size]))
            st = loop.maybe_update(step)
            if st:
                updates.append(st)
        assert store.count() > 0 and len(updates) >= 2, (store.count(), len(updates))
        w = torch.cat(weights_seen)
        assert (w != 1.0).any(), "Eq. 7 weights stayed 1 on a real buffer"
        assert any(u["extractor/weight_mean"] < 1.0 for u in updates[1:])
    finally:
        pool.close()


def test_a_bad_answer_costs_only_itself_in_a_distillation_batch(loop, store):
    """Answers that once raised (an integer over Python's 4,300-digit limit, JSON nested 5,000 deep) are
    one counted no-op each; the valid answers after them in the same batch are applied."""
    from core.types import Generation, Trajectory
    from trainers.rollout import Episode, EpisodeSpec

    good = [ans([{"function": "add", "new_memory": format_entry_text(f"Tip {i}", "d", f"Lesson {i}.")}]) for i in range(3)]
    answers = {"task 0": good[0], "task 1": "<answer>[" + "9" * 5000 + "]</answer>", "task 2": good[1],
               "task 3": "<answer>" + "[" * 5000 + "]" * 5000 + "</answer>", "task 4": good[2]}
    # the answers are forced at the text level: a tiny model cannot score a 10,000-character answer
    loop.generate = lambda users, **kw: [Generation(prompt=u, response=next(a for t, a in answers.items() if t in u))
                                          for u in users]
    eps = [Episode(EpisodeSpec("e", i, False, i), Trajectory(env="e", task=f"task {i}", seed=i)) for i in range(5)]
    before = store.count()
    parsed = loop.distil([(e, 1) for e in eps])
    assert [bool(p.error) for p in parsed] == [False, True, False, True, False]
    assert "usable JSON" in parsed[1].error and "nested too deeply" in parsed[3].error
    assert loop.counters["distilled"] == 5 and loop.counters["parse_failures"] == 2 and loop.counters["adds"] == 3
    assert store.count() == before + 3


def test_the_extractor_reads_lora_weight_decay_and_lr_warmup(tmp_path, store, embedder):
    """extractor.model.{lora, weight_decay, lr_warmup} act as the actor's do: adapters only, AdamW decay,
    and a linear warm-up (lr 1e-3 over 4 updates: 2.5e-4 at the first, 5e-4 at the second)."""
    from trainers.config import load_run_config
    from trainers.extractor import ExperienceLoop
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder
    from trainers import prompts as P

    tok = build_tokenizer([P.EXTRACTOR_USER, MEM] * 20, vocab_size=400)
    save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1), tok, tmp_path / "extractor")
    cfg = load_run_config({"run": {"variant": "complementary", "threads": 1},
                           "extractor": {"model": {"path": str(tmp_path / "extractor"), "max_new_tokens": 8, "lr": 1e-3,
                                                   "lora": True, "weight_decay": 0.1, "lr_warmup": 4}}})
    mgr = ExperienceManager(store, embedder, ManagerConfig(random_demote=False), IndexConfig(use_gpu="never"))
    lp = ExperienceLoop(cfg.extractor, cfg.library, store, mgr, seed=cfg.run.seed, threads=cfg.run.threads,
                        trains=cfg.trains_extractor, deterministic=cfg.run.deterministic, data_dir=tmp_path,
                        run_id=store.create_run("t"))
    try:
        assert lp.backend.lora is not None
        names = [n for n, p in lp.backend.model.named_parameters() if p.requires_grad]
        assert names and all("lora_" in n for n in names)  # the base stays frozen
        assert all(g["weight_decay"] == 0.1 for g in lp.optimizer.param_groups)
        a, g = _entry_with_generation(lp, MEM, "task a")
        batch = [Sample(a, list(g.prompt_ids), list(g.response_ids), list(g.response_logprobs), r) for r in (1.0, -1.0)]
        assert lp.update(batch, step=1)["extractor/lr"] == pytest.approx(2.5e-4)
        assert lp.update(batch, step=2)["extractor/lr"] == pytest.approx(5e-4)
    finally:
        lp.close()
        mgr.close()


def test_the_kl_penalty_pulls_the_extractor_back_to_its_start(tmp_path, store, embedder):
    """extractor.kl_coef > 0 loads the start model as a frozen reference (the exact KL, row_logprobs_kl): the first
    update's KL is 0 (the learner is
    the start), a CISPO step moves it away, and updates whose rewards are all equal (no advantage: the penalty's
    gradient alone) bring it back (measured with the exact KL, beta 30), while the reference's weights never change."""
    from trainers.config import load_run_config
    from trainers.extractor import ExperienceLoop
    from trainers.models import build_tiny_qwen2, build_tokenizer, save_model_folder
    from trainers import prompts as P

    tok = build_tokenizer([P.EXTRACTOR_USER, MEM] * 20, vocab_size=400)
    save_model_folder(build_tiny_qwen2(tok, hidden=32, layers=1, heads=2, kv_heads=1), tok, tmp_path / "extractor")
    cfg = load_run_config({"run": {"variant": "complementary", "threads": 1},
                           "extractor": {"model": {"path": str(tmp_path / "extractor"), "max_new_tokens": 12, "lr": 3e-3},
                                         "kl_coef": 30.0}})
    mgr = ExperienceManager(store, embedder, ManagerConfig(random_demote=False), IndexConfig(use_gpu="never"))
    lp = ExperienceLoop(cfg.extractor, cfg.library, store, mgr, seed=cfg.run.seed, threads=cfg.run.threads,
                        trains=cfg.trains_extractor, deterministic=cfg.run.deterministic, data_dir=tmp_path,
                        run_id=store.create_run("t"))
    try:
        assert lp.reference is not None
        ref_w = [p.detach().clone() for p in lp.reference.model.parameters()]
        gens = lp.generate([f"distil task {i}" for i in range(12)], seed=1)
        rows = lambda rewards: [Sample(None, list(g.prompt_ids), list(g.response_ids), list(g.response_logprobs), r)  # noqa: E731
                                for g, r in zip(gens, rewards)]
        assert lp.update(rows([1.0, -1.0, 1.0, -1.0]), step=1)["extractor/kl_ref"] == 0.0
        kls = [lp.update(rows([1.0] * 4), step=2 + i)["extractor/kl_ref"] for i in range(12)]
        assert kls[0] > 0 and kls[-1] < max(kls) / 2, kls  # Adam's momentum carries it on a step or two, then back
        assert all(torch.equal(a, b) for a, b in zip(ref_w, lp.reference.model.parameters()))
    finally:
        lp.close()
        mgr.close()
    with pytest.raises(Exception, match="kl_coef"):
        load_run_config({"extractor": {"kl_coef": -0.1}})


def test_lifetime_credit_averages_every_retrieval(loop, store):
    """extractor.credit lifetime: an entry's sample is rewarded with the mean signed outcome of every episode that has
    retrieved it so far, not only this step's; "step" (the default) keeps this step's mean."""
    from core.types import Trajectory
    from trainers.rollout import Episode, EpisodeSpec

    a, _ = _entry_with_generation(loop, MEM, "task a")

    def eps(*wins):
        return [Episode(EpisodeSpec("e", i, True, 0), Trajectory("e", "task a", i, success=w, experience_ids=[a]))
                for i, w in enumerate(wins)]

    loop.score(eps(True, True, True), 1)  # lifetime so far: 3 of 3
    assert [s.reward for s in loop.buffer] == [1.0]
    loop.xc.credit = "lifetime"
    loop.score(eps(False), 2)  # this step: -1; lifetime: (3 - 1) / 4
    assert loop.buffer[-1].reward == pytest.approx(0.5)
    loop.xc.credit = "step"
    loop.score(eps(False), 3)
    assert loop.buffer[-1].reward == -1.0
    from core.config import ConfigError
    from trainers.config import load_run_config

    with pytest.raises(ConfigError, match="credit"):
        load_run_config({"extractor": {"credit": "episode"}})

"""The extractor's side: answer parsing (every malformed case), merge parsing, Eq. 7 by entry id,
CISPO updates that change the weights, search-and-ask through a real manager and rollout."""
from __future__ import annotations

import json

import pytest
import torch

from core.config import IndexConfig, ManagerConfig
from core.manager import ExperienceManager, OpContext
from core.types import Experience, Operation, format_entry_text
from trainers.extractor import Sample, parse_extraction, parse_merge, parse_rewrite

MEM = format_entry_text("Stairs", "Room-5x5", "Move diagonally towards the > first.")


def ans(ops) -> str:
    return f"<think>reasoning</think><answer>{json.dumps(ops)}</answer>"


def test_well_formed_answers_parse():
    p = parse_extraction(ans([{"function": "add", "new_memory": MEM}]), [])
    assert not p.error and p.ops == [Operation("add", text=MEM)]
    p = parse_extraction(ans([{"function": "update", "idx_list": [1, 0], "updated_memory": MEM}]), [11, 12])
    assert not p.error and p.ops[0].ids == [12, 11]
    assert parse_extraction("<think>nothing new</think><answer>[]</answer>", [5]).ops == []


@pytest.mark.parametrize("text,why", [
    ("just some text", "no <answer>"),
    ("<answer>[{'function': 'add'}]</answer>", "not JSON"),
    ("<answer>{\"function\": \"add\"}</answer>", "not a JSON list"),
    (ans([{"function": "delete", "idx_list": [0]}]), "unknown function"),
    (ans([{"function": "add", "new_memory": "  "}]), "non-empty new_memory"),
    (ans([{"function": "add"}]), "non-empty new_memory"),
    (ans([{"function": "update", "idx_list": [3], "updated_memory": MEM}]), "out of range"),
    (ans([{"function": "update", "idx_list": [], "updated_memory": MEM}]), "non-empty list"),
    (ans([{"function": "update", "idx_list": ["0"], "updated_memory": MEM}]), "list of integers"),
    (ans([{"function": "update", "idx_list": [0, 0], "updated_memory": MEM}]), "repeats"),
    (ans([{"function": "update", "idx_list": [0], "updated_memory": ""}]), "non-empty updated_memory"),
    (ans([{"function": "update", "idx_list": [0], "updated_memory": MEM},
          {"function": "update", "idx_list": [0], "updated_memory": MEM}]), "same previous memory"),
    (ans(["add"]), "not an object"),
    (ans([{"function": "add", "new_memory": MEM}] * 3), "over the budget"),
    (ans([{"function": "add", "new_memory": "x" * 5000}]), "over 4000"),
])
def test_malformed_answers_are_counted_no_ops(text, why):
    p = parse_extraction(text, [7, 8], budget=2)
    assert p.ops == [] and why in p.error


def test_merge_and_rewrite_parsing():
    chunk = [Experience(id=i, text=f"t{i}") for i in (4, 5, 6)]
    ops = parse_merge(ans([{"function": "merge", "idx_list": [0, 2], "merged_memory": "m"},
                           {"function": "discard", "idx_list": [1]}]), chunk)
    assert [(o.kind, o.ids, o.text) for o in ops] == [("update", [4, 6], "m"), ("discard", [5], "")]
    assert parse_merge(ans([{"function": "merge", "idx_list": [9], "merged_memory": "m"}]), chunk) is None
    assert parse_merge("garbage", chunk) is None
    assert parse_rewrite("<think>x</think><answer> go east </answer>") == "go east"
    assert parse_rewrite("no tags") == ""


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
    lp = ExperienceLoop(cfg, store, mgr, data_dir=tmp_path, run_id=run)
    yield lp
    lp.close()
    mgr.close()


def _entry_with_generation(loop, text, task):
    g = loop._generate([f"distil {task}"], seed=1)[0]  # a real generation of the extractor
    r = loop.manager.apply_operations([Operation("add", text=text, generation=g)], OpContext(env="e", task=task))[0]
    return r.new_id, g


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

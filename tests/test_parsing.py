"""The parsers of model answers (trainers/parsing.py): every malformed case has a reason, the release's
operation format is read, the last answer block counts, and a fuzzer finds no answer that raises."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.types import Experience, Operation, format_entry_text
from trainers.parsing import (OP_BUDGET, Parsed, parse_extraction, parse_extractor_answer, parse_merge, parse_merge_answer,
                              parse_rewrite)

MEM = format_entry_text("Stairs", "Room-5x5", "Move diagonally towards the > first.")
CHUNK = [Experience(id=i, text=f"t{i}") for i in (4, 5, 6)]


def ans(ops, think: str | None = "reasoning") -> str:
    head = f"<think>{think}</think>" if think is not None else ""
    return f"{head}<answer>{json.dumps(ops)}</answer>"


def release(fn, **params):
    return {"function_name": fn, "parameters": params} if params else {"function_name": fn}


# -- extraction answers --------------------------------------------------------------------------------


def test_well_formed_answers_parse():
    p = parse_extraction(ans([{"function": "add", "new_memory": MEM}]), [])
    assert not p.error and p.ops == [Operation("add", text=MEM)]
    p = parse_extraction(ans([{"function": "update", "idx_list": [1, 0], "updated_memory": MEM}]), [11, 12])
    assert not p.error and p.ops[0].ids == [12, 11]
    assert parse_extraction("<think>nothing new</think><answer>[]</answer>", [5]) == Parsed([], "")


def test_the_releases_operation_format():
    # indices are 1-based there ("Memory Entry 1, 2, …", applied as idx - 1)
    p = parse_extraction(ans([release("add", new_memory=MEM), release("update", idx=[2, 1], updated_memory=MEM)]), [11, 12])
    assert not p.error and [(o.kind, o.ids, o.text) for o in p.ops] == [("add", [], MEM), ("update", [12, 11], MEM)]
    # "return" ends the list, as the release stops applying there
    p = parse_extraction(ans([release("add", new_memory=MEM), release("return"), {"garbage": 1}]), [])
    assert not p.error and len(p.ops) == 1
    assert parse_extraction(ans([release("return")]), []) == Parsed([], "")
    # a lone object is a one-item list, as there
    assert len(parse_extraction(ans(release("add", new_memory=MEM)), []).ops) == 1
    # its update may name the text new_memory too
    assert parse_extraction(ans([release("update", idx=[1], new_memory=MEM)]), [7]).ops[0].ids == [7]
    for bad, why in [(release("update", idx=[0], updated_memory=MEM), "out of range"),  # 1-based: 0 is not an entry
                     (release("update", idx=[1, 1], updated_memory=MEM), "repeats"),
                     ({"function_name": "add", "parameters": "x"}, "parameters is not an object"),
                     (release("upvote", idx=[1]), "unknown function 'upvote'")]:
        p = parse_extraction(ans([bad]), [7])
        assert p.ops == [] and why in p.error, (bad, p.error)


def test_the_last_answer_block_counts():
    draft = '<think>first idea: <answer>[]</answer>, but no</think>'
    p = parse_extraction(draft + ans([{"function": "add", "new_memory": MEM}], think=None), [])
    assert p.ops == [Operation("add", text=MEM)]
    assert parse_rewrite("<think><answer>draft</answer></think><answer> go east </answer>") == "go east"
    assert parse_rewrite("no tags") == ""


@pytest.mark.parametrize("text,why", [
    ("just some text", "no <answer>"),
    ("<answer>[{'function': 'add'}]</answer>", "not JSON"),
    ('<answer>"add"</answer>', "not a JSON list"),
    (ans([{"function": "delete", "idx_list": [0]}]), "unknown function 'delete'"),
    (ans([{"function": ["add"]}]), "unknown function of type list"),
    (ans([{"function": "add", "new_memory": "  "}]), "non-empty new_memory"),
    (ans([{"function": "add"}]), "non-empty new_memory"),
    (ans([{"function": "update", "idx_list": [3], "updated_memory": MEM}]), "out of range"),
    (ans([{"function": "update", "idx_list": [], "updated_memory": MEM}]), "non-empty list"),
    (ans([{"function": "update", "idx_list": ["0"], "updated_memory": MEM}]), "integer indices"),
    (ans([{"function": "update", "idx_list": [True], "updated_memory": MEM}]), "integer indices"),
    (ans([{"function": "update", "idx_list": [0, 0], "updated_memory": MEM}]), "repeats"),
    (ans([{"function": "update", "idx_list": [0], "updated_memory": ""}]), "non-empty updated_memory"),
    (ans([{"function": "update", "idx_list": [0], "updated_memory": MEM},
          {"function": "update", "idx_list": [0], "updated_memory": MEM}]), "same previous memory"),
    (ans(["add"]), "not an object"),
    (ans([{"function": "add", "new_memory": MEM}] * 3), "over the budget of 2"),
    (ans([{"function": "add", "new_memory": "x" * 5000}]), "over 4000"),
    ("<answer>[" + "9" * 5000 + "]</answer>", "not usable JSON"),  # over Python's 4,300-digit int limit
    ("<answer>" + "[" * 5000 + "]" * 5000 + "</answer>", "nested too deeply"),
])
def test_malformed_answers_are_no_ops_with_a_reason(text, why):
    p = parse_extraction(text, [7, 8], budget=2)
    assert p.ops == [] and why in p.error


def test_the_four_cases_the_two_parsers_disagreed_on():
    """One parser now: the warm start's parse rate (parse_extractor_answer) is parse_extraction's verdict."""
    cases = [
        (ans([{"function": "add", "new_memory": MEM}], think=None), 0, 3, True),  # no <think>: parses
        (ans([{"function": "update", "idx_list": [0], "updated_memory": MEM}]), 0, 3, False),  # no previous entry 0
        (ans([{"function": "add", "new_memory": MEM}] * 3), 0, 2, False),  # 3 operations, budget 2
        (ans([{"function": "update", "idx_list": [0, 0], "updated_memory": MEM}]), 1, 3, False),  # a repeated index
    ]
    for text, n_prev, budget, ok in cases:
        p = parse_extraction(text, list(range(n_prev)), budget=budget)
        assert (not p.error) == ok, (text, p.error)
        w = parse_extractor_answer(text, n_previous=n_prev, budget=budget)
        assert (w is not None) == ok and (w == p.ops if ok else True)


def test_the_operation_budget_default_is_the_releases_3_everywhere():
    from trainers.config import ExtractorSection
    from trainers.warmstart import WarmStartConfig

    assert OP_BUDGET == 3 and ExtractorSection().op_budget == 3 and WarmStartConfig().op_budget == 3
    three = ans([{"function": "add", "new_memory": MEM}] * 3)
    assert len(parse_extraction(three, []).ops) == 3 and "over the budget of 3" in parse_extraction(ans([{"function": "add", "new_memory": MEM}] * 4), []).error


# -- merge answers -------------------------------------------------------------------------------------


def test_merge_answers():
    ops = parse_merge(ans([{"function": "merge", "idx_list": [0, 2], "merged_memory": "m"},
                           {"function": "discard", "idx_list": [1]}]), CHUNK)
    assert [(o.kind, o.ids, o.text) for o in ops] == [("update", [4, 6], "m"), ("discard", [5], "")]
    # the short form: without merged_memory the group keeps its first listed entry's text
    ops = parse_merge(ans([{"function": "merge", "idx_list": [2, 0]}]), CHUNK)
    assert [(o.kind, o.ids, o.text) for o in ops] == [("update", [6, 4], "t6")]
    assert parse_merge(ans([]), CHUNK) == []  # keep everything


@pytest.mark.parametrize("ops,why", [
    ([{"function": "merge", "idx_list": [9], "merged_memory": "m"}], "out of range"),
    ([{"function": "merge", "idx_list": [1]}], "two or more"),  # merging needs two entries
    ([{"function": "merge", "idx_list": [1, 1]}], "repeats"),  # nor an entry with itself
    ([{"function": "merge", "idx_list": [0, 1], "merged_memory": ""}], "non-empty"),
    ([{"function": "merge", "idx_list": [True, False]}], "integers"),  # JSON booleans are not indices 1, 0
    ([{"function": "discard", "idx_list": [False]}], "integers"),
    ([{"function": "keep", "idx_list": [0]}], "unknown function 'keep'"),
    ("oops", "not a JSON list"),
])
def test_malformed_merge_answers_have_a_reason(ops, why):
    p = parse_merge_answer(ans(ops), CHUNK)
    assert p.ops == [] and why in p.error
    assert parse_merge(ans(ops), CHUNK) is None


def test_merge_garbage():
    assert "no <answer>" in parse_merge_answer("garbage", CHUNK).error


# -- fuzzing: no answer raises, every refusal has a reason -------------------------------------------------

KEYS = ["function", "function_name", "parameters", "new_memory", "updated_memory", "merged_memory", "idx_list", "idx"]
NAMES = ["add", "update", "return", "merge", "discard", "delete", ""]
scalars = (st.none() | st.booleans() | st.integers(-3, 6) | st.integers() | st.floats(allow_nan=True)
           | st.sampled_from(NAMES + [MEM, " "]) | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4), max_leaves=25)
op_like = st.fixed_dictionaries({}, optional={
    "function": st.sampled_from(NAMES) | json_values, "function_name": st.sampled_from(NAMES) | json_values,
    "new_memory": st.sampled_from([MEM, "", " "]) | json_values, "updated_memory": st.sampled_from([MEM, ""]) | json_values,
    "merged_memory": st.sampled_from(["m", ""]) | json_values,
    "idx_list": st.lists(st.integers(-1, 4) | st.booleans(), max_size=4) | json_values,
    "idx": st.lists(st.integers(-1, 4) | st.booleans(), max_size=4) | json_values,
    "parameters": st.dictionaries(st.sampled_from(KEYS), st.sampled_from([MEM, ""]) | st.lists(st.integers(-1, 4), max_size=3)
                                  | json_values, max_size=3) | json_values,
})
bodies = (st.lists(op_like, max_size=5).map(json.dumps) | json_values.map(json.dumps) | op_like.map(json.dumps) | st.text(max_size=40)
          | st.sampled_from(["[" + "9" * 5000 + "]", "[" * 3000 + "]" * 3000, "{" * 2000, '[{"function": "add", "new_memory": 1e999}]',
                             "[NaN, Infinity]", '[{"idx_list": [' + "1" * 4400 + "]}]"]))


def wrap(draft: str, body: str, tail: str, think: bool) -> str:
    return (f"<think>{draft}</think>" if think else draft) + f"<answer>{body}</answer>" + tail


answers = st.builds(wrap, st.text(max_size=20) | bodies.map(lambda b: f"<answer>{b}</answer>"), bodies,
                    st.sampled_from(["", "</answer>", "<answer>", " trailing"]), st.booleans()) | st.text(max_size=60)


def _check(p: Parsed, allowed_ids: set[int], kinds: set[str]) -> None:
    assert isinstance(p, Parsed) and isinstance(p.error, str)
    if p.error:  # a refusal is a no-op with a reason
        assert p.ops == []
    else:
        assert all(isinstance(o, Operation) and o.kind in kinds and set(o.ids) <= allowed_ids for o in p.ops)
        assert all(o.text.strip() for o in p.ops if o.kind != "discard")


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(answers, st.lists(st.integers(0, 10**6), max_size=4, unique=True), st.integers(1, 4))
def test_fuzz_extraction_never_raises_and_always_has_a_reason(text, previous, budget):
    p = parse_extraction(text, previous, budget=budget)
    _check(p, set(previous), {"add", "update"})
    if not p.error:
        assert len(p.ops) <= budget
    w = parse_extractor_answer(text, n_previous=len(previous), budget=budget)  # the warm start's view of the same verdict
    assert (w is None) == bool(p.error)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(answers, st.integers(0, 5))
def test_fuzz_merge_never_raises_and_always_has_a_reason(text, n):
    chunk = [Experience(id=100 + i, text=f"entry {i}") for i in range(n)]
    p = parse_merge_answer(text, chunk)
    _check(p, {e.id for e in chunk}, {"update", "discard"})
    assert (parse_merge(text, chunk) is None) == bool(p.error)
    assert isinstance(parse_rewrite(text), str)

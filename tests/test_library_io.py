"""JSONL import/export: line-numbered errors, all or nothing, identical round trip."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.library_io import LibraryFileError, export_library, import_library
from core.store import ExperienceStore, NewEntry
from core.types import Generation, Source
# Every test that takes a database runs on SQLite and on Postgres (tests/conftest.py).
pytestmark = pytest.mark.both_backends


def test_bad_line_imports_nothing_and_names_the_line(store, tmp_path):
    f = tmp_path / "lib.jsonl"
    f.write_text("\n".join([
        json.dumps({"text": "fine", "env": "e"}),
        json.dumps({"text": "also fine", "id": 7}),
        "",
        json.dumps({"text": "bad source", "source": "alien"}),
        "{not json",
        json.dumps({"text": "dup", "id": 7}),
        json.dumps({"text": "x" * 50}),
        json.dumps({"txt": "typo"}),
    ]) + "\n")
    v = store.library_version()
    with pytest.raises(LibraryFileError) as err:
        import_library(store, f, max_chars=40)
    lines = [n for n, _ in err.value.problems]
    assert lines == [4, 5, 6, 7, 8]
    msg = str(err.value)
    assert "line 4" in msg and "nothing imported" in msg and "duplicate id 7 (first on line 2)" in msg
    assert store.count(status=None) == 0 and store.library_version() == v


def test_round_trip_is_identical(store, tmp_path, new_db_url):
    ids = store.add_entries([
        NewEntry(text="## Title: a\n## Description: d\n## Content: c", env="minihack/Room-5x5", task="t1", query="q1",
                 created_step=3, generation=Generation("prompt", "resp", [1, 2], [3, 4], [-0.1, -0.2], 5)),
        NewEntry(text="second ünïcode", env="alfworld", task="t2", source=Source.MANUAL),
    ])
    merged = store.replace_entries(ids, NewEntry(text="merged", source=Source.MERGED), actor="m", action="merge")
    store.record_retrievals([merged, merged])
    store.record_trained([ids[0]], step=2)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert export_library(store, a) == 3
    other = ExperienceStore(new_db_url())
    rep = import_library(other, a)
    assert rep.imported == 3 and rep.ids == [*ids, merged]
    export_library(other, b)
    assert a.read_bytes() == b.read_bytes()
    assert other.get(merged).parent_ids == ids and other.get(ids[0]).generation.response_logprobs == [-0.1, -0.2]
    # importing the same file again clashes on ids: refused whole; with fresh ids it works and lineage is remapped
    with pytest.raises(LibraryFileError, match="already exists"):
        import_library(other, a)
    rep2 = import_library(other, a, keep_ids=False)
    assert other.get(rep2.ids[2]).parent_ids == rep2.ids[:2]


def test_missing_and_binary_files(store, tmp_path):
    with pytest.raises(LibraryFileError, match="does not exist"):
        import_library(store, tmp_path / "nope.jsonl")
    f = tmp_path / "bin.jsonl"
    f.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(LibraryFileError, match="UTF-8"):
        import_library(store, f)


# -- input edges: each bad file is one line naming what to fix, and the store is unchanged ------------------

BAD_LINES = {
    "id beyond 64 bits": ('{"text": "t", "id": 18446744073709551617}', "'id' 18446744073709551617 is out of range"),
    "id of 2**31": ('{"text": "t", "id": 2147483648}', "out of range"),
    "parent id beyond 64 bits": ('{"text": "t", "parent_ids": [1, 99999999999999999999]}', "'parent_ids' entry"),
    "created_step beyond 64 bits": ('{"text": "t", "created_step": 9223372036854775808}', "'created_step'"),
    "counter beyond 64 bits": ('{"text": "t", "counters": {"successes": 9223372036854775808}}', "counter 'successes'"),
    "a 5,000-digit number": ('{"text": "t", "created_step": ' + "9" * 5000 + "}", "not importable JSON"),
    "nesting 100,000 deep": ('{"text": "t", "query": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    "generation prompt a number": ('{"text": "t", "generation": {"prompt": 5}}', "'prompt' must be a string"),
    "generation ids of strings": ('{"text": "t", "generation": {"prompt_ids": ["a"]}}', "list of token ids"),
    "generation logprobs nested": ('{"text": "t", "generation": {"response_logprobs": [[1]]}}', "finite numbers"),
    "generation logprobs NaN": ('{"text": "t", "generation": {"response_logprobs": [NaN]}}', "finite numbers"),
    "generation model_version huge": ('{"text": "t", "generation": {"model_version": 99999999999}}', "model_version"),
    "generation a list": ('{"text": "t", "generation": [1, 2]}', "'generation' must be an object"),
    "NUL in text": ('{"text": "a\\u0000b"}', "NUL"),
    "env over 128": ('{"text": "t", "env": "' + "e" * 129 + '"}', "'env' is 129 characters"),
}


@pytest.mark.parametrize("case", list(BAD_LINES), ids=list(BAD_LINES))
def test_bad_values_are_named_with_their_line(store, tmp_path, case):
    line, says = BAD_LINES[case]
    f = tmp_path / "lib.jsonl"
    f.write_text(json.dumps({"text": "a good first line"}) + "\n" + line + "\n")
    v = store.library_version()
    with pytest.raises(LibraryFileError) as err:
        import_library(store, f)
    msg = str(err.value)
    assert says in msg and "line 2:" in msg and "\n" not in msg and len(msg) < 400, msg
    assert store.count(status=None) == 0 and store.library_version() == v


def test_an_encoding_error_names_its_line(store, tmp_path):
    f = tmp_path / "lib.jsonl"
    f.write_bytes(b'{"text": "one"}\n{"text": "two"}\n{"text": "caf\xe9"}\n{"text": "four"}\n')
    with pytest.raises(LibraryFileError, match=r"line 3: not UTF-8 text \(invalid continuation byte at byte 14"):
        import_library(store, f)
    assert store.count(status=None) == 0
    with pytest.raises(LibraryFileError, match="is a folder"):
        import_library(store, tmp_path)


def test_line_separators_inside_texts_round_trip(store, tmp_path, new_db_url):
    """U+2028, U+0085 (and U+2029, \\r, \\x1c) are not line breaks in JSON Lines: they come back as written."""
    odd = "a\u2028b\u0085c\u2029d\re\x1cf\x0bg"
    store.add_entry(odd, env="e", task=f"task {odd}")
    a = tmp_path / "a.jsonl"
    export_library(store, a)
    assert a.read_bytes().count(b"\n") == 1 and "\u2028" not in a.read_text(encoding="utf-8")
    other = ExperienceStore(new_db_url())
    try:
        import_library(other, a)
        e = other.list_entries().entries[0]
        assert e.text == odd and e.task == f"task {odd}"
    finally:
        other.close()


# Any text the store accepts: every Unicode character but NUL and lone surrogates (not encodable as UTF-8).
TEXTS = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=60).filter(
    lambda t: t.strip())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.tuples(TEXTS, st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                                               max_size=20)), min_size=1, max_size=4))
@pytest.mark.slow
def test_export_import_round_trips_any_text(tmp_path_factory, texts):
    """Property: export -> import into an empty library -> export gives the same entries and the same bytes."""
    d = tmp_path_factory.mktemp("rt")
    src, dst = ExperienceStore(f"sqlite:///{d / 'a.db'}"), ExperienceStore(f"sqlite:///{d / 'b.db'}")
    try:
        src.add_entries([NewEntry(text=t, env="e", task=task) for t, task in texts])
        export_library(src, d / "a.jsonl")
        import_library(dst, d / "a.jsonl")
        export_library(dst, d / "b.jsonl")
        assert [(e.text, e.task) for e in dst.list_entries(limit=10).entries] == list(texts)
        assert (d / "a.jsonl").read_bytes() == (d / "b.jsonl").read_bytes()
    finally:
        src.close()
        dst.close()

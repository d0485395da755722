"""JSONL import/export: line-numbered errors, all or nothing, identical round trip."""
from __future__ import annotations

import json

import pytest

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

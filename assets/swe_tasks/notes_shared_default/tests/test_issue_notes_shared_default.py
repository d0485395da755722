from notes.model import make_note


def test_default_tags_are_fresh():
    make_note("one")
    make_note("two")
    assert make_note("three").tags == ["note"]


def test_callers_list_untouched():
    mine = ["work"]
    note = make_note("x", tags=mine)
    assert mine == ["work"]
    assert note.tags == ["work", "note"]

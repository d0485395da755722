from notes.model import make_note


def test_text_kept():
    assert make_note("hello", tags=["a"]).text == "hello"

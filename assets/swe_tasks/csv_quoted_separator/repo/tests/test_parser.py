from minicsv.parser import parse_line


def test_plain():
    assert parse_line("a,b,c\n") == ["a", "b", "c"]


def test_quoted_without_separator():
    assert parse_line('"a",b') == ["a", "b"]

from minicsv.parser import parse_line


def test_separator_inside_quotes():
    assert parse_line('1,"Smith, John",42') == ["1", "Smith, John", "42"]


def test_doubled_quote():
    assert parse_line('x,"say ""hi"""') == ["x", 'say "hi"']


def test_empty_fields_kept():
    assert parse_line("a,,c") == ["a", "", "c"]

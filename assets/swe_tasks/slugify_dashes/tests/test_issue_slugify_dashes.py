from blogkit.slug import slugify


def test_collapses_runs():
    assert slugify("Hello,  World!") == "hello-world"


def test_no_edge_dashes():
    assert slugify("  -- Python 3.12 --  ") == "python-3-12"


def test_truncation_does_not_end_with_dash():
    assert slugify("abc def", max_len=4) == "abc"

from semverlite.compare import compare, parse_version


def test_numeric_order():
    assert compare("1.10.0", "1.9.0") == 1
    assert compare("0.9", "0.10") == -1


def test_trailing_zeros_equal():
    assert compare("1.2", "1.2.0") == 0
    assert compare("1.2.0.1", "1.2") == 1


def test_parse_gives_numbers():
    assert parse_version("v3.04.1") == (3, 4, 1)

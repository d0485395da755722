import pytest
from timeparse.duration import parse_duration


def test_hours():
    assert parse_duration("2h") == 7200
    assert parse_duration("1h30m") == 5400
    assert parse_duration("1H0M1S") == 3601


def test_still_rejects_unknown_units():
    with pytest.raises(ValueError):
        parse_duration("3d")

import pytest
from timeparse.duration import parse_duration


def test_minutes_seconds():
    assert parse_duration("2m5s") == 125


def test_garbage():
    with pytest.raises(ValueError):
        parse_duration("soon")

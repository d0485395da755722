import pytest
from appconf.env import get_bool


@pytest.mark.parametrize("raw,expected", [("false", False), ("0", False), ("No", False), ("OFF", False),
                                          ("true", True), ("1", True), ("YES", True), ("on", True)])
def test_values(monkeypatch, raw, expected):
    monkeypatch.setenv("DEBUG", raw)
    assert get_bool("DEBUG") is expected


def test_empty_is_default(monkeypatch):
    monkeypatch.setenv("DEBUG", "")
    assert get_bool("DEBUG", True) is True


def test_garbage_names_variable(monkeypatch):
    monkeypatch.setenv("DEBUG", "maybe")
    with pytest.raises(ValueError, match="DEBUG"):
        get_bool("DEBUG")

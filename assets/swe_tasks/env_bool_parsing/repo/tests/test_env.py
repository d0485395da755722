from appconf.env import get_bool, get_int


def test_unset_default(monkeypatch):
    monkeypatch.delenv("FLAG_X", raising=False)
    assert get_bool("FLAG_X") is False
    assert get_bool("FLAG_X", True) is True


def test_int(monkeypatch):
    monkeypatch.setenv("N_X", "7")
    assert get_int("N_X") == 7

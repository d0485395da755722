import pytest
from semverlite.compare import compare


def test_simple():
    assert compare("1.2.3", "1.2.4") == -1
    assert compare("v2.0.0", "2.0.0") == 0


def test_bad():
    with pytest.raises(ValueError):
        compare("1.x", "1.0")

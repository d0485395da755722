import pytest
from pager.pages import page_count, paginate


def test_partial_last_page_counts():
    assert page_count(25, 10) == 3
    assert page_count(1, 10) == 1


def test_partial_last_page_items():
    assert paginate(list(range(25)), 3) == [20, 21, 22, 23, 24]


def test_past_the_end_still_fails():
    with pytest.raises(ValueError):
        paginate(list(range(25)), 4)

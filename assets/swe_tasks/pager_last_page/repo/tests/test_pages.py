from pager.pages import page_count, paginate


def test_exact_multiple():
    assert page_count(20, 10) == 2
    assert paginate(list(range(20)), 2) == list(range(10, 20))


def test_empty():
    assert page_count(0, 10) == 0

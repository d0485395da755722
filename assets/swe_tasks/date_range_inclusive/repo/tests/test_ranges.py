from datetime import date
from reportdates.ranges import date_range


def test_backwards_is_empty():
    assert date_range(date(2024, 1, 3), date(2024, 1, 1)) == []

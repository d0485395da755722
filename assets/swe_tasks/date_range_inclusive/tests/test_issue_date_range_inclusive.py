from datetime import date
from reportdates.ranges import date_range, week_of


def test_inclusive():
    assert date_range(date(2024, 1, 1), date(2024, 1, 3)) == [date(2024, 1, 1), date(2024, 1, 2), date(2024, 1, 3)]


def test_single_day():
    assert date_range(date(2024, 2, 29), date(2024, 2, 29)) == [date(2024, 2, 29)]


def test_week():
    week = week_of(date(2024, 5, 15))
    assert len(week) == 7 and week[0].weekday() == 0 and week[-1].weekday() == 6

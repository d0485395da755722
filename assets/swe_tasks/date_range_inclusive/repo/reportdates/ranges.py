"""Date helpers for reports."""
from datetime import date, timedelta


def date_range(start: date, end: date) -> list[date]:
    """Every day from start to end, both included; empty when end is before start."""
    days = (end - start).days
    return [start + timedelta(days=i) for i in range(days)]


def week_of(day: date) -> list[date]:
    """Monday..Sunday of the week containing day."""
    monday = day - timedelta(days=day.weekday())
    return date_range(monday, monday + timedelta(days=6))

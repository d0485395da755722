"""Descriptive statistics without numpy."""


def mean(xs: list[float]) -> float:
    if not xs:
        raise ValueError("mean of an empty list")
    return sum(xs) / len(xs)


def median(xs: list[float]) -> float:
    """The middle value; for an even count, the mean of the two middle values."""
    if not xs:
        raise ValueError("median of an empty list")
    s = sorted(xs)
    return s[len(s) // 2]

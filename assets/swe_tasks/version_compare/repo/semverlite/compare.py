"""Compare dotted version strings like "1.10.2"."""


def parse_version(text: str) -> tuple:
    """The numeric parts of a version; a leading "v" is allowed."""
    text = text.strip().lstrip("vV")
    parts = text.split(".")
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"bad version: {text!r}")
    return tuple(parts)


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as version a is older than, equal to or newer than b ("1.2" equals "1.2.0")."""
    pa, pb = parse_version(a), parse_version(b)
    return (pa > pb) - (pa < pb)

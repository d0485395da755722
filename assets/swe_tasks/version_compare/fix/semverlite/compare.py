"""Compare dotted version strings like "1.10.2"."""


def parse_version(text: str) -> tuple:
    """The numeric parts of a version; a leading "v" is allowed."""
    text = text.strip().lstrip("vV")
    parts = text.split(".")
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"bad version: {text!r}")
    return tuple(int(p) for p in parts)


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as version a is older than, equal to or newer than b ("1.2" equals "1.2.0")."""
    pa, pb = parse_version(a), parse_version(b)
    # Pad with zeros so that trailing ".0" parts do not make a version look newer.
    n = max(len(pa), len(pb))
    pa, pb = pa + (0,) * (n - len(pa)), pb + (0,) * (n - len(pb))
    return (pa > pb) - (pa < pb)

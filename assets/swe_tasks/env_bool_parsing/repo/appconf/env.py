"""Typed access to settings in environment variables."""
import os


def get_bool(name: str, default: bool = False) -> bool:
    """True for 1/true/yes/on, False for 0/false/no/off (any case); default when unset or empty.

    Anything else is a ValueError naming the variable.
    """
    raw = os.environ.get(name)
    if raw is None:
        return default
    return bool(raw)


def get_int(name: str, default: int = 0) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default

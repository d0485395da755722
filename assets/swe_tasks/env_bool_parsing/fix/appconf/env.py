"""Typed access to settings in environment variables."""
import os

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def get_bool(name: str, default: bool = False) -> bool:
    """True for 1/true/yes/on, False for 0/false/no/off (any case); default when unset or empty.

    Anything else is a ValueError naming the variable.
    """
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean (use one of {sorted(_TRUE | _FALSE)})")


def get_int(name: str, default: int = 0) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default

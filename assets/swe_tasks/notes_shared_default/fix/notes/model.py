"""Notes with tags."""
from dataclasses import dataclass


@dataclass
class Note:
    text: str
    tags: list


def make_note(text: str, tags: list | None = None) -> Note:
    """A note; every note is also tagged "note"."""
    # A fresh list per call: a shared default list would collect every earlier note's tags.
    tags = list(tags) if tags is not None else []
    tags.append("note")
    return Note(text=text, tags=tags)

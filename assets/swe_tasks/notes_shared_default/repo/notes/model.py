"""Notes with tags."""
from dataclasses import dataclass


@dataclass
class Note:
    text: str
    tags: list


def make_note(text: str, tags: list = []) -> Note:
    """A note; every note is also tagged "note"."""
    tags.append("note")
    return Note(text=text, tags=tags)

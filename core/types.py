"""Typed containers that cross layer boundaries (DESIGN.md habit 4).

Nothing here imports torch, the database or any other floor: envs/, trainers/ and app/ may all
import this module.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Source(str, Enum):
    """Where an experience entry came from."""

    EXTRACTED = "extracted"
    MERGED = "merged"
    MANUAL = "manual"
    IMPORTED = "imported"


class Status(str, Enum):
    ACTIVE = "active"
    ARCHIVED = "archived"


ENTRY_TEXT_SECTIONS = ("## Title:", "## Description:", "## Content:")


def format_entry_text(title: str, description: str, content: str) -> str:
    """The entry layout of docs/method.md: `## Title: … / ## Description: … / ## Content: …`."""
    return f"## Title: {title.strip()}\n## Description: {description.strip()}\n## Content: {content.strip()}"


def entry_title(text: str) -> str:
    """First title line of an entry, or its first line when it has no `## Title:` header."""
    for line in text.splitlines():
        if line.startswith("## Title:"):
            return line[len("## Title:"):].strip()
    return text.strip().splitlines()[0][:120] if text.strip() else ""


def entry_content(text: str) -> str:
    """What an entry says to do: the text after `## Content:` (to the end, on one line), or the whole text, on one
    line, when it has no such header."""
    head = ENTRY_TEXT_SECTIONS[2]
    at = text.find(head)
    body = text[at + len(head):] if at >= 0 else text
    return " ".join(body.split())


@dataclass
class Generation:
    """One extractor generation (prompt -> response) kept so the extractor can be trained on it."""

    prompt: str
    response: str
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    model_version: int = 0


@dataclass
class Experience:
    """An experience entry as the domain sees it (the store row without database plumbing)."""

    id: int | None
    text: str
    env: str = ""
    task: str = ""
    query: str = ""  # the text whose embedding keys the entry (default: the source episode's task)
    source: Source = Source.EXTRACTED
    status: Status = Status.ACTIVE
    version: int = 1
    parent_ids: list[int] = field(default_factory=list)
    created_step: int = 0
    run_id: int | None = None
    source_episode_id: int | None = None
    retrieved_count: int = 0
    trained_count: int = 0
    last_retrieved_at: float | None = None
    last_trained_step: int | None = None
    successes: int = 0
    failures: int = 0
    generation: Generation | None = None
    created_at: float | None = None
    updated_at: float | None = None


@dataclass
class Hit:
    """One retrieval result."""

    entry_id: int
    text: str
    score: float  # cosine similarity of query and key (after diversification re-ranking: the raw score)
    rank_score: float = 0.0  # the score the ranking used: Eq. 6's s(m) with diversification on, else s_rank (−rank or the cosine)
    task: str = ""
    env: str = ""


@dataclass
class Operation:
    """A parsed extractor/merge operation on the library.

    kind: "add" (text) or "update" (ids -> one new entry with `text`) or "discard" (ids archived).
    """

    kind: str
    text: str = ""
    ids: list[int] = field(default_factory=list)
    generation: Generation | None = None  # the extractor generation that produced it, if any (merge answers)


@dataclass
class OpResult:
    """What applying one Operation did: new entry id, archived ids, or why it was refused."""

    op: Operation
    ok: bool
    new_id: int | None = None
    archived: list[int] = field(default_factory=list)
    error: str = ""


@dataclass
class Step:
    """One turn of an episode, as recorded for replay and training."""

    observation: str
    action: str
    reward: float = 0.0
    kind: str = "action"  # "action" | "tool" (search-and-ask) | "invalid"
    tool_query: str = ""
    tool_answer: str = ""
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """A finished episode: what the actor saw and did, and how it ended."""

    env: str
    task: str
    seed: int
    steps: list[Step] = field(default_factory=list)
    success: bool = False
    reward: float = 0.0
    with_experience: bool = False
    experience_ids: list[int] = field(default_factory=list)
    experience_text: str = ""
    group_id: int = 0
    truncated: bool = False
    final_observation: str = ""  # what the env said after the last action (the outcome; MiniHack's debrief)

    @property
    def num_actions(self) -> int:
        return sum(1 for s in self.steps if s.kind != "tool")

"""The agent's working copy and the file commands on it (ls, cat, grep, replace, edit, write): paths stay inside
the copy and symlinks are never followed."""
from __future__ import annotations

import os
import re
from pathlib import Path

MAX_OUTPUT_CHARS = 4000  # an observation longer than this is cut, keeping both ends
HIDDEN_NAMES = {"__pycache__", ".pytest_cache", ".git"}


def _clip(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters cut] ...\n{text[-half:]}"


# ---------------------------------------------------------------------------------------------
# Tool commands over a working copy
# ---------------------------------------------------------------------------------------------

class CommandError(ValueError):
    """A command the env cannot carry out; its message is the agent's feedback."""


class Workspace:
    """A working copy and the file/grep/edit commands on it. Paths are relative and cannot escape it."""

    def __init__(self, root: Path):
        self.root = root.resolve()

    def path(self, rel: str) -> Path:
        if not rel:
            raise CommandError("a path is needed")
        p = (self.root / rel).resolve()
        if p != self.root and not p.is_relative_to(self.root):
            raise CommandError(f"{rel!r} is outside the repository")
        return p

    def rel(self, p: Path) -> str:
        return p.relative_to(self.root).as_posix()

    def files(self, under: Path | None = None) -> list[Path]:
        """Regular files under `under`; symlinks are skipped (a planted link to /etc/passwd is not a file of
        the repository), and so are links to folders (os.walk does not descend into them)."""
        base = under or self.root
        out = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in HIDDEN_NAMES)
            out += [Path(dirpath) / f for f in sorted(filenames)
                    if not f.endswith(".pyc") and not (Path(dirpath) / f).is_symlink()]
        return out

    def ls(self, rel: str = ".") -> str:
        p = self.path(rel or ".")
        if p.is_file():
            return self.rel(p)
        if not p.is_dir():
            raise CommandError(f"no such file or directory: {rel}")
        return "\n".join(self.rel(f) for f in self.files(p)) or "(empty)"

    def read_lines(self, rel: str) -> list[str]:
        p = self.path(rel)
        if not p.is_file():
            raise CommandError(f"no such file: {rel}")
        try:
            return p.read_text(encoding="utf-8").splitlines(keepends=True)
        except UnicodeDecodeError as e:
            raise CommandError(f"{rel} is not a UTF-8 text file") from e

    def cat(self, rel: str, start: int | None = None, end: int | None = None) -> str:
        lines = self.read_lines(rel)
        lo = max(1, start or 1)
        hi = min(len(lines), end or len(lines))
        if not lines:
            return f"{rel} is empty"
        if lo > hi:
            raise CommandError(f"{rel} has {len(lines)} lines; {start}..{end} is empty")
        return "\n".join(f"{i:4d}| {lines[i - 1].rstrip(chr(10))}" for i in range(lo, hi + 1))

    def grep(self, pattern: str, rel: str = ".") -> str:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise CommandError(f"bad regex {pattern!r}: {e}") from e
        base = self.path(rel or ".")
        hits = []
        for f in ([base] if base.is_file() else self.files(base)):
            try:
                text = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for n, line in enumerate(text.splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{self.rel(f)}:{n}: {line}")
        if not hits:
            return f"no match for {pattern!r}"
        more = f"\n... {len(hits) - 50} more matches" if len(hits) > 50 else ""
        return "\n".join(hits[:50]) + more

    def write(self, rel: str, text: str) -> str:
        p = self.path(rel)
        if p.is_dir():
            raise CommandError(f"{rel} is a directory")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        return f"wrote {rel} ({len(text.splitlines())} lines)"

    def replace_lines(self, rel: str, start: int, end: int, new_text: str) -> str:
        lines = self.read_lines(rel)
        if start < 1 or start > len(lines) + 1 or end < start - 1 or end > len(lines):
            raise CommandError(f"{rel} has {len(lines)} lines; cannot replace {start}..{end}")
        new = new_text.splitlines(keepends=True)
        if new and not new[-1].endswith("\n"):
            new[-1] += "\n"
        lines[start - 1:end] = new
        self.path(rel).write_text("".join(lines), encoding="utf-8")
        shown_end = max(start, start + len(new) - 1)
        return f"replaced lines {start}..{end} of {rel}; now:\n" + self._around(rel, start, shown_end)

    def str_replace(self, rel: str, old: str, new: str) -> str:
        text = "".join(self.read_lines(rel))
        count = text.count(old) if old else 0
        if count != 1:
            raise CommandError(f"the old text occurs {count} times in {rel}; it must occur exactly once")
        at = text[:text.index(old)].count("\n") + 1
        self.path(rel).write_text(text.replace(old, new, 1), encoding="utf-8")
        return f"edited {rel}; now:\n" + self._around(rel, at, at + max(0, new.count("\n")))

    def _around(self, rel: str, lo: int, hi: int) -> str:
        n = len(self.read_lines(rel))
        if n == 0:
            return f"{rel} is empty"
        return self.cat(rel, max(1, min(lo, n) - 2), min(n, hi + 2))


def _parse_edit_body(body: str) -> tuple[str, str]:
    """`<<<` old `===` new `>>>` -> (old, new); each part keeps its own line breaks."""
    m = re.fullmatch(r"\s*<<<\n(.*?)\n?===\n(.*?)\n?>>>\s*", body, re.DOTALL)
    if not m:
        raise CommandError("edit needs the lines `<<<`, the old text, `===`, the new text, `>>>`")
    old, new = m.group(1), m.group(2)
    # Whole lines are replaced, so both sides end in a newline unless one side is empty.
    return (old + "\n" if old else old), (new + "\n" if new else new)

"""URL slugs from titles."""
import re


def slugify(title: str, max_len: int = 50) -> str:
    """Lower-case words joined by single dashes, no leading or trailing dash, at most max_len chars."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    # Cutting may leave a dash at the end again.
    return slug[:max_len].rstrip("-")

"""Split a list into fixed-size pages for display."""


def page_count(n_items: int, per_page: int) -> int:
    """Number of pages needed to show `n_items`, `per_page` at a time (0 items -> 0 pages)."""
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    return -(-n_items // per_page)  # ceiling: a partly filled last page is still a page


def paginate(items: list, page: int, per_page: int = 10) -> list:
    """The items on 1-based `page`; a page past the end is an error."""
    if page < 1 or page > page_count(len(items), per_page):
        raise ValueError(f"page {page} out of range")
    start = (page - 1) * per_page
    return items[start:start + per_page]

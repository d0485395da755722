"""WebShop pages: the buttons, the page structure both back ends fill, and the one renderer (WebShop's text_rich
markers)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEARCH_RETURN_N = 50  # WebShop engine.py: results kept per search
PRODUCT_WINDOW = 10  # WebShop engine.py: results per page
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
END_BUTTON = "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")


# ---------------------------------------------------------------------------------------------
# Pages: one structure both back ends fill, one renderer.
# ---------------------------------------------------------------------------------------------

@dataclass
class Page:
    kind: str  # "search" | "results" | "item" | "sub" | "done"
    clickables: list[str] = field(default_factory=list)
    products: list[dict] = field(default_factory=list)  # results: {"asin", "title", "price"}
    page_num: int = 1
    total: int = 0
    asin: str = ""
    title: str = ""
    price: str = ""
    rating: str = ""
    options: dict[str, list[str]] = field(default_factory=dict)  # item: option name -> values
    selected: dict[str, str] = field(default_factory=dict)
    body: list[str] = field(default_factory=list)  # sub page text lines
    reward: float = 0.0
    reward_details: dict[str, Any] = field(default_factory=dict)

    @property
    def has_search_bar(self) -> bool:
        return self.kind == "search"


def _button(label: str, clicked: bool = False) -> str:
    # WebShop's text_rich markers, so that a prompt written for WebShop reads the same here.
    return f"[clicked button] {label} [clicked button_]" if clicked else f"[button] {label} [button_]"


def render_page(page: Page, instruction: str, visited: set[str]) -> str:
    lines = [f"Instruction: {instruction}"]
    if page.kind == "search":
        lines += ["WebShop", "[search bar] type search[<your query>]", _button("Search")]
    elif page.kind == "results":
        lines.append(_button(BACK_TO_SEARCH))
        start = (page.page_num - 1) * PRODUCT_WINDOW + 1
        lines.append(f"Page {page.page_num} ({start}-{start + len(page.products) - 1}) of {page.total} total results")
        if PREV_PAGE in page.clickables:
            lines.append(_button(PREV_PAGE))
        if NEXT_PAGE in page.clickables:
            lines.append(_button(NEXT_PAGE))
        for p in page.products:
            lines += [_button(p["asin"], p["asin"] in visited), p["title"], p["price"]]
    elif page.kind == "item":
        lines += [_button(BACK_TO_SEARCH), _button(PREV_PAGE)]
        for name, values in page.options.items():
            lines.append(name)
            lines.append("  " + "  ".join(_button(v, page.selected.get(name) == v) for v in values))
        lines += [page.title, f"Price: {page.price}"]
        if page.rating:
            lines.append(f"Rating: {page.rating}")
        lines += [_button(s) for s in SUB_PAGES if s in page.clickables]
        lines.append(_button(END_BUTTON))
    elif page.kind == "sub":
        lines += [_button(BACK_TO_SEARCH), _button(PREV_PAGE)] + page.body
    else:
        lines = ["Thank you for shopping with us!", f"Your score (min 0.0, max 1.0): {page.reward:.4g}"]
    return "\n".join(lines)

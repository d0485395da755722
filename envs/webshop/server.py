"""The WebShop server back end: a client of WebShop's Flask app over its HTTP routes, its pages parsed into Page."""
from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote

from envs.base import EnvError
from envs.webshop.pages import BACK_TO_SEARCH, END_BUTTON, NEXT_PAGE, Page, PREV_PAGE, SUB_PAGES


# ---------------------------------------------------------------------------------------------
# Server back end
# ---------------------------------------------------------------------------------------------

class _PageParser(HTMLParser):
    """Visible text nodes of a WebShop page with the tag/class they sit in, plus its radio options."""

    _HIDDEN = {"script", "style", "head", "title", "meta"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict[str, str]]] = []
        self.texts: list[tuple[str, str, str]] = []  # (text, parent tag, parent class)
        self.radios: list[tuple[str, str]] = []  # (option name, value) in page order

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "input":
            if a.get("type") == "radio":
                self.radios.append((a.get("name", ""), a.get("value", "")))
            return
        if tag in ("br", "img", "link", "meta", "hr"):
            return
        self.stack.append((tag, a))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        text = data.strip()
        if not text or any(t in self._HIDDEN for t, _ in self.stack):
            return
        tag, attrs = self.stack[-1] if self.stack else ("", {})
        self.texts.append((text, tag, attrs.get("class", "")))


class ServerShop:
    """A client of a running WebShop Flask server (the real 1.18M / 1,000-product data).

    The server keeps the goal per session; a session id `fixed_<i>` selects goal i of its shuffled
    goal list, which is how WebShop's own evaluation pins instructions. WebShop's usual split of
    that list: goals 0-499 test, 500-1499 dev, 1500+ train.
    """

    def __init__(self, server_url: str, timeout: float = 10.0, n_goals: int = 12087):
        try:
            import requests
        except ImportError as e:
            raise EnvError("the WebShop server client needs requests: `pip install requests`") from e
        self._requests = requests
        self.base = server_url.rstrip("/")
        self.timeout = timeout
        self.n_goals = n_goals
        self.session = ""
        self.instruction = ""
        self.state: dict[str, Any] = {"kind": "search"}
        self._option_types: dict[str, str] = {}
        self._get("/fixed_0")  # fail now, with a clear message, rather than at the first reset

    def _get(self, path: str) -> str:
        url = self.base + path
        try:
            resp = self._requests.get(url, timeout=self.timeout)
        except self._requests.RequestException as e:
            raise EnvError(f"cannot reach the WebShop server at {self.base} ({type(e).__name__}); start WebShop's "
                           f"Flask app (its repo's run_dev.sh, with its data downloaded) or drop server_url to use "
                           f"the offline catalogue") from e
        if resp.status_code != 200:
            raise EnvError(f"the WebShop server at {self.base} answered {resp.status_code} for {path}")
        return resp.text

    def goal_index(self, seed: int, split: str) -> int:
        if split == "eval":
            return seed % 500
        if split == "dev":
            return 500 + seed % 1000
        if split == "train":
            return 1500 + seed % max(1, self.n_goals - 1500)
        return seed % self.n_goals

    def start(self, goal_idx: int) -> Page:
        self.session = f"fixed_{goal_idx}"
        self.state = {"kind": "search"}
        html = self._get(f"/{self.session}")
        texts = [t for t, _, _ in _parse(html).texts]
        for i, t in enumerate(texts):
            if t.startswith("Instruction:"):
                rest = t[len("Instruction:"):].strip()
                self.instruction = rest or (texts[i + 1] if i + 1 < len(texts) else "")
                break
        else:
            raise EnvError(f"the page at {self.base}/{self.session} has no instruction; is it a WebShop server?")
        return Page("search")

    def search(self, query: str) -> Page:
        # "/" would split the URL path; WebShop's keywords are space-separated words anyway.
        keywords = query.lower().replace("/", " ").split()
        self.state = {"kind": "results", "keywords": keywords, "page": 1}
        return self._fetch()

    def click(self, label: str) -> Page:
        st, kind = self.state, self.state["kind"]
        if label == BACK_TO_SEARCH:
            self.state = {"kind": "search"}
            return Page("search")
        if label == NEXT_PAGE:
            st["page"] += 1
        elif label == PREV_PAGE:
            if kind == "results":
                st["page"] -= 1
            elif kind == "item":
                st["kind"], st["options"] = "results", {}
            else:
                st["kind"] = "item"
        elif kind == "results":
            st.update(kind="item", asin=label.upper(), options={})
        elif label in SUB_PAGES:
            st.update(kind="sub", subpage=label)
        elif label == END_BUTTON:
            st["kind"] = "done"
        else:
            st["options"][self._option_types.get(label, "")] = label
        return self._fetch()

    def _fetch(self) -> Page:
        st = self.state
        s = quote(self.session, safe="")
        kw = quote(str(st["keywords"]), safe="")
        opts = quote(str(st.get("options", {})), safe="")
        if st["kind"] == "results":
            html = self._get(f"/search_results/{s}/{kw}/{st['page']}")
        elif st["kind"] == "item":
            html = self._get(f"/item_page/{s}/{st['asin']}/{kw}/{st['page']}/{opts}")
        elif st["kind"] == "sub":
            html = self._get(f"/item_sub_page/{s}/{st['asin']}/{kw}/{st['page']}/{st['subpage']}/{opts}")
        else:
            html = self._get(f"/done/{s}/{st['asin']}/{opts}")
        return self._to_page(_parse(html))

    def _to_page(self, parsed: _PageParser) -> Page:
        st = self.state
        texts = parsed.texts
        buttons = [t for t, tag, _ in texts if tag == "button"]
        if st["kind"] == "results":
            products: list[dict] = []
            for text, tag, cls in texts:
                if "product-link" in cls.split():
                    products.append({"asin": text, "title": "", "price": ""})
                elif products and "product-title" in cls.split():
                    products[-1]["title"] = text
                elif products and "product-price" in cls.split():
                    products[-1]["price"] = text
            total = 0
            for t, _, _ in texts:
                m = re.search(r"of (\d+) total results", t)
                if m:
                    total = int(m.group(1))
            nav = [b for b in (BACK_TO_SEARCH, PREV_PAGE, NEXT_PAGE) if b in buttons]
            return Page("results", nav + [p["asin"] for p in products], products=products, page_num=st["page"], total=total)
        if st["kind"] == "item":
            options: dict[str, list[str]] = {}
            for name, value in parsed.radios:
                options.setdefault(name, []).append(value)
            self._option_types = {v: n for n, vs in options.items() for v in vs}
            title = next((t for t, tag, _ in texts if tag == "h2"), "")
            price = next((t[len("Price:"):].strip() for t, _, _ in texts if t.startswith("Price:")), "")
            rating = next((t[len("Rating:"):].strip() for t, _, _ in texts if t.startswith("Rating:")), "")
            subs = [b for b in SUB_PAGES if b in buttons]
            values = [v for vs in options.values() for v in vs]
            return Page("item", [BACK_TO_SEARCH, PREV_PAGE, *values, *subs, END_BUTTON], asin=st["asin"], title=title,
                        price=price, rating=rating, options=options, selected=dict(st.get("options", {})))
        if st["kind"] == "sub":
            skip = set(buttons) | {"< Back to Results"}
            body = [t for t, _, _ in texts if t not in skip and not t.startswith(("Instruction:", "Current Query:"))]
            return Page("sub", [BACK_TO_SEARCH, PREV_PAGE], asin=st["asin"], body=body)
        all_texts = [t for t, _, _ in texts]
        reward = 0.0
        for i, t in enumerate(all_texts):
            if t.startswith("Your score (min 0.0, max 1.0)") and i + 1 < len(all_texts):
                reward = float(all_texts[i + 1])
        return Page("done", asin=st["asin"], reward=reward)

    def close(self) -> None:
        pass


def _parse(html: str) -> _PageParser:
    parser = _PageParser()
    parser.feed(html)
    parser.close()
    return parser

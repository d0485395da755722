"""WebShop as a text env: `search[query]` / `click[button]` over a shop, scored by WebShop's reward.

Two back ends behind the same pages and actions:

- the offline catalogue (default): `assets/webshop/products.jsonl` and `instructions.jsonl`, written
  by `assets/webshop/build_catalogue.py`. It is a synthetic *stand-in* for WebShop's 1,000-product
  set, not WebShop's data: WebShop's scraped products and human instructions cannot be downloaded
  on an offline machine. Same page flow, same goal fields, same reward formula; BM25 (rank_bm25)
  replaces WebShop's Lucene index.
- a real WebShop server (`server_url=...`): WebShop's Flask app (`web_agent_site/app.py`, started
  with its data by the WebShop repo's `run_dev.sh`) spoken to over its HTTP routes
  (`/{session}`, `/search_results/...`, `/item_page/...`, `/item_sub_page/...`, `/done/...`), the way
  the WebShop authors' own text clients do. That data is not shipped here; a missing or unreachable
  server is an EnvError.

Reward (the WebShop paper's score, as `web_agent_site/engine/goal.py:get_reward` computes it):

    r = r_type * (|U_att ∩ Y_att| + |U_opt ∩ Y_opt| + 1[y_price <= u_price]) / (|U_att| + |U_opt| + 1)

success = (r == 1), WebShop's convention; the env's reward is r itself.
"""
from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

from envs.base import EnvError

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "webshop"

SEARCH_RETURN_N = 50  # WebShop engine.py: results kept per search
PRODUCT_WINDOW = 10  # WebShop engine.py: results per page
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
END_BUTTON = "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")
EXACT_MATCH_OPTS = ("size",)  # goal.py: sizes must match exactly, other options fuzzily

ACTION_FORMAT = (
    "Actions: search[<query>] on the search page (type your own keywords), or click[<button>] where "
    "<button> is a clickable shown in [button] ... [button_] markers: a product id on a results page, "
    "'Back to Search', 'Next >', '< Prev', an option value on a product page (e.g. a size or colour), "
    "'Description', 'Features', 'Reviews', and 'Buy Now' to purchase the product shown with the "
    "options selected. The episode ends at 'Buy Now'."
)


# ---------------------------------------------------------------------------------------------
# Text matching used by the reward (own implementations of the measures goal.py takes from
# thefuzz and spaCy, so that the env needs neither package nor a spaCy model download).
# ---------------------------------------------------------------------------------------------

def _tokens(text: str) -> list[str]:
    # thefuzz's default processor: lower-case, non-alphanumerics become spaces.
    return re.sub(r"[^0-9a-z]+", " ", text.lower()).split()


def _indel_ratio(a: str, b: str) -> float:
    """100 * (1 - indel_distance / (len a + len b)), i.e. 200 * LCS / (len a + len b): fuzz.ratio."""
    if not a and not b:
        return 100.0
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b):
            cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
        prev = cur
    return 200.0 * prev[-1] / (len(a) + len(b))


def token_set_ratio(a: str, b: str) -> float:
    """fuzz.token_set_ratio: compare the shared tokens against each side's full token set (0..100)."""
    ta, tb = set(_tokens(a)), set(_tokens(b))
    if not ta or not tb:
        return 0.0
    common = " ".join(sorted(ta & tb))
    only_a = " ".join(sorted(ta - tb))
    only_b = " ".join(sorted(tb - ta))
    if common and (not only_a or not only_b):
        return 100.0  # one side's tokens are all in the other's
    full_a = f"{common} {only_a}".strip()
    full_b = f"{common} {only_b}".strip()
    scores = [_indel_ratio(only_a, only_b)]
    if common:
        scores += [_indel_ratio(common, full_a), _indel_ratio(common, full_b)]
    return max(scores)


# goal.py normalises colours to a base colour before comparing options (normalize.py); first hit wins.
_BASE_COLORS = ("black", "white", "grey", "gray", "silver", "gold", "beige", "ivory", "brown", "tan", "red",
                "pink", "purple", "orange", "yellow", "green", "teal", "blue", "navy")


def normalize_color(value: str) -> str:
    for color in _BASE_COLORS:
        if color in value:
            return color
    return value


# WebShop keeps only the nouns of a product name (spaCy POS tags) to judge "same type of product".
# Without a tagger we keep content words: stop words, numbers and units are dropped.
_STOPWORDS = set("""a an and the of for with in on to by from at is are be this that it its as or
    your you our we i me my men's women's s x pack count oz fl ft w lb pound ounce""".split())


def _type_words(name: str) -> set[str]:
    return {t for t in _tokens(name) if t not in _STOPWORDS and not t.isdigit()}


def type_reward(purchased: dict, goal: dict) -> float:
    """goal.py get_type_reward: 1 when query, category path or name agree; 0.5/0.1/0 as they drift."""
    query_match = purchased["query"] == goal["query"]
    p_cats = {c.strip() for c in purchased["product_category"].split("›")}
    g_cats = {c.strip() for c in goal["product_category"].split("›")}
    category_match = len(p_cats & g_cats) >= 2
    desired = _type_words(goal["name"])
    title_score = len(_type_words(purchased["name"]) & desired) / len(desired) if desired else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    # Order as in goal.py: a name with almost nothing in common overrides a query or category match.
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type


def _mentioned(value: str, product: dict) -> bool:
    return (value in product["Title"].lower() or value in " ".join(product["BulletPoints"]).lower()
            or value in product["Description"].lower())


def attribute_matches(purchased: dict, goal: dict) -> int:
    """goal.py get_attribute_reward: goal attributes found (fuzzy) in the attributes, else in the text."""
    n = 0
    for g_attr in goal["attributes"]:
        if any(token_set_ratio(p_attr, g_attr) > 85 for p_attr in purchased["Attributes"]) or _mentioned(g_attr, purchased):
            n += 1
    return n


def option_matches(purchased: dict, goal_options: list[str], chosen: dict[str, str]) -> int:
    """goal.py get_option_reward: chosen options that match a goal option (size exactly, others fuzzily)."""
    goal_norm = [normalize_color(o) for o in goal_options]
    n = 0
    for key, value in chosen.items():
        value = normalize_color(value)
        if key.lower() in EXACT_MATCH_OPTS:
            matched = value in goal_norm
        else:
            matched = any(token_set_ratio(g, value) > 85 for g in goal_norm)
        if matched or _mentioned(value, purchased):
            n += 1
    return n


def webshop_reward(purchased: dict, goal: dict, price: float, options: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """WebShop's score of buying `purchased` at `price` with `options` for `goal`."""
    goal_options = list(goal["goal_options"].values()) if isinstance(goal["goal_options"], dict) else list(goal["goal_options"])
    r_type = type_reward(purchased, goal)
    n_att = attribute_matches(purchased, goal)
    n_opt = option_matches(purchased, goal_options, options)
    r_price = price <= goal["price_upper"] if goal["price_upper"] > 0 else False
    denom = len(goal["attributes"]) + len(goal_options) + 1
    reward = r_type * (n_att + n_opt + int(r_price)) / denom
    return reward, {"r_type": r_type, "attribute_matches": n_att, "option_matches": n_opt,
                    "price_ok": bool(r_price), "denominator": denom}


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


# ---------------------------------------------------------------------------------------------
# Offline back end
# ---------------------------------------------------------------------------------------------

class OfflineShop:
    """The stand-in catalogue with a BM25 search engine; plays WebShop's site logic in-process."""

    def __init__(self, data_dir: Path | str | None = None):
        data_dir = Path(data_dir) if data_dir else ASSET_DIR
        prod_path, instr_path = data_dir / "products.jsonl", data_dir / "instructions.jsonl"
        if not prod_path.exists() or not instr_path.exists():
            raise EnvError(f"the offline WebShop catalogue is missing in {data_dir}; "
                           f"run `python assets/webshop/build_catalogue.py` to write it")
        try:
            from rank_bm25 import BM25Okapi
        except ImportError as e:  # a base dependency, but say how to fix a broken venv
            raise EnvError("the offline WebShop search needs rank_bm25: `pip install rank-bm25`") from e
        self.products = [json.loads(line) for line in prod_path.read_text(encoding="utf-8").splitlines() if line.strip()]
        self.goals = [json.loads(line) for line in instr_path.read_text(encoding="utf-8").splitlines() if line.strip()]
        self.by_asin = {p["asin"]: p for p in self.products}
        docs = [_tokens(" ".join([p["Title"], p["query"], p["product_category"], " ".join(p["Attributes"]),
                                  " ".join(p["BulletPoints"]), p["Description"]])) for p in self.products]
        self._bm25 = BM25Okapi(docs)
        self.goal = self.goals[0]
        self._reset_state()

    def _reset_state(self) -> None:
        self.page_kind = "search"
        self.results: list[dict] = []
        self.page_num = 1
        self.asin = ""
        self.options: dict[str, str] = {}
        self.subpage = ""

    def goals_for(self, split: str) -> list[dict]:
        return [g for g in self.goals if split == "all" or g["split"] == split]

    def start(self, goal: dict) -> Page:
        self.goal = goal
        self._reset_state()
        return self.page()

    def search_products(self, query: str) -> list[dict]:
        scores = self._bm25.get_scores(_tokens(query))
        # Ties broken by catalogue order so that results are deterministic.
        order = sorted(range(len(self.products)), key=lambda i: (-scores[i], i))
        return [self.products[i] for i in order[:SEARCH_RETURN_N] if scores[i] > 0]

    def search(self, query: str) -> Page:
        self.results = self.search_products(query)
        self.page_kind, self.page_num, self.asin, self.options = "results", 1, "", {}
        return self.page()

    def click(self, label: str) -> Page:
        kind = self.page_kind
        if label == BACK_TO_SEARCH:
            self._reset_state()
        elif label == NEXT_PAGE:
            self.page_num += 1
        elif label == PREV_PAGE:
            if kind == "results":
                self.page_num -= 1
            elif kind == "item":
                self.page_kind, self.options = "results", {}
            else:
                self.page_kind = "item"
        elif kind == "results":
            self.page_kind, self.asin, self.options = "item", label, {}
        elif label in SUB_PAGES:
            self.page_kind, self.subpage = "sub", label
        elif label == END_BUTTON:
            self.page_kind = "done"
        else:  # an option value on the item page
            product = self.by_asin[self.asin]
            for name, values in product["options"].items():
                if label in values:
                    self.options[name] = label
        return self.page()

    def page(self) -> Page:
        kind = self.page_kind
        if kind == "search":
            return Page("search")
        if kind == "results":
            window = self.results[(self.page_num - 1) * PRODUCT_WINDOW:self.page_num * PRODUCT_WINDOW]
            clickables = [BACK_TO_SEARCH]
            if self.page_num > 1:
                clickables.append(PREV_PAGE)
            if self.page_num * PRODUCT_WINDOW < len(self.results):
                clickables.append(NEXT_PAGE)
            products = [{"asin": p["asin"], "title": p["Title"], "price": p["Price"]} for p in window]
            return Page("results", clickables + [p["asin"] for p in products], products=products,
                        page_num=self.page_num, total=len(self.results))
        product = self.by_asin[self.asin]
        if kind == "item":
            values = [v for vs in product["options"].values() for v in vs]
            return Page("item", [BACK_TO_SEARCH, PREV_PAGE, *values, "Description", "Features", END_BUTTON],
                        asin=product["asin"], title=product["Title"], price=product["Price"],
                        rating=str(product.get("Rating", "N.A.")), options=product["options"], selected=dict(self.options))
        if kind == "sub":
            body = [product["Description"]] if self.subpage == "Description" else list(product["BulletPoints"])
            return Page("sub", [BACK_TO_SEARCH, PREV_PAGE], asin=product["asin"], body=body)
        reward, details = webshop_reward(product, self.goal, product["price"], self.options)
        return Page("done", asin=product["asin"], reward=reward, reward_details=details)

    def close(self) -> None:
        pass


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


# ---------------------------------------------------------------------------------------------
# The env
# ---------------------------------------------------------------------------------------------

_ACTION_RE = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)


class WebShopEnv:
    """TextEnv over WebShop pages. reset(seed) picks instruction `seed % n` of the chosen split."""

    name = "webshop"
    action_format = ACTION_FORMAT

    def __init__(self, split: str = "train", server_url: str | None = None, max_turns: int = 15,
                 data_dir: str | Path | None = None, request_timeout: float = 10.0, server_goals: int = 12087):
        if split not in ("train", "eval", "dev", "all"):
            raise EnvError(f"webshop split must be 'train', 'eval', 'dev' or 'all', not {split!r}")
        self.split = split
        self.max_turns = int(max_turns)
        self.server_url = server_url
        self.backend: OfflineShop | ServerShop
        if server_url:
            # server_goals: how many goals the server holds (12,087 human goals in WebShop's release).
            self.backend = ServerShop(server_url, timeout=request_timeout, n_goals=server_goals)
        else:
            if split == "dev":
                raise EnvError("the offline WebShop catalogue has 'train' and 'eval' splits (and 'all'); 'dev' exists on a server only")
            self.backend = OfflineShop(data_dir)
        self.task = ""
        self.goal: dict | None = None
        self.page = Page("search")
        self.visited: set[str] = set()
        self.turns = 0
        self._rng = random.Random()

    # -- protocol ----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        options = options or {}
        if seed is None:
            seed = self._rng.randrange(2**31)
        if isinstance(self.backend, OfflineShop):
            goals = self.backend.goals_for(options.get("split", self.split))
            idx = int(options.get("goal_index", seed)) % len(goals)
            self.goal = goals[idx]
            self.page = self.backend.start(self.goal)
            self.task = self.goal["instruction_text"]
        else:
            idx = int(options["goal_index"]) if "goal_index" in options else self.backend.goal_index(seed, options.get("split", self.split))
            self.page = self.backend.start(idx)
            self.task = self.backend.instruction
            self.goal = None  # the server keeps the goal
        self.visited = set()
        self.turns = 0
        return self._obs(), self._info(invalid=False) | {"goal_index": idx}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self.task:
            raise RuntimeError("call reset() before step()")
        if self.page.kind == "done":
            raise RuntimeError("the episode has ended; call reset()")
        self.turns += 1
        verb, arg, error = self._parse(action)
        if error:
            return self._finish_turn(f"Invalid action: {error}\n\n{self._obs()}", invalid=True)
        if verb == "search":
            self.page = self.backend.search(arg)
        else:
            if self.page.kind == "results" and arg in {p["asin"] for p in self.page.products}:
                self.visited.add(arg)
            self.page = self.backend.click(arg)
        if self.page.kind == "done":
            reward = float(self.page.reward)
            info = self._info(invalid=False) | {"success": math.isclose(reward, 1.0), "reward_details": self.page.reward_details}
            return self._obs(), reward, True, False, info
        return self._finish_turn(self._obs(), invalid=False)

    def close(self) -> None:
        self.backend.close()

    # -- helpers -----------------------------------------------------------------------------
    def _finish_turn(self, obs: str, invalid: bool) -> tuple[str, float, bool, bool, dict[str, Any]]:
        info = self._info(invalid)
        truncated = self.turns >= self.max_turns
        if truncated:
            info["success"] = False
            obs += f"\n\nTurn limit ({self.max_turns}) reached without buying."
        return obs, 0.0, False, truncated, info

    def _parse(self, action: str) -> tuple[str, str, str]:
        m = _ACTION_RE.match(action or "")
        if not m:
            return "", "", f"{action.strip()[:80]!r} is not search[<query>] or click[<button>]. Valid now: {self._valid_text()}"
        verb, arg = m.group(1).lower(), m.group(2).strip()
        if verb == "search":
            if not self.page.has_search_bar:
                return "", "", f"there is no search bar on this page; click[{BACK_TO_SEARCH}] first. Valid now: {self._valid_text()}"
            if not arg:
                return "", "", "search[] needs keywords, e.g. search[red running shoes]"
            return verb, arg, ""
        label = self._match_clickable(arg)
        if label is None:
            return "", "", f"no button {arg!r} on this page. Valid now: {self._valid_text()}"
        return verb, label, ""

    def _match_clickable(self, arg: str) -> str | None:
        # WebShop lower-cases clickables and the action argument, so matching ignores case.
        low = arg.lower()
        for c in self.page.clickables:
            if c.lower() == low:
                return c
        if self.page.kind == "results":  # a product may also be clicked by its title
            for p in self.page.products:
                if p["title"].lower() == low:
                    return p["asin"]
        return None

    def admissible_actions(self) -> list[str]:
        acts = ["search[<query>]"] if self.page.has_search_bar else []
        return acts + [f"click[{c}]" for c in self.page.clickables]

    def _valid_text(self) -> str:
        return ", ".join(self.admissible_actions())

    def _info(self, invalid: bool) -> dict[str, Any]:
        return {"admissible_actions": self.admissible_actions(), "invalid_action": invalid, "page": self.page.kind}

    def _obs(self) -> str:
        return render_page(self.page, self.task, self.visited)


def make_webshop(**options: Any) -> WebShopEnv:
    """Registry factory: `make_env("webshop", split="eval")`, or `server_url="http://host:3000"` for a real WebShop."""
    return WebShopEnv(**options)


# ---------------------------------------------------------------------------------------------
# Scripted expert: reads only what the agent sees (the instruction and the page), so that its
# demonstrations can be imitated and it can relabel any state a policy reaches (DAgger).
# ---------------------------------------------------------------------------------------------

_PRICE_RE = re.compile(r",?\s*and price lower than ([0-9.]+) dollars", re.IGNORECASE)
_FILLER = set("""i need want am looking for find me buy to a an that is with and color size flavor scent the
    please some""".split())


def _instruction_parts(instruction: str) -> tuple[str, float]:
    m = _PRICE_RE.search(instruction)
    limit = float(m.group(1)) if m else math.inf
    return _PRICE_RE.sub("", instruction).lower(), limit


def _price_value(price: str) -> float:
    nums = [float(x) for x in re.findall(r"[0-9]+(?:\.[0-9]+)?", price.replace(",", ""))]
    return min(nums) if nums else math.inf


def _wanted_option(values: list[str], text: str) -> str | None:
    # The longest value named in the instruction: "1.7 fl oz" must not be read as "7 fl oz".
    hits = [v for v in values if re.search(r"(?<![\w.])" + re.escape(v.lower()) + r"(?![\w.])", text)]
    return max(hits, key=len) if hits else None


def webshop_expert(env: WebShopEnv) -> str:
    """The next action of a scripted shopper for the env's current state."""
    text, limit = _instruction_parts(env.task)
    page = env.page
    words = [w for w in _tokens(text) if w not in _FILLER]
    if page.kind == "search":
        return f"search[{' '.join(words)}]"
    if page.kind == "results":
        wanted = set(words)
        best, best_score = None, -1.0
        for p in page.products:
            if p["asin"] in env.visited or _price_value(p["price"]) > limit:
                continue
            score = len(set(_tokens(p["title"])) & wanted)
            if score > best_score:
                best, best_score = p["asin"], score
        if best is not None:
            return f"click[{best}]"
        return f"click[{NEXT_PAGE}]" if NEXT_PAGE in page.clickables else f"click[{BACK_TO_SEARCH}]"
    if page.kind == "item":
        if _price_value(page.price) > limit:
            return f"click[{PREV_PAGE}]"
        for name, values in page.options.items():
            want = _wanted_option(values, text)
            if want is None:
                return f"click[{PREV_PAGE}]"  # the option the shopper asked for is not sold here
            if page.selected.get(name) != want:
                return f"click[{want}]"
        return f"click[{END_BUTTON}]"
    return f"click[{PREV_PAGE}]"

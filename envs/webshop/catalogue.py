"""The offline WebShop back end: the stand-in catalogue under assets/webshop/ (products and instructions written
by its build_catalogue.py) with a BM25 search engine, playing WebShop's site logic in-process."""
from __future__ import annotations

import json
from pathlib import Path

from envs.base import EnvError
from envs.webshop.pages import (
    BACK_TO_SEARCH, END_BUTTON, NEXT_PAGE, Page, PREV_PAGE, PRODUCT_WINDOW, SEARCH_RETURN_N, SUB_PAGES,
)
from envs.webshop.reward import _tokens, webshop_reward

ASSET_DIR = Path(__file__).resolve().parent.parent.parent / "assets" / "webshop"


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

"""The scripted WebShop shopper (webshop_expert)."""
from __future__ import annotations

import math
import re

from envs.webshop.env import WebShopEnv
from envs.webshop.pages import BACK_TO_SEARCH, END_BUTTON, NEXT_PAGE, PREV_PAGE
from envs.webshop.reward import _tokens

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

"""WebShop's reward and the text matching it uses.

Reward (the WebShop paper's score, as `web_agent_site/engine/goal.py:get_reward` computes it):

    r = r_type * (|U_att ∩ Y_att| + |U_opt ∩ Y_opt| + 1[y_price <= u_price]) / (|U_att| + |U_opt| + 1)

success = (r == 1), WebShop's convention; the env's reward is r itself.
"""
from __future__ import annotations

import re
from typing import Any

EXACT_MATCH_OPTS = ("size",)  # goal.py: sizes must match exactly, other options fuzzily


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

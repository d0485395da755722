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

Split by job: `reward` (WebShop's score and the text matching it uses), `pages` (the page structure both back ends
fill, its buttons and renderer), `catalogue` (the offline back end: the stand-in catalogue with BM25 search),
`server` (the client of a real WebShop server), `env` (WebShopEnv, make_webshop), `expert` (webshop_expert); this
module re-exports their public names, so `envs.webshop.X` keeps working.
"""
from __future__ import annotations

from envs.webshop.reward import (
    attribute_matches, EXACT_MATCH_OPTS, normalize_color, option_matches, token_set_ratio, type_reward,
    webshop_reward,
)
from envs.webshop.pages import (
    BACK_TO_SEARCH, END_BUTTON, NEXT_PAGE, Page, PREV_PAGE, PRODUCT_WINDOW, render_page, SEARCH_RETURN_N, SUB_PAGES,
)
from envs.webshop.catalogue import ASSET_DIR, OfflineShop
from envs.webshop.server import ServerShop
from envs.webshop.env import ACTION_FORMAT, make_webshop, WebShopEnv
from envs.webshop.expert import webshop_expert

__all__ = [
    "ACTION_FORMAT", "ASSET_DIR", "attribute_matches", "BACK_TO_SEARCH", "END_BUTTON", "EXACT_MATCH_OPTS",
    "make_webshop", "NEXT_PAGE", "normalize_color", "OfflineShop", "option_matches", "Page", "PREV_PAGE",
    "PRODUCT_WINDOW", "render_page", "SEARCH_RETURN_N", "ServerShop", "SUB_PAGES", "token_set_ratio", "type_reward",
    "webshop_expert", "webshop_reward", "WebShopEnv",
]

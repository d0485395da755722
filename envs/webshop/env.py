"""WebShopEnv: the TextEnv over WebShop pages (`search[...]` / `click[...]`) on either back end; `make_webshop`,
the registry factory."""
from __future__ import annotations

import math
import random
import re
from pathlib import Path
from typing import Any

from envs.base import EnvError
from envs.webshop.catalogue import OfflineShop
from envs.webshop.pages import BACK_TO_SEARCH, Page, render_page
from envs.webshop.server import ServerShop

ACTION_FORMAT = (
    "Actions: search[<query>] on the search page (type your own keywords), or click[<button>] where "
    "<button> is a clickable shown in [button] ... [button_] markers: a product id on a results page, "
    "'Back to Search', 'Next >', '< Prev', an option value on a product page (e.g. a size or colour), "
    "'Description', 'Features', 'Reviews', and 'Buy Now' to purchase the product shown with the "
    "options selected. The episode ends at 'Buy Now'."
)



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

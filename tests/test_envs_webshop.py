"""WebShop env: the protocol, WebShop's reward on hand-computed cases, the pages, the expert, the server client."""
from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from envs.base import EnvError, check_env
from envs.registry import make_env
from envs.webshop import (
    ASSET_DIR,
    WebShopEnv,
    make_webshop,
    token_set_ratio,
    type_reward,
    webshop_expert,
    webshop_reward,
)


@pytest.fixture(scope="module")
def env() -> WebShopEnv:
    return make_webshop(split="eval")


def _product(**kw) -> dict:
    base = {
        "asin": "B000000001", "query": "eau de toilette",
        "product_category": "Beauty & Personal Care › Fragrance › Women's › Eau de Toilette",
        "name": "Belle Rose Eau De Toilette Spray, Long Lasting, Alcohol Free",
        "Title": "Belle Rose Eau De Toilette Spray, Long Lasting, Alcohol Free",
        "Attributes": ["long lasting", "alcohol free"], "BulletPoints": ["Proudly long lasting."],
        "Description": "A spray.", "options": {"size": ["1.7 fl oz", "3.4 fl oz"]},
    }
    base.update(kw)
    return base


GOAL = {
    "query": "eau de toilette",
    "product_category": "Beauty & Personal Care › Fragrance › Women's › Eau de Toilette",
    "name": "Belle Rose Eau De Toilette Spray, Long Lasting, Alcohol Free",
    "attributes": ["long lasting", "alcohol free"],
    "goal_options": {"size": "3.4 fl oz"},
    "price_upper": 50.0,
}


# -- reward ----------------------------------------------------------------------------------

def test_reward_all_match_is_one():
    r, d = webshop_reward(_product(), GOAL, price=40.0, options={"size": "3.4 fl oz"})
    assert r == 1.0 and d["denominator"] == 4


def test_reward_wrong_size_and_too_expensive():
    # (2 attributes + 0 options + 0 price) / (2 + 1 + 1)
    r, _ = webshop_reward(_product(), GOAL, price=60.0, options={"size": "1.7 fl oz"})
    assert r == pytest.approx(2 / 4)


def test_reward_missing_attribute_and_no_option_chosen():
    p = _product(Attributes=["long lasting"], Title="Belle Rose Eau De Toilette Spray, Long Lasting",
                 name="Belle Rose Eau De Toilette Spray, Long Lasting")
    # (1 + 0 + 1) / 4: "alcohol free" is nowhere in the product, no size was clicked
    r, d = webshop_reward(p, GOAL, price=10.0, options={})
    assert (d["attribute_matches"], d["option_matches"], d["price_ok"]) == (1, 0, True)
    assert r == pytest.approx(2 / 4)


def test_reward_attribute_found_in_features_text():
    # goal.py falls back to the title, bullet points and description when the attribute list misses it.
    p = _product(Attributes=["long lasting"], BulletPoints=["Alcohol free formula."])
    r, d = webshop_reward(p, GOAL, price=10.0, options={"size": "3.4 fl oz"})
    assert d["attribute_matches"] == 2 and r == 1.0


def test_reward_colour_normalised():
    goal = dict(GOAL, attributes=["long lasting"], goal_options={"color": "blue"})
    r, d = webshop_reward(_product(), goal, price=10.0, options={"color": "navy blue"})
    assert d["option_matches"] == 1 and r == 1.0


def test_type_reward_levels():
    other = {"query": "hdmi cable", "product_category": "Electronics › Cables"}
    # no query, no shared category level, no shared type word -> 0
    assert type_reward(dict(other, name="Linkpro Hdmi Cable, Braided"), GOAL) == 0.0
    # one of the goal's 10 type words shared (title score 0.1: not below 0.1, not above 0.2) -> 0.5
    assert type_reward(dict(other, name="Linkpro Spray Cable"), GOAL) == 0.5
    # same query -> 1.0 even with a different name, as long as some type word is shared
    assert type_reward(dict(_product(), name="Nuit Claire Eau De Toilette Spray"), GOAL) == 1.0
    # and the whole reward is scaled by it
    p = _product(query="hdmi cable", product_category="Electronics › Cables", name="Linkpro Spray Cable")
    r, _ = webshop_reward(p, GOAL, price=10.0, options={"size": "3.4 fl oz"})
    assert r == pytest.approx(0.5 * 1.0)


def test_token_set_ratio_hand_values():
    assert token_set_ratio("long lasting", "Lasting, long") == 100.0
    # common "fast"; rests "charging" vs "charge": LCS 5 -> 200*5/14
    assert token_set_ratio("fast charging", "fast charge") == pytest.approx(200 * 5 / 14)
    assert token_set_ratio("", "x") == 0.0


# -- env protocol and pages -----------------------------------------------------------------

@pytest.mark.parametrize("split", ["train", "eval"])
def test_check_env(split):
    e = make_env("webshop", split=split)
    check_env(e, seed=3)
    check_env(e, seed=3, actions=["search[shampoo]", "click[Back to Search]"])


def test_reset_is_deterministic_and_splits_differ():
    a, b = make_webshop(split="train"), make_webshop(split="eval")
    assert a.reset(seed=7)[0] == a.reset(seed=7)[0]
    assert a.reset(seed=7)[0] != a.reset(seed=8)[0]
    train = {g["instruction_text"] for g in a.backend.goals_for("train")}
    evals = {g["instruction_text"] for g in b.backend.goals_for("eval")}
    assert len(evals) > 50 and len(train) > 3 * len(evals) and not (train & evals)


def test_pages_and_navigation(env):
    obs, info = env.reset(seed=0)
    assert obs.startswith("Instruction: ") and info["admissible_actions"] == ["search[<query>]"]
    obs, r, term, trunc, info = env.step("search[wireless earbuds]")
    assert info["page"] == "results" and "[button] Next > [button_]" in obs and "click[Next >]" in info["admissible_actions"]
    first = env.page.products[0]
    obs, *_ , info = env.step("click[Next >]")
    assert "Page 2 (11-20)" in obs and "click[< Prev]" in info["admissible_actions"]
    env.step("click[< Prev]")
    # clickables match case-insensitively, and a product may be clicked by its title
    obs, *_, info = env.step(f"CLICK[{first['title'].upper()}]")
    assert info["page"] == "item" and first["title"] in obs and "[button] Buy Now [button_]" in obs
    value = next(iter(env.page.options.values()))[0]
    obs, *_ = env.step(f"click[{value}]")
    assert f"[clicked button] {value} [clicked button_]" in obs
    obs, *_, info = env.step("click[Features]")
    assert info["page"] == "sub"
    env.step("click[< Prev]")
    assert env.page.kind == "item" and env.page.selected  # options survive a sub-page visit
    env.step("click[< Prev]")
    obs, *_ = env.step("click[Back to Search]")
    assert env.page.kind == "search"


def test_invalid_actions_are_feedback(env):
    env.reset(seed=1)
    obs, r, term, trunc, info = env.step("click[Buy Now]")
    assert info["invalid_action"] and "no button" in obs and not term
    env.step("search[shampoo]")
    obs, *_, info = env.step("search[again]")
    assert info["invalid_action"] and "Back to Search" in obs
    obs, *_, info = env.step("buy it")
    assert info["invalid_action"] and "is not search[<query>] or click[<button>]" in obs
    assert "click[Back to Search]" in obs  # the feedback lists what is valid on this page


def test_turn_limit(env):
    env.reset(seed=2)
    for i in range(env.max_turns):
        obs, r, term, trunc, info = env.step("search[tea]" if i % 2 == 0 else "click[Back to Search]")
    assert env.max_turns == 15 and trunc and not term and info["success"] is False


def test_buy_ends_with_reward(env):
    env.reset(seed=4)
    env.step("search[wireless earbuds]")
    env.step(f"click[{env.page.products[0]['asin']}]")
    obs, r, term, trunc, info = env.step("click[Buy Now]")
    assert term and "Your score" in obs and 0.0 <= r < 1.0  # no options chosen: cannot be perfect
    assert info["success"] is False and set(info["reward_details"]) >= {"r_type", "attribute_matches"}


# -- expert ----------------------------------------------------------------------------------

@pytest.mark.parametrize("split", ["eval", "train"])
def test_expert_success_rate(split):
    e = make_webshop(split=split)
    wins, turns = 0, 0
    for seed in range(50):
        e.reset(seed=seed)
        while True:
            obs, r, term, trunc, info = e.step(webshop_expert(e))
            turns += 1
            assert not info["invalid_action"]
            if term or trunc:
                break
        wins += info["success"]
    assert wins / 50 >= 0.8, f"expert success {wins / 50:.2f} on {split}"


# -- catalogue ---------------------------------------------------------------------------------

def test_catalogue_rebuild_is_identical(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_catalogue", ASSET_DIR / "build_catalogue.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(tmp_path)
    for name in ("products.jsonl", "instructions.jsonl"):
        assert (tmp_path / name).read_bytes() == (ASSET_DIR / name).read_bytes(), name
    n_products = len((ASSET_DIR / "products.jsonl").read_text().splitlines())
    assert 200 <= n_products <= 1000


def test_missing_catalogue_is_env_error(tmp_path):
    with pytest.raises(EnvError, match="build_catalogue"):
        make_webshop(data_dir=tmp_path)


# -- server back end -----------------------------------------------------------------------------

def test_unreachable_server_is_env_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EnvError, match="cannot reach the WebShop server"):
        make_webshop(server_url=f"http://127.0.0.1:{port}", request_timeout=2)


_HEAD = '<html><head><title>WebShop</title><script>var x = 1;</script></head><body>'
_INSTR = '<div id="instruction-text"><h4>Instruction: <br>i need a blue mug, and price lower than 20.00 dollars</h4></div>'


class _FakeWebShop(BaseHTTPRequestHandler):
    """Serves pages with the markup of WebShop's Flask templates, to test the client's URLs and parsing."""

    seen: list[str] = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        path = unquote(self.path)
        self.seen.append(path)
        parts = path.strip("/").split("/")
        if parts[0] == "search_results":
            body = (_INSTR + '<button class="btn btn-success">Back to Search</button>'
                    '<p>Page 1 (1-10) of 2 total results</p>'
                    '<h4 class="product-asin"><a class="product-link" href="#">B0MUG00001</a></h4>'
                    '<h4 class="mt-0 product-title">Blue Ceramic Mug</h4><h5 class="product-price">$12.00</h5>'
                    '<h4 class="product-asin"><a class="product-link" href="#">B0MUG00002</a></h4>'
                    '<h4 class="mt-0 product-title">Red Mug</h4><h5 class="product-price">$9.00</h5>')
        elif parts[0] == "item_page":
            body = (_INSTR + '<button class="btn">Back to Search</button><button class="btn">&lt; Prev</button>'
                    '<h4>color</h4><input type="radio" name="color" value="blue"><label>blue</label>'
                    '<input type="radio" name="color" value="red"><label>red</label>'
                    '<h2>Blue Ceramic Mug</h2><h4>Price: $12.00</h4><h4>Rating: N.A.</h4>'
                    '<button class="btn">Description</button><button class="btn">Features</button>'
                    '<button class="btn">Reviews</button><button class="btn purchase">Buy Now</button>')
        elif parts[0] == "item_sub_page":
            body = _INSTR + '<button class="btn">Back to Search</button><button class="btn">&lt; Prev</button><p>A mug.</p>'
        elif parts[0] == "done":
            body = '<h1>Thank you for shopping with us!</h1><h3 id="reward">Your score (min 0.0, max 1.0)<pre>0.75</pre></h3>'
        else:
            body = _INSTR + '<input id="search_input" type="text"><button class="btn">Search</button>'
        data = (_HEAD + body + "</body></html>").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_server_client_speaks_webshop_routes():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeWebShop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        e = make_webshop(server_url=f"http://127.0.0.1:{server.server_port}", split="eval")
        obs, info = e.reset(seed=503)
        assert e.task == "i need a blue mug, and price lower than 20.00 dollars"
        assert _FakeWebShop.seen[-1] == "/fixed_3"  # WebShop's pinned-goal session, eval goals 0-499
        obs, *_, info = e.step("search[blue mug]")
        assert "click[B0MUG00001]" in info["admissible_actions"] and "Blue Ceramic Mug" in obs
        assert _FakeWebShop.seen[-1] == "/search_results/fixed_3/['blue', 'mug']/1"
        assert webshop_expert(e) == "click[B0MUG00001]"
        obs, *_, info = e.step("click[b0mug00001]")
        assert e.page.options == {"color": ["blue", "red"]} and "Price: $12.00" in obs
        assert webshop_expert(e) == "click[blue]"
        e.step("click[blue]")
        assert _FakeWebShop.seen[-1] == "/item_page/fixed_3/B0MUG00001/['blue', 'mug']/1/{'color': 'blue'}"
        obs, *_, info = e.step("click[Description]")
        assert info["page"] == "sub" and "A mug." in obs
        e.step("click[< Prev]")
        obs, r, term, trunc, info = e.step("click[Buy Now]")
        assert _FakeWebShop.seen[-1] == "/done/fixed_3/B0MUG00001/{'color': 'blue'}"
        assert term and r == 0.75 and info["success"] is False
    finally:
        server.shutdown()
        server.server_close()


def test_assets_are_labelled_stand_in():
    doc = (Path(ASSET_DIR) / "build_catalogue.py").read_text()
    assert "NOT WebShop's data" in doc

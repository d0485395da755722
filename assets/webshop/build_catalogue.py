"""Build the offline WebShop stand-in catalogue: products.jsonl and instructions.jsonl.

This is NOT WebShop's data. WebShop's 1,000-product set (scraped Amazon pages plus crowd-sourced
instructions) cannot be downloaded on an offline machine, so this script writes a synthetic
catalogue with the same *shape*: products with a category, a search query, a `›`-separated product
category path, a title, attributes, bullet points, a description, buying options and a price; and
instructions generated from one product each, carrying the goal fields WebShop's reward reads
(`attributes`, `goal_options`, `price_upper`, `query`, `product_category`, `name`).

Deterministic: one seeded `random.Random`, no clock, no hash randomisation. Run it once and commit
its output; rerunning rewrites identical files.

    python assets/webshop/build_catalogue.py
"""
from __future__ import annotations

import json
import random
import string
from pathlib import Path

SEED = 20220701  # WebShop's arXiv month; any fixed value works
PRODUCTS_PER_TYPE = 14
INSTRUCTIONS_PER_PRODUCT = 2
EVAL_FRACTION = 0.2
# WebShop's goal price bound: the next multiples of 10 above the price, choose an upper bound (goal.py PRICE_RANGE).
PRICE_RANGE = [10.0 * i for i in range(1, 100)]

# (category, query, product_category path, type noun, attribute pool, option pools, price range, brands)
# Option values are kept disjoint across option names and never appear in titles, so that WebShop's
# "option value found in the title" fallback cannot credit a wrong choice.
TYPES = [
    ("beauty", "eau de toilette", "Beauty & Personal Care › Fragrance › Women's › Eau de Toilette", "eau de toilette spray",
     ["long lasting", "alcohol free", "travel size", "cruelty free", "paraben free", "natural ingredients"],
     {"size": ["1 fl oz", "1.7 fl oz", "3.4 fl oz", "6.76 fl oz"]}, (18, 95),
     ["L'eau d'Issey", "Belle Rose", "Nuit Claire", "Aqua Verde", "Soleil Doux", "Jardin Blanc"]),
    ("beauty", "shampoo", "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos", "shampoo",
     ["sulfate free", "for dry hair", "color safe", "tea tree", "argan oil", "dandruff control"],
     {"size": ["8 fl oz", "12 fl oz", "16.9 fl oz", "33.8 fl oz"], "scent": ["coconut", "lavender", "unscented", "mint"]},
     (6, 40), ["Pure Roots", "Silk Strand", "Herbal Crest", "Maple Grove", "Clear Spring", "Tidewell"]),
    ("beauty", "face moisturizer", "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers", "face moisturizer",
     ["oil free", "spf 30", "hyaluronic acid", "for sensitive skin", "fragrance free", "anti aging"],
     {"size": ["1 oz", "1.7 oz", "2.5 oz"]}, (9, 70),
     ["DermaGlow", "Velvet Leaf", "Luma Skin", "Cera Pure", "Bloom Lab", "Nordic Dew"]),
    ("beauty", "lipstick", "Beauty & Personal Care › Makeup › Lips › Lipstick", "matte lipstick",
     ["long lasting", "vegan", "moisturizing", "waterproof", "cruelty free"],
     {"color": ["ruby red", "nude pink", "berry", "coral", "mauve"]}, (5, 35),
     ["Rouge Atelier", "Petal Kiss", "Velour", "Ember Beauty", "Lune Cosmetics"]),
    ("food", "green tea", "Grocery & Gourmet Food › Beverages › Tea › Green Tea", "green tea bags",
     ["organic", "caffeine free", "non gmo", "gluten free", "fair trade"],
     {"flavor name": ["jasmine", "lemon ginger", "mint", "original"], "size": ["20 count", "50 count", "100 count"]},
     (4, 30), ["Leafwise", "Jade Hill", "Mountain Mist", "Tea Garden Co", "Zen Brew", "Sunleaf"]),
    ("food", "protein bar", "Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars", "protein bars",
     ["gluten free", "low sugar", "keto friendly", "high protein", "plant based", "non gmo"],
     {"flavor name": ["chocolate chip", "peanut butter", "cookie dough", "salted caramel"], "size": ["6 pack", "12 pack", "24 pack"]},
     (8, 48), ["FuelUp", "Trail Fuel", "Barnaby", "Macro Kitchen", "Peak Snacks", "Good Grit"]),
    ("food", "coffee beans", "Grocery & Gourmet Food › Beverages › Coffee › Whole Coffee Beans", "whole bean coffee",
     ["organic", "fair trade", "dark roast", "single origin", "low acid", "medium roast"],
     {"size": ["12 ounce", "2 pound", "5 pound"]}, (9, 75),
     ["Roast Republic", "Black Ridge", "Bean Theory", "Highland Cup", "Morning Forge", "Copper Kettle"]),
    ("food", "olive oil", "Grocery & Gourmet Food › Pantry Staples › Cooking Oils › Olive Oil", "extra virgin olive oil",
     ["cold pressed", "organic", "first cold press", "non gmo", "kosher"],
     {"size": ["16.9 fl oz", "25.3 fl oz", "33.8 fl oz", "101 fl oz"]}, (7, 60),
     ["Oliveto", "Golden Press", "Casa Verde", "Terra Antica", "Sole Mio"]),
    ("fashion", "running shoes", "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running", "men's running shoes",
     ["non slip", "breathable", "lightweight", "arch support", "memory foam", "wide fit"],
     {"size": ["8", "9", "10", "11", "12"], "color": ["black", "white", "grey", "navy blue"]}, (25, 120),
     ["Stride Lab", "Fleetfoot", "Apex Run", "Cloudstep", "Velo Sport", "Trailhawk"]),
    ("fashion", "t-shirt", "Clothing, Shoes & Jewelry › Women › Clothing › Tops, Tees & Blouses › T-Shirts", "women's t-shirt",
     ["short sleeve", "cotton", "machine wash", "relaxed fit", "moisture wicking", "v neck"],
     {"size": ["small", "medium", "large", "x-large"], "color": ["heather grey", "olive green", "burgundy", "sky blue"]},
     (8, 35), ["Daily Thread", "Cotton Cove", "Urban Loom", "Softline", "Wren & Co", "Basics Lab"]),
    ("fashion", "winter jacket", "Clothing, Shoes & Jewelry › Men › Clothing › Jackets & Coats › Down Jackets", "men's puffer jacket",
     ["water resistant", "hooded", "packable", "fleece lined", "windproof", "zip pockets"],
     {"size": ["medium", "large", "x-large", "xx-large"], "color": ["black", "army green", "charcoal", "royal blue"]},
     (40, 180), ["North Ridge", "Polar Peak", "Frostline", "Summit Gear", "Alpen", "Boreal"]),
    ("fashion", "sunglasses", "Clothing, Shoes & Jewelry › Women › Accessories › Sunglasses & Eyewear › Sunglasses",
     "polarized sunglasses", ["uv protection", "polarized lens", "lightweight frame", "scratch resistant", "oversized"],
     {"color": ["tortoise", "matte black", "gold mirror", "rose pink"]}, (12, 90),
     ["Shade Co", "Solstice", "Horizon Optics", "Glare Guard", "Coastline"]),
    ("furniture", "office chair", "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs", "ergonomic office chair",
     ["lumbar support", "adjustable height", "mesh back", "easy assembly", "swivel", "padded armrests"],
     {"color": ["black", "grey", "white"]}, (60, 320),
     ["Ergo Works", "Seatwise", "Posture Pro", "Deskline", "Comfort Hub", "Studio Nine"]),
    ("furniture", "bookshelf", "Home & Kitchen › Furniture › Living Room Furniture › Bookcases", "wooden bookshelf",
     ["solid wood", "easy assembly", "5 tier", "space saving", "industrial style", "anti tip"],
     {"color": ["walnut", "oak", "espresso", "white"]}, (45, 260),
     ["Timber Nook", "Oakhaven", "Shelfcraft", "Nordwood", "Loft Living", "Cedar & Pine"]),
    ("furniture", "bedside table", "Home & Kitchen › Furniture › Bedroom Furniture › Nightstands", "bedside table nightstand",
     ["with drawer", "with charging station", "easy assembly", "mid century", "solid wood"],
     {"color": ["rustic brown", "black", "natural", "white"]}, (30, 160),
     ["Dreamwood", "Quiet Oak", "Hearth & Home", "Mornington", "Slumber Co"]),
    ("furniture", "area rug", "Home & Kitchen › Home Décor › Area Rugs, Runners & Pads › Area Rugs", "area rug",
     ["machine washable", "non slip", "low pile", "stain resistant", "boho style", "shag"],
     {"size": ["3x5 ft", "5x7 ft", "8x10 ft"], "color": ["beige", "ivory", "teal", "terracotta"]}, (25, 240),
     ["Weave House", "Loomworks", "Soft Step", "Casa Rug", "Fiberline", "Dune Home"]),
    ("electronics", "wireless earbuds", "Electronics › Headphones, Earbuds & Accessories › Earbuds › In-Ear", "wireless earbuds",
     ["noise cancelling", "bluetooth 5.3", "waterproof", "long battery life", "fast charging", "touch control"],
     {"color": ["black", "white", "midnight blue"]}, (15, 150),
     ["SoundCore X", "Auralis", "Pulse Audio", "Echo Bay", "Tunebud", "Sonic Reef"]),
    ("electronics", "phone charger", "Electronics › Cell Phones & Accessories › Chargers & Power Adapters › Wall Chargers",
     "usb c wall charger", ["fast charging", "foldable plug", "dual port", "gan technology", "compact"],
     {"size": ["20w", "35w", "65w", "100w"]}, (9, 60),
     ["VoltEdge", "ChargeRite", "Ampere", "Nimbus Power", "Current Co"]),
    ("electronics", "hdmi cable", "Electronics › Computers & Accessories › Cables & Accessories › HDMI Cables", "hdmi cable",
     ["4k", "high speed", "braided", "gold plated", "8k ultra", "ethernet"],
     {"size": ["3 ft", "6 ft", "10 ft", "15 ft"]}, (5, 35),
     ["Linkpro", "CableMax", "Signal Pure", "Wirewell", "ClearLink", "Ultra Conn"]),
    ("electronics", "portable speaker", "Electronics › Portable Audio & Video › Portable Speakers & Docks › Portable Bluetooth Speakers",
     "portable bluetooth speaker", ["waterproof", "long battery life", "deep bass", "built in microphone", "shockproof", "lightweight"],
     {"color": ["black", "red", "forest green", "ocean blue"]}, (18, 140),
     ["Boomwave", "Rivertone", "Sonic Reef", "Amp Field", "Beatbox Co", "Stormsound"]),
    ("electronics", "mechanical keyboard", "Electronics › Computers & Accessories › Computer Accessories & Peripherals › Keyboards",
     "mechanical gaming keyboard", ["rgb backlit", "hot swappable", "wireless", "compact 60 percent", "anti ghosting", "usb c"],
     {"color": ["space grey", "white", "black"], "style": ["red switch", "blue switch", "brown switch"]}, (30, 170),
     ["KeyForge", "Clackworks", "Typecraft", "Nova Keys", "Glyph", "Switchback"]),
]

FEATURE_SENTENCES = [
    "{attr_cap}: designed for everyday use.",
    "{attr_cap} - a customer favourite.",
    "Made to be {attr} without compromise.",
    "Proudly {attr}.",
]
INSTRUCTION_TEMPLATES = [
    "i need a {attrs} {noun}{opts}, and price lower than {price} dollars",
    "i am looking for a {attrs} {noun}{opts}, and price lower than {price} dollars",
    "i want to buy a {noun} that is {attrs}{opts}, and price lower than {price} dollars",
    "find me a {attrs} {noun}{opts}, and price lower than {price} dollars",
]


def _asin(rng: random.Random, used: set[str]) -> str:
    # WebShop ids look like Amazon ASINs: "B0" + 8 upper-case letters/digits.
    while True:
        asin = "B0" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))
        if asin not in used:
            used.add(asin)
            return asin


def _title(brand: str, noun: str, attrs: list[str]) -> str:
    return f"{brand} {_cap(noun)}, " + ", ".join(_cap(a) for a in attrs)


def _cap(text: str) -> str:
    # str.title() would write "Men'S"; capitalise word starts only.
    return " ".join(w[:1].upper() + w[1:] for w in text.split(" "))


def build_products(rng: random.Random) -> list[dict]:
    products: list[dict] = []
    used: set[str] = set()
    for category, query, path, noun, attr_pool, option_pools, (lo, hi), brands in TYPES:
        for i in range(PRODUCTS_PER_TYPE):
            brand = brands[i % len(brands)]
            attrs = sorted(rng.sample(attr_pool, rng.randint(2, 3)))
            options = {name: sorted(rng.sample(pool, rng.randint(2, len(pool))), key=pool.index)
                       for name, pool in option_pools.items()}
            price = round(rng.uniform(lo, hi), 2)
            title = _title(brand, noun, attrs)
            bullets = [rng.choice(FEATURE_SENTENCES).format(attr=a, attr_cap=a.capitalize()) for a in attrs]
            bullets.append(f"What you get: one {noun} from {brand}.")
            description = (f"The {brand} {noun} is {', '.join(attrs[:-1])} and {attrs[-1]}. "
                           f"Available options: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in options.items()) + ".")
            products.append({
                "asin": _asin(rng, used),
                "category": category,
                "query": query,
                "product_category": path,
                "name": title,
                "Title": title,
                "Attributes": attrs,
                "BulletPoints": bullets,
                "Description": description,
                "options": options,
                "price": price,
                "Price": f"${price:.2f}",
                "Rating": round(rng.uniform(3.0, 5.0), 1),
                "type_noun": noun,
            })
    return products


def _option_phrase(name: str, value: str) -> str:
    # "size 9", "black color", "jasmine flavor": how a shopper names each option.
    if name == "size":
        return f"size {value}"
    if name == "flavor name":
        return f"{value} flavor"
    if name == "style":
        return value
    return f"{value} {name}"


def build_instructions(rng: random.Random, products: list[dict]) -> list[dict]:
    goals: list[dict] = []
    seen: set[str] = set()
    for p in products:
        for _ in range(INSTRUCTIONS_PER_PRODUCT):
            # Redraw a repeated text (a product with few attributes and options): the same instruction
            # in both splits would leak eval into train.
            for _attempt in range(20):
                goal = _goal(rng, p)
                if goal["instruction_text"] not in seen:
                    seen.add(goal["instruction_text"])
                    goals.append(goal)
                    break
    rng.shuffle(goals)
    n_eval = int(len(goals) * EVAL_FRACTION)
    for i, g in enumerate(goals):
        g["split"] = "eval" if i < n_eval else "train"
    return goals


def _goal(rng: random.Random, p: dict) -> dict:
    attrs = sorted(rng.sample(p["Attributes"], rng.randint(1, min(2, len(p["Attributes"])))))
    goal_options = {name: rng.choice(values) for name, values in p["options"].items()}
    # WebShop goal.py: candidate bounds are the first four multiples of 10 above the price; draw two, keep the larger.
    bounds = [b for b in PRICE_RANGE if b > p["price"]][:4]
    price_upper = sorted(rng.sample(bounds, 2))[1] if len(bounds) >= 2 else 1000000.0
    opts = ""
    if goal_options:
        opts = " with " + " and ".join(_option_phrase(k, v) for k, v in goal_options.items())
    text = rng.choice(INSTRUCTION_TEMPLATES).format(
        attrs=" and ".join(attrs), noun=p["type_noun"], opts=opts, price=f"{price_upper:.2f}")
    return {
        "asin": p["asin"],
        "category": p["category"],
        "query": p["query"],
        "product_category": p["product_category"],
        "name": p["Title"],
        "instruction_text": text,
        "attributes": attrs,
        "goal_options": goal_options,
        "price_upper": price_upper,
    }


def main(out_dir: Path | None = None) -> None:
    out = out_dir or Path(__file__).resolve().parent
    rng = random.Random(SEED)
    products = build_products(rng)
    goals = build_instructions(rng, products)
    with open(out / "products.jsonl", "w", encoding="utf-8") as f:
        for p in products:
            f.write(json.dumps(p, sort_keys=True) + "\n")
    with open(out / "instructions.jsonl", "w", encoding="utf-8") as f:
        for g in goals:
            f.write(json.dumps(g, sort_keys=True) + "\n")
    print(f"wrote {len(products)} products and {len(goals)} instructions to {out}")


if __name__ == "__main__":
    main()

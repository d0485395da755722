from cachelib.lru import LRUCache


def test_get_refreshes_recency():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1
    c.put("c", 3)
    assert c.get("a") == 1
    assert c.get("b") is None


def test_missing_get_does_not_insert():
    c = LRUCache(1)
    c.get("x")
    assert len(c) == 0

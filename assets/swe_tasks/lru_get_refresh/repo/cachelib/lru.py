"""A small least-recently-used cache."""
from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._data: OrderedDict = OrderedDict()

    def get(self, key, default=None):
        """The cached value (and mark the key as recently used), or default."""
        if key not in self._data:
            return default
        return self._data[key]

    def put(self, key, value) -> None:
        """Store a value; when full, drop the least recently used key."""
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

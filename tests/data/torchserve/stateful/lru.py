"""A stand-in for the ``lru-dict`` package's ``LRU`` (https://github.com/amitdev/lru-dict), which
TorchServe's stateful example handlers import (``from lru import LRU``) and which neither our
environment nor /work/ts-venv has installed. It is packed into the test archives as an extra
file, beside the handler, so that the handler files run unchanged. Only what the handlers use:
a capacity, ``has_key``, item get and set, least recently used entries dropped first."""

from collections import OrderedDict


class LRU:
    def __init__(self, capacity):
        self._capacity = int(capacity)
        self._items = OrderedDict()

    def has_key(self, key):
        return key in self._items

    def __contains__(self, key):
        return key in self._items

    def __getitem__(self, key):
        self._items.move_to_end(key)
        return self._items[key]

    def __setitem__(self, key, value):
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def __len__(self):
        return len(self._items)

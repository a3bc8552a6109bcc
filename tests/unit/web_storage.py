"""A stand-in for the page's ``sessionStorage`` in tests (CPython and Pyodide alike)."""

from __future__ import annotations


class DictStorage:
    """Web Storage's shape over a dict (sessionStorage in the page)."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}

    def getItem(self, key: str) -> str | None:
        return self.items.get(key)

    def setItem(self, key: str, value: str) -> None:
        self.items[key] = value

    def removeItem(self, key: str) -> None:
        self.items.pop(key, None)

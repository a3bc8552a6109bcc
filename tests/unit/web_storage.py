"""A stand-in for the page's ``sessionStorage`` in tests (CPython and Pyodide alike)."""

from __future__ import annotations


class DictStorage:
    """Web Storage's shape over a dict (sessionStorage in the page)."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}
        self._keys: list[str] | None = None  # the keys in order, until the next change

    @property
    def length(self) -> int:
        return len(self.items)

    def key(self, index: int) -> str | None:
        if self._keys is None:
            self._keys = list(self.items)
        return self._keys[index] if 0 <= index < len(self._keys) else None

    def getItem(self, key: str) -> str | None:
        return self.items.get(key)

    def setItem(self, key: str, value: str) -> None:
        self.items[key] = value
        self._keys = None

    def removeItem(self, key: str) -> None:
        self.items.pop(key, None)
        self._keys = None


class RecordingStorage(DictStorage):
    """A DictStorage that lists the calls made to it (``("get" | "set" | "key", key or
    index)``) in ``calls``: what each would cost in the page, a call across to JS."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def key(self, index: int) -> str | None:
        self.calls.append(("key", str(index)))
        return super().key(index)

    def getItem(self, key: str) -> str | None:
        self.calls.append(("get", key))
        return super().getItem(key)

    def setItem(self, key: str, value: str) -> None:
        self.calls.append(("set", key))
        super().setItem(key, value)


class QuotaExceededError(Exception):
    """What ``setItem`` throws when Web Storage is full."""


class QuotaStorage(DictStorage):
    """A DictStorage holding at most ``quota`` characters of keys and values, like the
    browser's per-origin quota; a write that would go over raises and changes nothing."""

    def __init__(self, quota: int) -> None:
        super().__init__()
        self.quota = quota

    def setItem(self, key: str, value: str) -> None:
        used = sum(len(k) + len(v) for k, v in self.items.items() if k != key)
        if used + len(key) + len(value) > self.quota:
            raise QuotaExceededError(f"setting {key!r} would exceed the quota")
        super().setItem(key, value)

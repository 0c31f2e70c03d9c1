"""The collector of a spec's cross-field errors (validation.py and its rule modules)."""

from __future__ import annotations

from collections.abc import Iterable

from .dataparse import FieldError


class Checker:
    """Collects errors; `ok(...)` says whether a rule's inputs parsed cleanly."""

    def __init__(self, skip: Iterable[FieldError]):
        self.bad = {e.path for e in skip}
        self.errors: list[FieldError] = []

    def ok(self, *paths: str) -> bool:
        for path in paths:
            for bad in self.bad:
                if path == bad or path.startswith(bad + ".") or bad == "(document)":
                    return False
        return True

    def add(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))

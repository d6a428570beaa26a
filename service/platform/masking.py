"""Masking the secret values a step attempt used, wherever the attempt's text goes: its log
lines, the worker's own log, its output before the checkpoint and its error.

A value is masked as written and in the forms it takes on its way into text: percent-encoded
(httpx logs a request's URL so) and escaped inside a JSON string. An empty mask costs a
truth test, so attempts that use no secret pay nothing for it.
"""

import json
import threading
from typing import Any
from urllib.parse import quote, quote_plus

MASKED = "***"
_ADDING = threading.Lock()
"""One for every mask: values are added once per secret an attempt reveals, so a lock of each
mask's own would cost every attempt its making for nothing."""


def _forms(value: str) -> set[str]:
    return {value, quote(value, safe=""), quote_plus(value), json.dumps(value)[1:-1]}


class Mask:
    """The values one attempt revealed; values are added as the attempt reveals them, so the
    lines it logged before and after are masked alike."""

    def __init__(self) -> None:
        self.forms: tuple[str, ...] = ()
        """Longest first; empty until the attempt reveals a value, which hot paths test."""

    def __bool__(self) -> bool:
        return bool(self.forms)

    def __repr__(self) -> str:
        return f"Mask({len(self.forms)} forms)"

    def add(self, value: str) -> None:
        if not value:
            return
        with _ADDING:
            known = set(self.forms) | {form for form in _forms(value) if form}
            self.forms = tuple(sorted(known, key=len, reverse=True))

    def text(self, text: str) -> str:
        """Longest forms first, so a value that holds a shorter one is masked whole."""
        for form in self.forms:
            if form in text:
                text = text.replace(form, MASKED)
        return text

    def data(self, value: Any) -> Any:
        """JSON-like data with every string, keys included, masked; a copy where it changed."""
        if not self.forms:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.data(key): self.data(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(item) for item in value]
        return value

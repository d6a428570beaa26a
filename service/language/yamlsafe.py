"""YAML as users and their tools may send it, with bounds on what a document may cost.

``yaml.safe_load`` builds no objects but plain ones, yet a document nested a few thousand
levels deep exhausts Python's recursion (a crash, not an answer), and aliases let a small text
stand for a huge tree. The loader here refuses both while composing, before anything is built.
"""

from typing import Any

import yaml

MAX_YAML_DEPTH = 64
MAX_YAML_ALIASES = 100


class YamlLimitExceeded(yaml.YAMLError):
    """A document beyond a bound; ``kind`` is ``too_deep`` or ``too_many_aliases``."""

    def __init__(self, kind: str, message: str, mark: yaml.Mark | None) -> None:
        super().__init__(message)
        self.kind = kind
        self.problem = message
        self.problem_mark = mark


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise YamlLimitExceeded(
                    "too_many_aliases",
                    f"more than {MAX_YAML_ALIASES} aliases",
                    self._mark(),
                )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YamlLimitExceeded(
                    "too_deep",
                    f"nested deeper than {MAX_YAML_DEPTH} levels",
                    self._mark(),
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _mark(self) -> yaml.Mark | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        mark: yaml.Mark | None = getattr(event, "start_mark", None)
        return mark


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` within the bounds; ``yaml.YAMLError`` (or its subclass
    ``YamlLimitExceeded``) for text that is not YAML or is beyond them."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()

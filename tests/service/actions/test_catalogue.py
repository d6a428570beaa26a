"""The action catalogue: what a step may name, read from the registry, with each action's
inputs as JSON Schema from its signature and type hints, never the step context."""

from typing import Any

import pytest

from service.actions import ActionRegistry, StepContext, action
from service.actions.catalogue import action_catalogue, action_info
from service.actions.signature import input_rows, input_schema
from service.platform.errors import ActionNotFound


class Opaque:
    """A class of the operator's own, which JSON Schema cannot describe."""


def typed(
    ctx: StepContext, query: str, limit: int = 10, *, tags: list[str] | None = None
) -> dict[str, Any]:
    """Search for ``query``.

    At most ``limit`` hits."""
    return {}


def loose(ctx: StepContext, anything, thing: Opaque, json: bool = False, **more: Any) -> None:  # type: ignore[no-untyped-def]
    return None


def positional(ctx: StepContext, hidden: int, /, shown: int = 1) -> None:
    return None


def test_the_schema_names_each_input_its_type_default_and_whether_it_is_required() -> None:
    assert input_schema("typed", typed) == {
        "title": "typed",
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer", "default": 10},
            "tags": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "default": None,
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    }


def test_an_input_without_a_describable_hint_takes_any_value_and_kwargs_take_the_rest() -> None:
    schema = input_schema("loose", loose)

    assert schema["properties"] == {
        "anything": {},
        "thing": {},
        "json": {"type": "boolean", "default": False},
    }
    assert schema["additionalProperties"] is True


def test_a_positional_only_parameter_is_not_an_input() -> None:
    assert list(input_schema("positional", positional)["properties"]) == ["shown"]


def test_inputs_read_as_rows_with_their_type_in_short() -> None:
    rows = input_rows(input_schema("typed", typed))

    assert rows == [
        {"input": "query", "type": "string", "required": "yes", "default": ""},
        {"input": "limit", "type": "integer", "required": "", "default": "10"},
        {"input": "tags", "type": "array of string | null", "required": "", "default": "null"},
    ]
    assert input_rows(input_schema("loose", loose))[-1]["input"] == "**"


def test_the_decorator_records_whether_an_action_may_be_cached_and_retried() -> None:
    @action("tests.catalogue.send", cache=False, retry=False)
    def send(ctx: StepContext, to: str) -> None:
        """Send a message; running it twice sends two."""

    @action("tests.catalogue.pure")
    def pure(ctx: StepContext, x: int) -> int:
        """Twice ``x``."""
        return 2 * x

    registry = ActionRegistry()
    registry.register("tests.catalogue.send", send, cache=False, retry=False)
    registry.register("tests.catalogue.pure", pure)
    listed = {info.name: info for info in action_catalogue(registry)}

    assert (listed["tests.catalogue.send"].cache, listed["tests.catalogue.send"].retry) == (
        False,
        False,
    )
    assert (listed["tests.catalogue.pure"].cache, listed["tests.catalogue.pure"].retry) == (
        True,
        True,
    )
    assert listed["tests.catalogue.pure"].source == "module"
    assert listed["tests.catalogue.pure"].module == __name__


def test_the_engine_s_own_actions_are_listed_beside_the_registered_ones() -> None:
    registry = ActionRegistry()
    registry.register("typed", typed)

    names = [info.name for info in action_catalogue(registry)]

    assert names == ["pipeline.run", "typed", "wait"]
    assert action_info(registry, "wait").input_schema["properties"].keys() == {"seconds", "until"}


def test_the_summary_is_the_docstring_s_first_paragraph() -> None:
    registry = ActionRegistry()
    registry.register("typed", typed)

    info = action_info(registry, "typed")

    assert info.summary == "Search for ``query``."
    assert info.doc == "Search for ``query``.\n\nAt most ``limit`` hits."


@pytest.mark.parametrize(
    ("asked", "closest"),
    [("typd", ["typed"]), ("wiat", ["wait"]), ("nothing.like.it", [])],
)
def test_an_unknown_action_is_refused_with_the_closest_names(
    asked: str, closest: list[str]
) -> None:
    registry = ActionRegistry()
    registry.register("typed", typed)

    with pytest.raises(ActionNotFound) as refused:
        action_info(registry, asked)

    assert refused.value.details == {"action": asked, "closest": closest}
    assert ("did you mean" in refused.value.message) == bool(closest)

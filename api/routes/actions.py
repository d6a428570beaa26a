"""``GET /v1/actions``: the action catalogue, so a person or an LLM client writing a profile
finds every action this deployment runs, and how to call it, without reading the source."""

import dataclasses
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.deps import Reader, RuntimeDep
from service.actions import ActionRegistry
from service.actions.catalogue import ActionInfo, action_catalogue


class ActionPublic(BaseModel):
    name: str = Field(description="what a step's `action:` names")
    summary: str = Field(description="the docstring's first paragraph")
    doc: str = Field(description="the whole docstring")
    source: Literal["builtin", "module", "engine"] = Field(
        description="builtin: shipped with flowbeat; module: the deployment's own "
        "(FLOWBEAT_ACTION_MODULES or a flowbeat.actions entry point); engine: run by the "
        "engine itself (wait, pipeline.run)"
    )
    module: str | None = Field(description="the Python module that registers it")
    input_schema: dict[str, Any] = Field(
        description="JSON Schema of the step's `with:` inputs, read from the signature"
    )
    cache: bool = Field(
        description="its output depends only on its inputs, so a step cache may reuse it"
    )
    retry: bool = Field(
        description="a failed attempt may run again under the step's retry policy; false: "
        "every failure is permanent, whatever the policy says"
    )

    @classmethod
    def of(cls, info: ActionInfo) -> "ActionPublic":
        return cls(**dataclasses.asdict(info))


class ActionList(BaseModel):
    actions: list[ActionPublic]


router = APIRouter(tags=["actions"])


def catalogue(registry: ActionRegistry) -> ActionList:
    """The catalogue as the API, the MCP tool and the dashboard show it."""
    return ActionList(actions=[ActionPublic.of(info) for info in action_catalogue(registry)])


@router.get("/v1/actions", response_model=ActionList)
def list_actions(runtime: RuntimeDep, _: Reader) -> ActionList:
    """Every action a step may name here, by name: the built-ins, the deployment's own modules
    and the engine's `wait` and `pipeline.run`, each with its docstring and input schema. A
    profile naming an action not listed is refused at save, with the closest names."""
    return catalogue(runtime.registry)

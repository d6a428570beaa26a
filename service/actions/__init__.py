"""Action registry, step context and plugin loading; built-ins are in ``builtin``.

Actions import ``service.platform`` and ``service.language``; the catalogue, the engine and
the triggers import them, never the other way round.
"""

from service.actions.context import StepContext
from service.actions.registry import REGISTRY, ActionFn, ActionRegistry, action, load_plugins

__all__ = ["REGISTRY", "ActionFn", "ActionRegistry", "StepContext", "action", "load_plugins"]

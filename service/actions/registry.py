"""Actions: Python callables registered by name, called by the engine as ``fn(ctx, **inputs)``."""

import functools
import hashlib
import importlib
import inspect
import json
import re
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any, TypeVar

from service.language.actionnames import ActionNames
from service.platform.constants import PIPELINE_RUN_ACTION, WAIT_ACTION
from service.platform.errors import ActionError, ActionModuleUnimportable, ActionNotFound

ActionFn = Callable[..., Any]
F = TypeVar("F", bound=ActionFn)

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
ENTRY_POINT_GROUP = "flowbeat.actions"
BUILTIN_MODULE = "service.actions.builtin"

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class _Shape:
    """What an action's signature accepts, computed once at registration."""

    def __init__(self, fn: ActionFn) -> None:
        self.accepts_any = False
        self.accepted: frozenset[str] = frozenset()
        self.required: tuple[str, ...] = ()
        self.positional_only: tuple[str, ...] = ()
        self.ctx_name: str | None = None
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            self.accepts_any = True
            return
        if not params or params[0].kind not in (*_POSITIONAL, inspect.Parameter.VAR_POSITIONAL):
            raise ValueError("an action must take the step context as its first argument")
        if params[0].kind is not inspect.Parameter.VAR_POSITIONAL:
            if params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
                self.ctx_name = params[0].name
            params = params[1:]
        empty = inspect.Parameter.empty
        self.accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self.accepted = frozenset(p.name for p in params if p.kind in _KEYWORD)
        self.required = tuple(p.name for p in params if p.kind in _KEYWORD and p.default is empty)
        self.positional_only = tuple(
            p.name
            for p in params
            if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is empty
        )

    def problems(self, input_names: Collection[str]) -> list[str]:
        given = set(input_names)
        problems: list[str] = []
        if self.ctx_name is not None and self.ctx_name in given:
            problems.append(f"input {self.ctx_name!r} clashes with the context argument")
        if not self.accepts_any:
            problems.extend(
                f"unexpected input {name!r}"
                for name in sorted(given - self.accepted)
                if name != self.ctx_name
            )
        problems.extend(
            f"missing required input {name!r}" for name in self.required if name not in given
        )
        problems.extend(
            f"parameter {name!r} is positional-only and cannot be given as an input"
            for name in self.positional_only
        )
        return problems


@dataclass(frozen=True)
class Registration:
    """An action as registered: its callable and what the engine may do with its steps.

    ``cache``: its output depends only on its inputs, so the step cache may reuse an earlier
    output for the same inputs; ``False`` for an action whose point is its side effect or the
    moment it runs (a send, a fetch of what changes), or that reads what is not an input
    (``ctx.params``): a step that declares ``cache`` on it is refused at save. ``retry``: a
    failed attempt may run again under the step's ``retry`` policy; ``False`` makes every
    failure permanent, for an action that is not safe to run twice (a payment, a message),
    whatever the policy says. Either way an attempt the action itself fails with
    ``ActionError(retryable=False)``, or one called with bad inputs, is never retried.
    ``version``: part of a step cache key, so outputs of an earlier version are not reused;
    when not given, a digest of the function's source.
    """

    name: str
    fn: ActionFn
    cache: bool = True
    retry: bool = True
    version: str = ""

    def cache_version(self) -> str:
        return self.version or _source_digest(self.fn)


class ActionRegistry:
    """Name → callable. Thread-safe; registering the same function twice under a name is a no-op."""

    def __init__(self) -> None:
        self._actions: dict[str, Registration] = {}
        self._shapes: dict[str, _Shape] = {}
        self._lock = threading.Lock()
        self._loaded_plugins: set[str] = set()

    def register(
        self,
        name: str,
        fn: ActionFn,
        *,
        cache: bool = True,
        retry: bool = True,
        version: str = "",
    ) -> ActionFn:
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise ValueError(f"invalid action name {name!r}: must match {NAME_PATTERN.pattern}")
        if name == WAIT_ACTION:
            raise ValueError(f"action name {name!r} is the engine's own durable wait")
        if name == PIPELINE_RUN_ACTION:
            raise ValueError(f"action name {name!r} is the engine's own sub-pipeline call")
        if not callable(fn):
            raise ValueError(f"action {name!r} is not callable")
        shape = _Shape(fn)
        with self._lock:
            existing = self._actions.get(name)
            if existing is not None and existing.fn is not fn:
                raise ValueError(
                    f"action {name!r} is already registered by "
                    f"{_describe(existing.fn)}; refusing {_describe(fn)}"
                )
            self._actions[name] = Registration(name, fn, cache, retry, version)
            self._shapes[name] = shape
        return fn

    def get(self, name: str) -> ActionFn:
        return self.registration(name).fn

    def registration(self, name: str) -> Registration:
        try:
            return self._actions[name]
        except KeyError:
            raise ActionNotFound(f"unknown action {name!r}", {"action": name}) from None

    def registrations(self) -> list[Registration]:
        """Every action, by name."""
        return [self._actions[name] for name in sorted(self._actions)]

    def names(self) -> ActionNames:
        uncacheable = (name for name, held in self._actions.items() if not held.cache)
        return ActionNames(self._actions, uncacheable)

    def __contains__(self, name: object) -> bool:
        return name in self._actions

    def check_inputs(self, name: str, input_names: Collection[str]) -> list[str]:
        """Problems that calling ``name`` with these inputs would hit; empty when the call fits.

        Profile validation uses this so a typo in a step's inputs fails when the profile is saved,
        not hours later when the step finally runs.
        """
        self.get(name)
        return self._shapes[name].problems(input_names)

    def call(self, name: str, ctx: Any, inputs: Mapping[str, Any]) -> Any:
        """Run an action; bad inputs and non-JSON outputs are permanent, so never retried."""
        fn = self.get(name)
        problems = self._shapes[name].problems(inputs.keys())
        if problems:
            raise ActionError(
                f"action {name!r} called with bad inputs: {'; '.join(problems)}",
                {"reason": "bad_inputs", "action": name, "problems": problems},
                retryable=False,
            )
        result = fn(ctx, **dict(inputs))
        try:
            json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ActionError(
                f"action {name!r} returned output that is not JSON-serialisable: {exc}",
                {"reason": "output_not_json", "action": name, "type": type(result).__name__},
                retryable=False,
            ) from exc
        return result


@functools.cache
def _source_digest(fn: ActionFn) -> str:
    """An action's version when it names none: its source changed, its outputs may too."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = _describe(fn)
    return "src:" + hashlib.sha256(source.encode()).hexdigest()[:16]


def _describe(fn: ActionFn) -> str:
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{qualname}"


REGISTRY = ActionRegistry()


def action(
    name: str, *, cache: bool = True, retry: bool = True, version: str = ""
) -> Callable[[F], F]:
    """Register the decorated function in the default registry under ``name``; ``cache``,
    ``retry`` and ``version`` are as ``Registration`` describes them, and the action catalogue
    shows the first two."""

    def decorate(fn: F) -> F:
        REGISTRY.register(name, fn, cache=cache, retry=retry, version=version)
        return fn

    return decorate


def load_plugins(
    registry: ActionRegistry,
    modules: Sequence[str],
    *,
    entry_points: Iterable[metadata.EntryPoint] | None = None,
) -> None:
    """Import the built-ins, ``modules`` and the ``flowbeat.actions`` entry points.

    Modules register through ``@action`` into ``REGISTRY``; when ``registry`` is another one,
    what ``REGISTRY`` holds afterwards is copied into it. An entry point whose object is callable
    (and not a module) is called with ``registry``, which lets a package register explicitly.
    Safe to call again: modules are imported once and each entry point is invoked once per registry.
    ``entry_points`` replaces discovery, for tests.
    """
    for module in (BUILTIN_MODULE, *modules):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ActionModuleUnimportable(
                f"cannot import action module {module!r} (FLOWBEAT_ACTION_MODULES): {exc}",
                {"module": module},
            ) from exc
    found = (
        entry_points if entry_points is not None else metadata.entry_points(group=ENTRY_POINT_GROUP)
    )
    for ep in found:
        key = f"{ep.group}:{ep.name}={ep.value}"
        if key in registry._loaded_plugins:
            continue
        try:
            obj = ep.load()
        except ImportError as exc:
            raise ActionModuleUnimportable(
                f"cannot load action entry point {ep.name!r} ({ep.value}): {exc}"
            ) from exc
        if callable(obj) and not isinstance(obj, ModuleType):
            obj(registry)
        registry._loaded_plugins.add(key)
    if registry is not REGISTRY:
        for held in REGISTRY.registrations():
            registry.register(
                held.name, held.fn, cache=held.cache, retry=held.retry, version=held.version
            )

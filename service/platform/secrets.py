"""Where secret values come from: sources an operator configures, never a profile.

A profile names a secret (``${{ secrets.NAME }}``); the value is looked up in the worker when
the action is called, and by the API only to check that the name exists. Nothing here keeps a
value: every lookup reads the source again, so a rotated file or variable is seen at the next
attempt. Sources, first to answer wins, the owner's value before the deployment's:

- a source of the operator's own (``FLOWBEAT_SECRETS_SOURCE``: ``module:attr`` or the name of
  a ``flowbeat.secrets`` entry point, called with the settings), e.g. Vault or a cloud store;
- a mounted directory (``FLOWBEAT_SECRETS_DIR``): a file per secret, ``<dir>/<owner>/<NAME>``
  before ``<dir>/<NAME>``, as Kubernetes and Docker mount secrets;
- JSON (``FLOWBEAT_SECRETS_JSON``): ``{"NAME": "value", "<owner>": {"NAME": "value"}}``;
- the environment: ``FLOWBEAT_SECRET_<OWNER>__<NAME>`` before ``FLOWBEAT_SECRET_<NAME>``.

Only settings name a source, so a profile cannot make a worker import or run anything.
"""

import importlib
import json
import os
from collections.abc import Collection, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import SecretStr

from service.platform.errors import SecretNotFound
from service.platform.settings import Settings

ENV_PREFIX = "FLOWBEAT_SECRET_"
ENTRY_POINT_GROUP = "flowbeat.secrets"


class SecretSourceInvalid(RuntimeError):
    """A setting names a source that does not load or does not parse: the process stops at
    start, so this never reaches a client and is no domain error."""

    def __init__(self, message: str, details: dict[str, str]) -> None:
        super().__init__(message)
        self.details = details


@runtime_checkable
class SecretSource(Protocol):
    """What a source of secrets answers: the value of ``name`` for ``owner``, or for the
    whole deployment when ``owner`` is ``None``; ``None`` when it has none. An error it raises
    fails the attempt as one to retry (a store that is down), never the step for good."""

    def get(self, name: str, owner: str | None) -> str | None: ...


class EnvironmentSource:
    def get(self, name: str, owner: str | None) -> str | None:
        key = f"{ENV_PREFIX}{owner}__{name}" if owner is not None else f"{ENV_PREFIX}{name}"
        return os.environ.get(key)


def _path_part(owner: str) -> bool:
    """An owner names a sub-directory only as one plain path component."""
    return bool(owner) and not owner.startswith(".") and not {"/", "\\", "\0"} & set(owner)


class DirectorySource:
    """A file is read when asked for, so a secret Kubernetes updates in place is seen next time;
    one trailing newline (``echo`` writes one) is not part of the value."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, name: str, owner: str | None) -> str | None:
        if owner is not None and not _path_part(owner):
            return None
        path = self.root / owner / name if owner is not None else self.root / name
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        return text.removesuffix("\n").removesuffix("\r")


class JsonSource:
    """Parsed when asked for, so the value lives in the setting alone."""

    def __init__(self, text: SecretStr) -> None:
        self.text = text
        self._parsed()

    def _parsed(self) -> Mapping[str, Any]:
        try:
            data = json.loads(self.text.get_secret_value())
        except json.JSONDecodeError as exc:
            raise SecretSourceInvalid(
                f"FLOWBEAT_SECRETS_JSON is not JSON (line {exc.lineno} column {exc.colno})",
                {"setting": "secrets_json"},
            ) from None
        if not isinstance(data, dict) or not all(_entry_ok(v) for v in data.values()):
            raise SecretSourceInvalid(
                "FLOWBEAT_SECRETS_JSON must be an object of strings, and of objects of strings "
                "for owners",
                {"setting": "secrets_json"},
            )
        return data

    def get(self, name: str, owner: str | None) -> str | None:
        data = self._parsed()
        scope = data.get(owner) if owner is not None else data
        value = scope.get(name) if isinstance(scope, dict) else None
        return value if isinstance(value, str) else None


def _entry_ok(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(item, str) for item in value.values())
    return isinstance(value, str)


def _plugin(spec: str, settings: Settings) -> SecretSource:
    """``module:attr`` is imported; anything else names an installed entry point."""
    try:
        if ":" in spec:
            module, _, attr = spec.partition(":")
            factory = getattr(importlib.import_module(module), attr)
        else:
            found = entry_points(group=ENTRY_POINT_GROUP, name=spec)
            if not found:
                raise ImportError(f"no {ENTRY_POINT_GROUP} entry point is named {spec!r}")
            factory = next(iter(found)).load()
        source = factory(settings)
    except Exception as exc:
        raise SecretSourceInvalid(
            f"FLOWBEAT_SECRETS_SOURCE {spec!r} cannot be loaded: {type(exc).__name__}: {exc}",
            {"setting": "secrets_source", "source": spec},
        ) from None
    if not isinstance(source, SecretSource):
        raise SecretSourceInvalid(
            f"FLOWBEAT_SECRETS_SOURCE {spec!r} gave no source with get(name, owner)",
            {"setting": "secrets_source", "source": spec},
        )
    return source


class Secrets:
    """The sources of this process, in the order they are asked."""

    def __init__(self, sources: list[SecretSource]) -> None:
        self.sources = sources

    def value(self, name: str, owner: str | None) -> str | None:
        """The owner's value in any source before the deployment's in any source."""
        for scope in (owner, None) if owner is not None else (None,):
            for source in self.sources:
                found = source.get(name, scope)
                if found is not None:
                    return found
        return None

    def require(self, names: Collection[str], owner: str) -> None:
        """Refuse a pipeline or a job that names a secret ``owner`` has none of; the values
        found are dropped at once."""
        if not names:
            return
        missing = sorted(name for name in names if self.value(name, owner) is None)
        if missing:
            raise SecretNotFound(
                f"no secret {', '.join(missing)} is configured for this deployment or owner",
                {"secrets": missing},
            )


_BUILT: dict[tuple[int, str | None, Path | None, SecretStr | None], Secrets] = {}


def secrets_of(settings: Settings) -> Secrets:
    """The process's sources, built once for the settings that name them and again in a
    forked pool process, so that no two processes share a source's connections. A source that
    does not load or does not parse stops the process at start (``Runtime.start``, and
    ``flowbeat worker`` before it starts Celery)."""
    key = (os.getpid(), settings.secrets_source, settings.secrets_dir, settings.secrets_json)
    built = _BUILT.get(key)
    if built is None:
        sources: list[SecretSource] = []
        if settings.secrets_source:
            sources.append(_plugin(settings.secrets_source, settings))
        if settings.secrets_dir is not None:
            sources.append(DirectorySource(settings.secrets_dir))
        if settings.secrets_json is not None:
            sources.append(JsonSource(settings.secrets_json))
        sources.append(EnvironmentSource())
        built = _BUILT[key] = Secrets(sources)
    return built

"""The worker process's Runtime, built on first use so that forked children build their own."""

import os

from service.engine.runtime import Runtime
from service.platform.settings import Settings

_settings: Settings | None = None
_runtime: Runtime | None = None
_pid: int | None = None


def configure(settings: Settings) -> None:
    global _settings
    _settings = settings
    reset()


def settings() -> Settings:
    if _settings is None:
        raise RuntimeError("tasks.runtime.configure() was not called")
    return _settings


def reset() -> None:
    global _runtime, _pid
    _runtime, _pid = None, None


def get() -> Runtime:
    global _runtime, _pid
    if _runtime is None or _pid != os.getpid():
        _runtime, _pid = Runtime.start(settings()), os.getpid()
    return _runtime

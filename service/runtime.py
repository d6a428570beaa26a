"""What a process needs to run steps: settings, a session factory and the action registry."""

from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from service.actions import REGISTRY, ActionRegistry, load_plugins
from service.db import make_engine, make_session_factory
from service.settings import Settings


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    sessions: sessionmaker[Session]
    registry: ActionRegistry

    @classmethod
    def start(cls, settings: Settings, *, pool_size: int = 5) -> "Runtime":
        load_plugins(REGISTRY, settings.action_modules)
        engine = make_engine(settings.require_database_url(), pool_size=pool_size)
        return cls(settings=settings, sessions=make_session_factory(engine), registry=REGISTRY)

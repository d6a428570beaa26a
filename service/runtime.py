"""What a process needs to run steps: settings, a session factory and the action registry."""

from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.actions import REGISTRY, ActionRegistry, load_plugins
from service.db import make_engine, make_session_factory
from service.heartbeat import Heartbeats
from service.settings import Settings


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    sessions: sessionmaker[Session]
    autocommit: Engine
    registry: ActionRegistry
    heartbeats: Heartbeats = field(compare=False)

    @classmethod
    def start(cls, settings: Settings, *, pool_size: int = 5) -> "Runtime":
        load_plugins(REGISTRY, settings.action_modules)
        engine = make_engine(settings.require_database_url(), pool_size=pool_size)
        sessions = make_session_factory(engine)
        return cls(
            settings=settings,
            sessions=sessions,
            autocommit=engine.execution_options(isolation_level="AUTOCOMMIT"),
            registry=REGISTRY,
            heartbeats=Heartbeats(sessions, settings.lease_s),
        )

"""What a process needs to run steps: settings, a session factory and the action registry."""

from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from service.actions import REGISTRY, ActionRegistry, load_plugins
from service.engine.heartbeat import Heartbeats
from service.platform.db import DirectConnections, make_engine, make_session_factory
from service.platform.secrets import secrets_of
from service.platform.settings import Settings


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    sessions: sessionmaker[Session]
    claims: DirectConnections
    checkpoints: DirectConnections
    registry: ActionRegistry
    heartbeats: Heartbeats = field(compare=False)

    @classmethod
    def start(cls, settings: Settings, *, pool_size: int = 5) -> "Runtime":
        load_plugins(REGISTRY, settings.action_modules)
        secrets_of(settings)
        url = settings.require_database_url()
        pooled = settings.database_pooled
        engine = make_engine(url, pool_size=pool_size, pooled=pooled)
        sessions = make_session_factory(engine)
        return cls(
            settings=settings,
            sessions=sessions,
            claims=DirectConnections(url, synchronous_commit=False, pooled=pooled),
            checkpoints=DirectConnections(url, pooled=pooled),
            registry=REGISTRY,
            heartbeats=Heartbeats(sessions, settings.lease_s),
        )

"""What a process needs to run steps: settings, a session factory and the action registry."""

from dataclasses import dataclass, field
from functools import partial

from sqlalchemy.orm import Session, sessionmaker

from service.actions import REGISTRY, ActionRegistry, load_plugins
from service.engine.heartbeat import Heartbeats
from service.platform.db import (
    DirectConnections,
    make_engine,
    make_session_factory,
    network_timeout_s,
)
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
        pooled, timeout_s = settings.database_pooled, network_timeout_s(settings.lease_s)
        engine = make_engine(url, pool_size=pool_size, pooled=pooled, timeout_s=timeout_s)
        sessions = make_session_factory(engine)
        direct = partial(DirectConnections, url, pooled=pooled, timeout_s=timeout_s)
        return cls(
            settings=settings,
            sessions=sessions,
            claims=direct(synchronous_commit=False),
            checkpoints=direct(),
            registry=REGISTRY,
            heartbeats=Heartbeats(sessions, settings.lease_s),
        )

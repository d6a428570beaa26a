"""Process settings, read once at start from the environment (``FLOWBEAT_`` prefix) or ``.env``."""

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOWBEAT_", env_file=".env", extra="ignore")

    database_url: str | None = None
    broker_url: str | None = None
    result_backend_url: str | None = None
    profiles_dir: Path = Path("profiles")
    action_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)
    data_dir: Path = Path(".flowbeat")

    lease_s: float = 30.0
    visibility_timeout_s: int = 300
    unacked_restore_interval_s: int = 10
    sweep_interval_s: float = 10.0
    stall_after_s: float = 300.0
    dispatch_grace_s: float = 10.0
    result_expires_s: int = 3600

    max_body_bytes: int = 1_000_000
    auth_cache_s: float = 5.0
    http_max_response_bytes: int = 10_000_000
    http_timeout_s: float = 30.0

    schedule_min_interval_s: float = 3600.0
    schedule_max_active_per_owner: int = 5
    schedule_run_timeout_s: float = 300.0
    runs_kept_per_pipeline: int = 100
    beat_lock_ttl_s: float = 30.0

    worker_concurrency: int = 2
    worker_prefetch: int = 4

    @field_validator("action_modules", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    def require_database_url(self) -> str:
        if not self.database_url:
            raise RuntimeError("FLOWBEAT_DATABASE_URL is not set (or run `flowbeat dev`)")
        return self.database_url

    def require_broker_url(self) -> str:
        if not self.broker_url:
            raise RuntimeError("FLOWBEAT_BROKER_URL is not set (or run `flowbeat dev`)")
        return self.broker_url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process; read once, then passed to whoever needs them."""
    return Settings()

"""Process settings, read once at start from the environment (``FLOWBEAT_`` prefix) or ``.env``."""

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
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

    webhook_secret: SecretStr | None = None
    notify_max_attempts: int = 5
    notify_backoff_s: float = 2.0
    notify_timeout_s: float = 10.0
    notify_items_max: int = 20
    notify_resend_after_s: float = 600.0
    import_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    import_dir: Path | None = None
    import_max_bytes: int = 100_000
    import_timeout_s: float = 10.0
    import_max_redirects: int = 5
    pubmed_base_url: str = "https://eutils.ncbi.nlm.nih.gov/entrez/eutils"
    europepmc_base_url: str = "https://www.ebi.ac.uk/europepmc/webservices/rest"
    ncbi_api_key: str | None = None
    ncbi_tool: str = "flowbeat"
    ncbi_email: str | None = None
    ncbi_rate_per_s: int = 3
    ncbi_rate_per_s_with_key: int = 10

    upsert_schema: str = "datasets"
    download_max_bytes: int = 100_000_000
    parse_max_rows: int = 1_000_000
    schedule_min_interval_s: float = 3600.0
    schedule_max_active_per_owner: int = 5
    schedule_run_timeout_s: float = 300.0
    runs_kept_per_pipeline: int = 100
    beat_lock_ttl_s: float = 30.0

    worker_concurrency: int = 2
    worker_prefetch: int = 4

    @field_validator("action_modules", "import_allowed_hosts", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("import_dir", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        """An empty ``FLOWBEAT_IMPORT_DIR`` disables file imports rather than meaning ``.``."""
        return None if isinstance(value, str) and not value.strip() else value

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

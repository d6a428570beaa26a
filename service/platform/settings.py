"""Process settings, read once at start from the environment (``FLOWBEAT_`` prefix) or ``.env``."""

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.platform.brokers import BrokerAddress, is_sentinel, parse_sentinel_url
from service.platform.constants import DEFAULT_QUEUE, EVENT_KEEPALIVE_S, QUEUE_PATTERN
from service.platform.errors import ServersHalfSet


class LlmProvider(BaseModel):
    """An OpenAI-compatible endpoint (OpenAI, Azure OpenAI, vLLM, Ollama). The key is named
    here, never given: ``api_key_env`` is the environment variable that holds it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")
    kind: Literal["openai", "azure", "vllm", "ollama"] = "openai"
    base_url: str = Field(description="e.g. https://api.openai.com/v1")
    api_key_env: str | None = None
    default_model: str
    embedding_model: str | None = None
    api_version: str | None = Field(default=None, description="Azure's api-version")
    timeout_s: float = Field(default=60.0, gt=0)
    requests_per_minute: int = Field(default=0, ge=0, description="0: no limit")
    options: dict[str, Any] = Field(
        default_factory=dict, description="defaults a step's own options override"
    )


AlertKind = Literal[
    "job_failed",
    "deadline_passed",
    "approval_escalated",
    "step_retried",
    "schedule_silent",
    "queue_age",
]


class AlertRuleBody(BaseModel):
    """An alert rule as an owner writes it, through the API or ``FLOWBEAT_ALERTS``."""

    model_config = ConfigDict(extra="forbid")

    kind: AlertKind = Field(
        description="job_failed, deadline_passed, approval_escalated, step_retried (more than "
        "threshold retries), schedule_silent (no job threshold seconds past a due fire), "
        "queue_age (the oldest message waiting more than threshold seconds)"
    )
    url: str = Field(min_length=1, max_length=2048, description="where the webhook is POSTed")
    threshold: int | None = Field(
        default=None,
        ge=0,
        description="retries (step_retried) or seconds (schedule_silent, "
        "queue_age); none for the other kinds",
    )
    pipeline: str | None = Field(
        default=None, min_length=1, max_length=200, description="only this pipeline's events"
    )
    secret: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
        description="the secret the body is signed with, by name, from the secrets source; "
        "none: FLOWBEAT_WEBHOOK_SECRET",
    )
    format: Literal["flowbeat", "slack"] = Field(
        default="flowbeat", description="slack: a body a Slack incoming webhook takes"
    )
    dedupe_s: int = Field(
        default=300,
        ge=0,
        le=7 * 86_400,
        description="after one alert, later ones of the same subject (a pipeline, a step, a "
        "schedule, a queue) within this many seconds are counted, not sent",
    )
    enabled: bool = True


class AlertRuleSetting(AlertRuleBody):
    """A rule of ``FLOWBEAT_ALERTS``: named, for an owner."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    owner: str = Field(min_length=1, max_length=128)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOWBEAT_", env_file=".env", extra="ignore")

    database_url: str | None = None
    database_pooled: bool = False
    """``FLOWBEAT_DATABASE_URL`` goes through a pooler in transaction mode (PgBouncer): a server
    connection serves other clients between transactions, so none keeps a prepared statement
    or a session setting, and ``LISTEN`` goes to ``database_listen_url``."""
    database_listen_url: str | None = None
    """A direct connection for ``LISTEN`` (the event stream, the beat's wakeups), which a
    transaction pooler cannot carry; none: ``FLOWBEAT_DATABASE_URL``."""
    broker_url: str | None = None
    broker_sentinel_master: str | None = Field(default=None, validate_default=True)
    """The name the sentinels monitor the primary under (``sentinel monitor <name> ...``);
    required when ``FLOWBEAT_BROKER_URL`` is a Sentinel URL,
    ``sentinel://[:password@]host:port[/db];sentinel://host2:port;...``."""
    broker_sentinel_password: SecretStr | None = None
    """The sentinels' own password (their ``requirepass``), when they ask for one; the
    primary's goes in the URL."""
    result_backend_url: str | None = None
    profiles_dir: Path | None = None
    action_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)
    data_dir: Path = Path(".flowbeat")
    data_store: str | None = None
    """Where ``data.download`` puts files and ``data.parse`` reads them: a directory (a path or
    a ``file://`` URL) that every worker host mounts, or ``s3://bucket[/prefix]`` on S3 or an
    S3-compatible server; none: ``data_dir``. With workers on more than one host, a parse may
    run on another host than its download, so they need a store they all reach. S3
    credentials come from the secrets ``DATA_STORE_ACCESS_KEY_ID`` and
    ``DATA_STORE_SECRET_ACCESS_KEY``, else the ``AWS_`` environment or the machine's role."""
    data_store_endpoint: str | None = None
    """The S3-compatible server of an ``s3://`` store (MinIO, Ceph, R2), e.g.
    ``https://minio.internal:9000``; none: AWS's endpoint for the region."""
    data_store_region: str | None = None
    """The region of an ``s3://`` store; none: ``AWS_REGION``, else ``us-east-1``."""

    lease_s: float = 30.0
    visibility_timeout_s: int = 300
    unacked_restore_interval_s: int = 10
    sweep_interval_s: float = 10.0
    worker_heartbeat_s: float = Field(default=2.0, gt=0)
    worker_dead_after_s: float = Field(default=15.0, gt=0)
    """A worker silent this long is dead: a peer sends the messages it held to other workers.
    Long enough that a busy machine's pause does not count as a death (that would only run
    prefetched messages twice, each step still settling once), short beside a lease."""
    stall_after_s: float = 300.0
    dispatch_grace_s: float = 10.0
    result_expires_s: int = 3600

    max_body_bytes: int = 1_000_000
    step_log_max_bytes: int = Field(default=1_000_000, ge=1)
    """What one step attempt's log keeps of what it logged and printed (message text, UTF-8);
    past it the log is cut, and its last line says so."""
    auth_cache_s: float = 5.0
    api_db_pool_size: int = Field(default=20, ge=1)
    """Connections an API process keeps open; requests beyond it open and close their own, which
    costs PostgreSQL a backend each, so it is sized for the thread pool's usual concurrency."""
    api_shutdown_grace_s: int = Field(default=5, ge=1)
    """How long a stopping API lets the requests in flight finish. Event streams never finish
    by themselves: they are cut then, and their clients resume after their last event."""
    event_keepalive_s: float = Field(default=EVENT_KEEPALIVE_S, gt=0)
    rate_limit_per_s: float = Field(default=100.0, ge=0)
    """Requests per second each API key may send, shared by every API process; 0: no limit."""
    rate_limit_burst: int = Field(default=200, ge=1)
    rate_limit_lease: int = Field(default=10, ge=1)
    """Units of a key's window an API process takes from Redis at a time and spends on that
    key's requests without asking again (at most a twentieth of the burst). In any window,
    a key may get up to ``processes x lease`` requests past its burst; 1: exact, a round trip
    to Redis for every request."""
    max_open_jobs_per_owner: int = Field(default=10_000, ge=0)
    """Queued, running and waiting jobs an owner may have before a new one is refused; 0: none."""
    idempotency_ttl_s: float = Field(default=86_400.0, gt=0)
    """How long a job answers for its ``idempotency_key``, from its submission: a submission
    with the key after that stores a new job (a job pruned by retention frees its key sooner)."""
    max_fanout_items: int = Field(default=100_000, ge=1)
    max_pipeline_depth: int = Field(default=5, ge=1, le=100)
    """How deep ``pipeline.run`` may nest jobs: a step whose child would be deeper fails with
    ``pipeline_depth_exceeded`` instead of starting it."""
    max_job_steps: int = Field(default=200_000, ge=1)
    """Step rows one job may hold, the items of all its fan-outs included: a profile's 200
    steps could each fan out ``max_fanout_items`` times over otherwise."""
    http_max_response_bytes: int = 10_000_000
    http_timeout_s: float = 30.0
    egress_allow_http: bool = False
    egress_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    egress_internal_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    egress_action_allowed_hosts: dict[str, list[str]] = Field(default_factory=dict)
    egress_max_redirects: int = 5

    webhook_secret: SecretStr | None = None
    flower_basic_auth: SecretStr | None = None
    forwarded_allow_ips: str | None = None
    """Comma-separated addresses or networks (``*``: any) of the proxies whose
    ``X-Forwarded-Proto`` and ``-For`` ``flowbeat api`` believes: behind a proxy that terminates
    TLS, the login cookie is Secure only if the API learns the request came over https. None:
    uvicorn's own default, loopback only."""
    flower_url: str | None = None
    """Where people reach Flower; the dashboard links each step's task there when set."""
    cli_owner: str | None = Field(default=None, min_length=1, max_length=128)
    """The owner the ``flowbeat`` command acts as where ``--owner`` is not given, and whose
    admin key ``flowbeat dev`` makes. Unset: ``dev`` in the embedded default, so the command
    sees what a client of ``flowbeat dev``'s key saved; ``default`` with your own servers."""
    api_key: SecretStr | None = None
    """An API key whose owner the ``flowbeat`` command acts as where neither ``--owner`` nor
    ``FLOWBEAT_CLI_OWNER`` is given, so it saves over and shows what a client of that key
    saved through the API; a key that is unknown or revoked is refused."""
    mcp_key: SecretStr | None = None
    """The API key ``flowbeat mcp`` acts as over stdio; HTTP clients send their own."""
    secrets_dir: Path | None = None
    """A mounted directory of secrets (Kubernetes, Docker): the file ``<NAME>`` holds the value
    of ``${{ secrets.NAME }}``, ``<owner>/<NAME>`` an owner's own. Read at each use, never kept;
    ``FLOWBEAT_SECRET_<NAME>`` (``_<OWNER>__<NAME>``) variables are read too."""
    secrets_json: SecretStr | None = None
    """Secrets as JSON: ``{"NAME": "value", "<owner>": {"NAME": "value"}}``."""
    secrets_source: str | None = None
    """A source of secrets of your own (Vault, a cloud store), asked first: ``module:attr`` or
    a ``flowbeat.secrets`` entry point's name, called with the settings; only an operator's
    setting names one, never a profile."""
    alerts: list[AlertRuleSetting] = Field(default_factory=list)
    """Alert rules as JSON in ``FLOWBEAT_ALERTS`` (``[{"name": ..., "owner": ..., "kind": ...,
    "url": ...}]``), written into PostgreSQL by the beat leader; the API shows them and refuses
    to change them."""
    alerts_interval_s: float = Field(default=5.0, gt=0)
    """How often the beat leader reads new events, checks schedules and queues against the
    rules, and hands due alerts to a worker."""
    alerts_max_attempts: int = Field(default=8, ge=1)
    """Attempts at one alert (5xx, 429, timeouts are retried) before it is given up."""
    alerts_backoff_s: float = Field(default=5.0, gt=0)
    """The wait after an alert's first failed attempt; it doubles after each, up to
    ``alerts_backoff_max_s``."""
    alerts_backoff_max_s: float = Field(default=600.0, gt=0)
    """The longest wait between two attempts at one alert."""
    alerts_kept_days: float = Field(default=30.0, gt=0)
    """Delivered and given-up alerts older than this are deleted by the beat leader."""
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
    step_rate_guard_s: float = Field(default=0.05, ge=0, le=1)
    """Added to every step rate limit's window: a step starts a few milliseconds after its
    grant, and this keeps those starts, not only the grants, within the limit."""

    upsert_schema: str = "datasets"
    download_max_bytes: int = 100_000_000
    parse_max_rows: int = 1_000_000
    schedule_min_interval_s: float = 3600.0
    schedule_max_active_per_owner: int = 5
    schedule_run_timeout_s: float = 300.0
    backfill_max_fires: int = Field(default=1000, ge=1)
    """The most fire times one backfill may cover; a longer range is refused, not cut short."""
    runs_kept_per_pipeline: int = Field(default=100, ge=0)
    """Finished runs each owner's pipeline keeps once they are older than the minimum age."""
    retention_min_age_s: float = Field(default=86_400.0, ge=0)
    """A finished job is kept at least this long, however many runs its pipeline has: a client
    given a 202 must still find it when it polls after the job ends."""
    retention_max_age_days: float | None = Field(default=None, gt=0)
    """Finished jobs older than this are pruned whatever the count (never before the minimum
    age, nor a diff base still needed); none: no age limit."""
    audit_retention_days: float = Field(default=90.0, gt=0)
    """Audit events older than this are pruned by the sweeper, a batch per pass."""
    beat_lock_ttl_s: float = 30.0

    llm_providers: list[LlmProvider] = Field(default_factory=list)
    """JSON in ``FLOWBEAT_LLM_PROVIDERS``; ``llm.chat`` steps name one, or get the first."""

    worker_metrics_port: int = Field(default=0, ge=0, le=65535)
    """Where a worker serves ``/metrics`` (its pool processes summed); 0: no exporter."""
    beat_metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    metrics_token: SecretStr | None = None
    """Bearer token the worker and beat exporters require; needed off loopback."""
    log_format: Literal["auto", "json", "text"] = "auto"
    """``auto``: text on a terminal, one JSON object a line otherwise."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    worker_concurrency: int = 2
    task_events: bool = False
    """Celery task events, for Flower: each step then costs its worker three more publishes
    (about 9% of a no-op chain's throughput), and has a message of its own, so that Flower
    shows it under its own name (``tasks.inline``); they are on only where Flower runs. The
    workers send them; no producer sends ``task-sent``, which names the task and not the step:
    arriving after the worker's ``task-received``, as events of two processes may, it renamed
    the step's task in Flower to ``flowbeat.run_step``."""
    bulk_batch_jobs: int = Field(default=100, ge=1, le=1000)
    """How many jobs a bulk cancel or rerun changes in one transaction: a retry after a crash
    repeats at most one uncommitted batch, and a batch holds its jobs' locks until it commits."""
    fair_share_ahead: int = Field(default=0, ge=0)
    """Fair share between owners: at most this many jobs submitted through the API are sent
    and not started at once; the others wait their turn in PostgreSQL and the beat leader
    sends them round-robin by owner, each owner's highest priority first. 0 sends every job at
    once, in arrival order."""
    worker_queues: Annotated[
        list[Annotated[str, StringConstraints(pattern=QUEUE_PATTERN)]], NoDecode
    ] = Field(default_factory=lambda: [DEFAULT_QUEUE], min_length=1)
    """The queues this process's worker consumes (``FLOWBEAT_WORKER_QUEUES=gpu,default``, or
    ``flowbeat worker --queues``); the control queue always."""
    worker_prefetch: int = 4
    worker_disable_prefetch: bool = True
    """A worker takes a message only when a pool process is free (Celery's
    ``worker_disable_prefetch``), so a job of a higher priority sent later is not left behind
    messages a busy worker took earlier, and a worker killed as a whole held no more than it
    ran. ``worker_prefetch`` bounds what it takes when this is off."""

    @field_validator(
        "action_modules",
        "import_allowed_hosts",
        "egress_allowed_hosts",
        "egress_internal_hosts",
        "worker_queues",
        mode="before",
    )
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("database_listen_url")
    @classmethod
    def _direct_behind_a_pooler(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A ``LISTEN`` through a transaction pooler is accepted and then never delivers:
        refused at start rather than found silent."""
        if info.data.get("database_pooled") and info.data.get("database_url") and not value:
            raise ValueError(
                "FLOWBEAT_DATABASE_POOLED needs a direct connection for LISTEN: set "
                "FLOWBEAT_DATABASE_LISTEN_URL"
            )
        return value

    @field_validator("worker_dead_after_s")
    @classmethod
    def _outlives_heartbeats(cls, value: float, info: ValidationInfo) -> float:
        beat = info.data.get("worker_heartbeat_s")
        if beat is not None and value < 3 * beat:
            raise ValueError("must be at least three heartbeats (FLOWBEAT_WORKER_HEARTBEAT_S)")
        return value

    @field_validator("profiles_dir", "secrets_dir")
    @classmethod
    def _profiles_dir_readable(cls, value: Path | None) -> Path | None:
        """Refused at start rather than found missing or unreadable on the first request."""
        if value is not None and not value.is_dir():
            raise ValueError(f"{str(value)!r} is not a directory")
        if value is not None and not os.access(value, os.R_OK | os.X_OK):
            raise ValueError(f"{str(value)!r} cannot be read")
        return value

    @field_validator("data_store")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        """Refused at start rather than at a job's first download."""
        if value is None:
            return None
        scheme, sep, rest = value.partition("://")
        if not sep or scheme == "file":
            if not (rest if sep else value).startswith("/"):
                raise ValueError("a directory store must be an absolute path")
            return value
        if scheme != "s3" or not rest.split("/")[0]:
            raise ValueError("expected an absolute path, file:///path or s3://bucket[/prefix]")
        return value

    @field_validator(
        "profiles_dir",
        "import_dir",
        "secrets_dir",
        "secrets_source",
        "data_store",
        "data_store_endpoint",
        "data_store_region",
        mode="before",
    )
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        """An empty ``FLOWBEAT_PROFILES_DIR`` or ``FLOWBEAT_IMPORT_DIR`` means none rather than
        ``.``, so a blank line in a ``.env`` never turns the working directory into one."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("flower_basic_auth")
    @classmethod
    def _user_colon_password(cls, value: SecretStr | None) -> SecretStr | None:
        """``user:password``, or several separated by commas, each with both parts."""
        if value is None:
            return None
        for pair in value.get_secret_value().split(","):
            user, sep, password = pair.partition(":")
            if not (user and sep and password):
                raise ValueError("expected user:password (several separated by commas)")
        return value

    @field_validator("broker_url")
    @classmethod
    def _sentinel_url_parses(cls, value: str | None) -> str | None:
        """Refused at start, in every process alike, rather than at the first connection."""
        if value and is_sentinel(value):
            parse_sentinel_url(value)
        return value

    @field_validator("broker_sentinel_master")
    @classmethod
    def _sentinel_named(cls, value: str | None, info: ValidationInfo) -> str | None:
        url = info.data.get("broker_url")
        if url and is_sentinel(url) and not value:
            raise ValueError(
                "required with a sentinel:// FLOWBEAT_BROKER_URL: the name the sentinels "
                "monitor the primary under (sentinel monitor <name> ...)"
            )
        return value

    def embedded(self) -> bool:
        """Whether this process runs on the embedded servers: neither server is set."""
        if bool(self.database_url) != bool(self.broker_url):
            given, missing = ("DATABASE_URL", "BROKER_URL")
            if not self.database_url:
                given, missing = missing, given
            raise ServersHalfSet(
                f"FLOWBEAT_{given} is set but FLOWBEAT_{missing} is not: set both to use your "
                "servers, or neither for the embedded default",
                {"missing": f"FLOWBEAT_{missing}"},
            )
        return not self.database_url

    def require_database_url(self) -> str:
        if not self.database_url:
            raise RuntimeError("FLOWBEAT_DATABASE_URL is not set (or run `flowbeat dev`)")
        return self.database_url

    def listen_url(self) -> str:
        return self.database_listen_url or self.require_database_url()

    def require_broker_url(self) -> str:
        if not self.broker_url:
            raise RuntimeError("FLOWBEAT_BROKER_URL is not set (or run `flowbeat dev`)")
        return self.broker_url

    def broker(self) -> BrokerAddress:
        """Where every client of the broker's Redis connects (``service.platform.brokers``)."""
        password = self.broker_sentinel_password
        return BrokerAddress(
            self.require_broker_url(),
            self.broker_sentinel_master,
            password.get_secret_value() if password else None,
        )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process; read once, then passed to whoever needs them."""
    return Settings()

"""Names and durations shared by every process, in one place so they cannot drift apart."""

from importlib import resources
from pathlib import Path
from typing import Final

VERSION: Final = "0.1.0"

QUEUE_STEPS: Final = "flowbeat.steps"
QUEUE_CONTROL: Final = "flowbeat.control"
DEFAULT_QUEUE: Final = "default"
QUEUE_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,39}$"
"""A queue's name: a worker pool's, chosen by whoever runs the pool, so any name is allowed
(a pool may start later) if it is short and plain enough to be part of a Redis key."""
MAX_PRIORITY: Final = 9
MAX_JOB_TIMEOUT_S: Final = 90 * 86400
"""The longest a job's ``timeout_s`` may be: as long as an approval may wait."""
"""Job priorities run from 0, the default, to this; higher is taken first."""
"""The sweeper's own queue, which every worker also consumes: a sweep queued behind a backlog of
steps would recover lost work only once that backlog had drained."""

TASK_RUN_STEP: Final = "flowbeat.run_step"
TASK_RUN_LANE: Final = "flowbeat.run_lane"
TASK_FINISH_FANOUT: Final = "flowbeat.finish_fanout"
TASK_COMPENSATE: Final = "flowbeat.compensate"
TASK_SWEEP: Final = "flowbeat.sweep"

BROKER_EPOCH_KEY: Final = "flowbeat:broker-epoch"
UNACKED_KEY: Final = "unacked"
"""kombu's Redis transport's default name for its hash of unacknowledged messages."""
WORKERS_KEY: Final = "flowbeat:workers"
WORKER_QUEUES_KEY: Final = "flowbeat:worker-queues"
"""Each live worker's queues, comma-separated, by the name it beats under in ``WORKERS_KEY``."""
"""Every worker's last heartbeat, in Redis's own clock (``tasks.liveness``)."""
WORKER_HELD_KEY_PREFIX: Final = "flowbeat:held:"
"""The delivery tags of the messages one worker has taken and not yet acknowledged."""
WORKER_REAP_LOCK_PREFIX: Final = "flowbeat:reaping:"

SHARD_NONE: Final = -1

STEP_TIMEOUT_GRACE_S: Final = 5
LANE_SLICE_S: Final = 1
"""A fan-out lane takes further shards in one message until this long has passed, then hands
over to a fresh message; a shard starting within the slice still gets its whole timeout."""
LANE_BATCH_S: Final = 0.05
"""A lane takes together as many shards as its pace says run in this long, and checkpoints
them in one statement: the most work a worker that dies mid-batch loses (ADR 27)."""
LANE_BATCH_MAX: Final = 32
CHAIN_SLICE_S: Final = 2
"""How much longer a step's message's time limits are than its step's timeout: the budget in
which its worker may run the steps that follow it in a chain without a message of their own.
Each step is still held to its own timeout by the worker (``tasks.inline``)."""
CHAIN_START_MARGIN_S: Final = 0.5
"""A step that follows in the same message starts only if its whole timeout, and this, still
fit in the message's soft limit, so the worker's own timer fires before Celery's."""
TIMER_COMPACT_INTERVAL_S: Final = 10.0
WAIT_FOR_PEER_MAX_S: Final = 5.0
DEFAULT_STEP_TIMEOUT_S: Final = 300
JOB_LIST_MAX_LIMIT: Final = 200
JOB_LIST_DEFAULT_LIMIT: Final = 50
LABELS_MAX: Final = 16
LABEL_KEY_MAX_CHARS: Final = 63
LABEL_VALUE_MAX_CHARS: Final = 255
BULK_PREVIEW_IDS: Final = 20
"""How many of the jobs a bulk action matches its dry run lists."""
API_KEY_PREFIX: Final = "fb_"
SWEEP_ADVISORY_LOCK_ID: Final = 0x666C6F77
LIFECYCLE_LOCK_ID: Final = 0x666C6F78
"""Held while the lifecycle table is written into its trigger (``platform.lifecycle``)."""
PROFILES_LOCK_ID: Final = 0x666C6F79
"""Shared by each statement that stores jobs, from its look for their profile in
``job_profiles`` to its commit; held alone while unnamed profiles are deleted, so that none
goes while a job that names it is being stored (``service.engine.profiles``)."""

TASK_SEND_NOTICE: Final = "flowbeat.send_notice"
TASK_SEND_ESCALATION: Final = "flowbeat.send_escalation"
TASK_SEND_ALERTS: Final = "flowbeat.send_alerts"
APPROVAL_LIST_MAX: Final = 500
DIFF_PAGE_MAX_LIMIT: Final = 1000
DIFF_PAGE_DEFAULT_LIMIT: Final = 100
RATE_LIMIT_KEY_PREFIX: Final = "flowbeat:ratelimit:"
RATE_LIMIT_META_PREFIX: Final = "flowbeat:ratelimit-meta:"
"""Beside a step rate limit's window, while it lives: its limit and window, for the listing."""
STEP_RATE_KEY_PREFIX: Final = "key:"
"""A step's rate-limit key names its window under this, apart from the API's own limits; a
key the settings configure (``service.engine.rates.configured``) names it as is."""
RATE_LEASE_PARTS: Final = 20
"""A worker process leases at most a step key's limit divided by this at once: a limit under
it is asked of the window step by step."""
RATE_WAKE_BATCH: Final = 500
"""Most steps parked for a rate limit the beat leader looks at in one tick."""
RATE_LIMIT_REDIS_TIMEOUT_S: Final = 1.0
RATE_LIMIT_BATCH_MAX: Final = 64
"""Most rate-limit checks the API sends to Redis in one round trip (``api.batching``)."""
RATE_LIMIT_LEASE_PARTS: Final = 20
"""An API process leases at most a burst divided by this at a time (at least one unit)."""
NCBI_RATE_LIMIT_NAME: Final = "ncbi-eutils"
LITERATURE_HTTP_ATTEMPTS: Final = 4
LITERATURE_RETRY_AFTER_MAX_S: Final = 30.0
NCBI_RATE_WINDOW_S: Final = 1.1
BEAT_LOCK_KEY: Final = "flowbeat:beat-leader"
SCHEDULES_CHANNEL: Final = "flowbeat_schedules"
TRIGGER_SCHEDULE: Final = "schedule"
SCHEDULE_LIST_MAX: Final = 500
LEADER_POLL_S: Final = 1.0
"""The beat leader reads schedules and approval deadlines at least this often, so a schedule
saved through the API (or a decision that timed out) is acted on within a second, not at the
next lock renewal; a replica that does not lead only renews its bid for the lock."""

SHIPPED_DIR: Final = Path(str(resources.files("profiles")))
"""The shipped profiles and their data, wherever flowbeat is installed."""
EVENTS_CHANNEL: Final = "flowbeat_events"
"""Notified with a job id by the event-log triggers of migration 0011 when a change commits."""
EVENT_PAGE_ROWS: Final = 500
STEP_LOG_PAGE_ROWS: Final = 500
"""Lines a page of a step's log holds unless the reader asks for fewer or more."""
STEP_LOG_PAGE_MAX_ROWS: Final = 5000
STEP_LOGS_LOCK_SPACE: Final = 30_001
"""The first key of the two-key advisory locks that order one job's step log writes (the
second is the job id's hash); two-key locks never meet the one-key locks used elsewhere."""
DEDUPE_LOCK_SPACE: Final = 30_002
"""The first key of the two-key advisory locks under which a job with a dedupe key is
checked and stored (migration 0044; the second is the hash of owner, pipeline and key)."""
DEDUPE_WINDOW_MAX_S: Final = 90 * 86_400
DEDUPE_KEY_MAX_CHARS: Final = 200
"""A resolved dedupe key longer than this is stored as its SHA-256 (``sha256:<hex>``), so a
long query still fits the key's index."""
EVENT_KEEPALIVE_S: Final = 15.0
"""An open stream writes a comment this often when nothing happens, so proxies keep it open."""
EVENT_LISTEN_RETRY_S: Final = 1.0
SYNC_WAIT_MAX_S: Final = 60.0
SYNC_WAIT_DEFAULT_S: Final = 30.0
"""The longest a ``"mode": "sync"`` submission holds its request open before answering 202."""
RETENTION_BATCH_ROWS: Final = 1000
"""Finished jobs one sweep deletes at most, so the pass stays a short transaction."""
AUDIT_DETAIL_MAX_BYTES: Final = 1024
"""An audit event's detail beyond this (as JSON) is replaced by a note of its size."""
AUDIT_LIST_MAX_LIMIT: Final = 200
AUDIT_LIST_DEFAULT_LIMIT: Final = 50
TOMBSTONES_KEPT_S: Final = 30 * 86_400
"""How long the tombstone of a pruned job is kept when no maximum age is set: long enough for
any client still polling a job to learn it expired rather than never existed."""
FIRE_RECORDS_KEPT_S: Final = 86_400
"""How long a fire record outlives its schedule's catch-up window before it is pruned."""
OPEN_JOBS_RETRY_AFTER_S: Final = 5
"""The Retry-After of a submission refused because its owner has too many open jobs."""
TRIGGER_WEBHOOK: Final = "webhook"
HOOK_TOLERANCE_S: Final = 300
"""How far a delivery's signed timestamp may be from now, either way."""
HOOK_DELIVERIES_KEPT_S: Final = 3600
"""Delivery ids are kept this long: well past the tolerance, after which a replay is stale."""
TRIGGER_DEPENDENCY: Final = "dependency"
TRIGGER_ON_SUCCEEDED: Final = "succeeded"
TRIGGER_ON_NEW_ITEMS: Final = "new_items"
TRIGGERS_LOCK: Final = "flowbeat:pipeline-triggers"
"""Hashed with an owner into the advisory lock a save holds while it checks for cycles."""
DEPENDENCY_NEW_ITEMS_MAX: Final = 1000
"""New items of the upstream run a downstream job gets as ``trigger.new_items``, at most."""
DEPENDENCY_BATCH: Final = 100
"""Queued successes one pass turns into downstream jobs; the rest wait for the next pass."""
LLM_HTTP_ATTEMPTS: Final = 3
"""Requests an ``llm.chat`` attempt makes on 429, 5xx and transport errors before it fails."""

MCP_HISTORY_NEW_ITEMS: Final = 5
"""How many of the newest successful run's new items ``get_pipeline_history`` shows."""

HEADER_SENT_AT: Final = "flowbeat_sent_at"
"""Message header: when a step's message was sent (epoch seconds), for its queue wait."""
BROKER_PUBLISH_RETRIES: Final = 3
"""Retries of a step message pushed without Celery after a broken connection, as Celery's
default publish retry policy makes."""
BROKER_PUBLISH_RETRY_INTERVAL_S: Final = 0.2
"""The pause before each of those retries (Celery's policy: 0, 0.2 and 0.4 s)."""
BROKER_PUSH_TIMEOUT_S: Final = 1.0
"""How long a step message pushed without Celery waits for Redis to connect or to answer. A
broker that stops answering without closing its connections (a partition, a failover behind
a proxy) held a request for about 21 s under redis-py's default of 5 s, four attempts in all;
a healthy Redis answers a push in well under a millisecond."""
REDIS_SOCKET_TIMEOUT_S: Final = 5.0
"""How long Celery's own connections to Redis (the broker's commands, the result backend) wait
to connect or for an answer. kombu waits forever by default and Celery's result backend
120 s, so a worker whose connections a NAT, a firewall or a failover left open but silent
hung in an ack or a fan-out's publish and ran nothing more. It must outlast the 1 s of
kombu's BRPOP, which is read with the same timeout when a worker drains without its event
loop."""
REDIS_HEALTH_CHECK_S: Final = 5
"""kombu's checks of its long-lived connections, every this many seconds: a BRPOP whose answer
is overdue by this much past its own 1 s is dropped and made again (with kombu's default of
25 s a worker whose connection went silent took no message for up to 51 s), and the pub/sub
connection is pinged. redis-py also pings a connection idle this long before using it."""
API_LOOP_DB_WAIT_S: Final = 1.0
"""How long a job accepted on the API's event loop waits for a connection of its async pool
before it is accepted in the thread pool instead (which answers 503 if the database is down)."""
API_JOB_BATCH_MAX: Final = 64
"""Most jobs the API's event loop stores in one statement and sends in one push: the jobs that
queued up while the previous batch was in flight (``api.batching``)."""

LOG_QUEUE_RECORDS: Final = 10_000
"""Log lines the API's event loop may leave for its writer thread before it drops new ones:
a stalled stderr then costs lines, and a line that says how many, never the loop."""
LOG_WRITE_INTERVAL_S: Final = 0.05
"""How often at most the writer thread wakes: the lines of a busy stretch go out together."""
LOG_FLUSH_S: Final = 2.0
"""How long a process that exits waits for its writer thread to write what is waiting."""
WAIT_ACTION: Final = "wait"
"""The action name the engine keeps for itself: a ``wait`` step parks in PostgreSQL until its
time and is woken by the beat leader (``service.engine.waits``); no registered action runs."""
WAIT_MAX_S: Final = 90 * 86400
"""The longest a ``wait`` step may wait, as for an approval's timeout."""
WAKE_BATCH: Final = 100
"""Sleeping steps the beat leader wakes in one transaction; more due go in the next ones."""
PIPELINE_RUN_ACTION: Final = "pipeline.run"
"""The action name the engine keeps for sub-pipelines: a ``pipeline.run`` step starts a child
job and, with ``wait: true``, parks until it ends (``service.engine.children``)."""
TRIGGER_PARENT: Final = "parent"
"""The trigger of a job started by a ``pipeline.run`` step of another job."""
TRIGGER_RERUN: Final = "rerun"
"""The trigger of a job that reruns another (``service.engine.reruns``)."""
CHILD_BATCH: Final = 100
"""Child calls the beat leader starts, settles or cancels in one transaction."""

CACHE_TTL_MAX_S: Final = 90 * 86400
"""The longest ``cache.ttl_s`` a step may declare: retention prunes step cache entries older
than this, since no step can take them any more."""

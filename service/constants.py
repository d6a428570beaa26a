"""Names and durations shared by every process, in one place so they cannot drift apart."""

from typing import Final

VERSION: Final = "0.1.0"

QUEUE_STEPS: Final = "flowbeat.steps"
QUEUE_CONTROL: Final = "flowbeat.control"

TASK_RUN_STEP: Final = "flowbeat.run_step"
TASK_RUN_LANE: Final = "flowbeat.run_lane"
TASK_FINISH_FANOUT: Final = "flowbeat.finish_fanout"
TASK_SWEEP: Final = "flowbeat.sweep"

BROKER_EPOCH_KEY: Final = "flowbeat:broker-epoch"

SHARD_NONE: Final = -1

STEP_TIMEOUT_GRACE_S: Final = 5
LANE_SLICE_S: Final = 1
TIMER_COMPACT_INTERVAL_S: Final = 10.0
"""A fan-out lane takes further shards in one message until this long has passed, then hands
over to a fresh message; a shard starting within the slice still gets its whole timeout."""
WAIT_FOR_PEER_MAX_S: Final = 5.0
DEFAULT_STEP_TIMEOUT_S: Final = 300
JOB_LIST_MAX_LIMIT: Final = 200
JOB_LIST_DEFAULT_LIMIT: Final = 50
API_KEY_PREFIX: Final = "fb_"
SWEEP_ADVISORY_LOCK_ID: Final = 0x666C6F77

TASK_SEND_NOTICE: Final = "flowbeat.send_notice"
DIFF_PAGE_MAX_LIMIT: Final = 1000
DIFF_PAGE_DEFAULT_LIMIT: Final = 100
RATE_LIMIT_KEY_PREFIX: Final = "flowbeat:ratelimit:"
NCBI_RATE_LIMIT_NAME: Final = "ncbi-eutils"
LITERATURE_HTTP_ATTEMPTS: Final = 4
LITERATURE_RETRY_AFTER_MAX_S: Final = 30.0
NCBI_RATE_WINDOW_S: Final = 1.1
BEAT_LOCK_KEY: Final = "flowbeat:beat-leader"
TRIGGER_SCHEDULE: Final = "schedule"
SCHEDULE_LIST_MAX: Final = 500

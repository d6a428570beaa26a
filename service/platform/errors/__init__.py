"""Domain errors with stable machine codes; the API maps codes to HTTP status in one place.

One package, a module per family that only one concern raises (``imports``: the refusals of
the pipeline import policy); the rest are here."""

from typing import Any


class FlowbeatError(Exception):
    code = "internal_error"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class ProfileInvalid(FlowbeatError):
    """A profile failed validation; details name the file, the step and the field."""

    code = "profile_invalid"


class ProfileNotFound(FlowbeatError):
    code = "pipeline_not_found"


class ParamsInvalid(FlowbeatError):
    code = "params_invalid"


class PayloadInvalid(FlowbeatError):
    """A command's JSON option (an approval's or a signal's payload) does not parse; the
    message gives the line and column, as a profile's syntax error does."""

    code = "payload_invalid"


class JobNotFound(FlowbeatError):
    code = "job_not_found"


class JobIdInvalid(FlowbeatError):
    """A job id given to a command is neither a whole id nor at least 8 of its first hex
    digits (``service.engine.jobids``)."""

    code = "job_id_invalid"


class JobIdAmbiguous(FlowbeatError):
    """A short job id that begins more than one job's id; details list some of them."""

    code = "job_id_ambiguous"


class JobExpired(FlowbeatError):
    """The job existed and was pruned by retention; details say when (``pruned_at``)."""

    code = "job_expired"


class JobConflict(FlowbeatError):
    """The job is in a state that refuses the request (e.g. cancelling a finished job)."""

    code = "job_conflict"


class UnknownStep(FlowbeatError):
    code = "unknown_step"


class StepNotFound(FlowbeatError):
    """A step id the job's pipeline does not have, in a path that names one of its steps."""

    code = "step_not_found"


class RerunInvalid(FlowbeatError):
    """A rerun request that cannot apply to this job, e.g. ``only_failed_items`` on a step
    that does not fan out."""

    code = "rerun_invalid"


class PipelineVersionGone(FlowbeatError):
    """The saved pipeline version a job ran was deleted, so it cannot be rerun as it was."""

    code = "pipeline_version_gone"


class NotAwaitingApproval(FlowbeatError):
    code = "not_awaiting_approval"


class AlreadyDecided(FlowbeatError):
    code = "already_decided"


class SignalNotAwaited(FlowbeatError):
    """No step of the job's pipeline waits for a signal of this name (``wait_for``)."""

    code = "signal_not_awaited"


class SignalAlreadyReceived(FlowbeatError):
    """The job holds a signal of this name already: each name is received once."""

    code = "signal_already_received"


class IdempotencyConflict(FlowbeatError):
    """The idempotency key was used before with a different request."""

    code = "idempotency_conflict"


class DuplicateJob(FlowbeatError):
    """A job of the same owner, pipeline and dedupe key is open or ended within its profile's
    ``dedupe.window_s``, and the profile says ``on_duplicate: reject``; details name it."""

    code = "duplicate_job"


class InvalidCursor(FlowbeatError):
    code = "invalid_cursor"


class AuditQueryInvalid(FlowbeatError):
    """A filter of the audit trail that names no moment or no target (a time without a zone)."""

    code = "invalid_query"


class Unauthorized(FlowbeatError):
    code = "unauthorized"


class Forbidden(FlowbeatError):
    code = "forbidden"


class CsrfInvalid(FlowbeatError):
    """A dashboard form POST without its key's token, or from another site's page."""

    code = "csrf_invalid"


class DatabaseUnavailable(FlowbeatError):
    code = "database_unavailable"


class BrokerUnavailable(FlowbeatError):
    code = "broker_unavailable"


class ServersHalfSet(FlowbeatError):
    """One of the two server settings without the other. It is a mistake (a misspelt name, a
    variable not exported), not a request for the embedded default: falling back would put the
    jobs in a database the operator never pointed at, and ``migrate`` would say all is well."""

    code = "settings_incomplete"


class ActionNotFound(FlowbeatError):
    code = "unknown_action"


class ActionError(FlowbeatError):
    """Raised by actions. ``retryable`` tells the engine whether another attempt may succeed."""

    code = "action_failed"

    def __init__(
        self, message: str, details: dict[str, Any] | None = None, *, retryable: bool = True
    ) -> None:
        super().__init__(message, details)
        self.retryable = retryable


class DataFileMissing(ActionError):
    """A file a step names is not in the data store: never retried, since a worker that cannot
    see it now will not later; with workers on several hosts, the sign of a store that is not
    shared (``FLOWBEAT_DATA_STORE``)."""

    code = "data_file_missing"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details, retryable=False)


class StepCancelled(FlowbeatError):
    code = "cancelled"


class ExpressionError(FlowbeatError):
    """A ``${{ ... }}`` reference could not be resolved at run time."""

    code = "bad_reference"


class WaitInvalid(FlowbeatError):
    """A ``wait`` step's ``seconds`` or ``until`` is not a time to wait for: found in a profile
    when written literally, at the step's claim when it comes from a reference."""

    code = "wait_invalid"


class ChildInvalid(FlowbeatError):
    """A ``pipeline.run`` step's ``pipeline``, ``params`` or ``wait`` is not a call: found in a
    profile when written literally, at the step's claim when it comes from a reference."""

    code = "child_invalid"


class PipelineDepthExceeded(FlowbeatError):
    """A ``pipeline.run`` step's child would nest deeper than ``FLOWBEAT_MAX_PIPELINE_DEPTH``."""

    code = "pipeline_depth_exceeded"


class PipelineCycle(FlowbeatError):
    """Saving the pipeline would let it start itself through the ``pipeline.run`` steps of the
    pipelines it calls."""

    code = "pipeline_cycle"


class FanOutTooLarge(FlowbeatError):
    """A for_each step resolved to more items than ``FLOWBEAT_MAX_FANOUT_ITEMS``."""

    code = "fanout_too_large"


class JobTooLarge(FlowbeatError):
    """A for_each step would take its job past ``FLOWBEAT_MAX_JOB_STEPS`` step rows."""

    code = "job_too_large"


class RateLimited(FlowbeatError):
    """A key sent more requests than ``FLOWBEAT_RATE_LIMIT_PER_S`` allows."""

    code = "rate_limited"


class OpenJobsLimit(FlowbeatError):
    """An owner has ``FLOWBEAT_MAX_OPEN_JOBS_PER_OWNER`` jobs still open."""

    code = "open_jobs_limit"


class LabelsInvalid(FlowbeatError):
    """A job's labels break their limits (``service.language.labels``); details name the label."""

    code = "labels_invalid"


class JobFilterInvalid(FlowbeatError):
    """A job filter that cannot be read: a label without ``key:value``, a time without a zone,
    or a bulk action that names no filter at all."""

    code = "job_filter_invalid"


class BulkActionNotFound(FlowbeatError):
    code = "bulk_action_not_found"


class BulkActionConflict(FlowbeatError):
    """A bulk action id given again with another kind, filter or options than its first use."""

    code = "bulk_action_conflict"


class ConditionInvalid(ExpressionError):
    """A condition breaks the grammar or its limits, or compares values of incompatible types.

    A subclass so that code catching ``ExpressionError`` (what does not resolve) also catches
    what cannot be evaluated; the own code tells a client which of the two happened."""

    code = "condition_invalid"


class PipelineReadOnly(FlowbeatError):
    """A shipped profile, or a pipeline another owner shared: it can be run, not changed."""

    code = "pipeline_read_only"


class PipelineNameMismatch(FlowbeatError):
    code = "pipeline_name_mismatch"


class UnsupportedMediaType(FlowbeatError):
    code = "unsupported_media_type"


class InvalidShare(FlowbeatError):
    code = "invalid_share"


class ActionModuleUnimportable(FlowbeatError):
    """A process cannot start with a module of ``FLOWBEAT_ACTION_MODULES`` (or an entry point)
    that does not import; never an API answer, since the API does not start without it."""

    code = "action_module_unimportable"


class RetryLater(Exception):
    """Control flow for task adapters: deliver this message again after ``delay_s``."""

    def __init__(self, delay_s: float, reason: str) -> None:
        super().__init__(reason)
        self.delay_s = delay_s
        self.reason = reason


class StopChain(Exception):
    """Control flow for task adapters: the job is over, drop the rest of this canvas."""


class NoResultItems(FlowbeatError):
    """The job stored no result items: it has no ``result`` block or has not succeeded."""

    code = "no_result_items"


class NotifyUrlInvalid(FlowbeatError):
    code = "notify_url_invalid"


class CronInvalid(FlowbeatError):
    code = "cron_invalid"


class IntervalInvalid(FlowbeatError):
    code = "interval_invalid"


class TimezoneUnknown(FlowbeatError):
    code = "timezone_unknown"


class ScheduleTooFrequent(FlowbeatError):
    """Fires closer together than the operator's minimum interval."""

    code = "schedule_too_frequent"


class ScheduleLimitReached(FlowbeatError):
    """The owner already has as many enabled schedules as the operator allows."""

    code = "schedule_limit_reached"


class ScheduleNotFound(FlowbeatError):
    code = "schedule_not_found"


class ScheduleAmbiguous(FlowbeatError):
    """A pipeline's one-schedule route or command was used while it has several: which one is
    meant is not guessed, the details list their ids and names to choose from."""

    code = "schedule_ambiguous"


class ScheduleNameMismatch(FlowbeatError):
    """A schedule created under one name (the path's) was given another in its body."""

    code = "schedule_name_mismatch"


class ScheduleNameTaken(FlowbeatError):
    """Another schedule of the same owner and pipeline already has this name."""

    code = "schedule_name_taken"


class BackfillInvalid(FlowbeatError):
    """A backfill's range is empty or backwards, reaches into the future, or its
    ``max_active`` is below 1; nothing is stored."""

    code = "backfill_invalid"


class BackfillTooLarge(FlowbeatError):
    """A backfill's range holds more fire times than ``FLOWBEAT_BACKFILL_MAX_FIRES``."""

    code = "backfill_too_large"


class BackfillNotCron(FlowbeatError):
    """Only a cron schedule has fire times of its own to backfill; an ``every`` schedule's
    are anchored at the epoch, not at a calendar a period can be named by."""

    code = "backfill_not_cron"


class BackfillNotFound(FlowbeatError):
    code = "backfill_not_found"


class BackfillConflict(FlowbeatError):
    """A backfill that completed cannot be cancelled."""

    code = "backfill_conflict"


class FlowerAuthRequired(FlowbeatError):
    """Flower would answer anyone: no credentials, and not an unauthenticated loopback."""

    code = "flower_auth_required"


class MetricsTokenRequired(FlowbeatError):
    """A worker or beat exporter off loopback would answer anyone."""

    code = "metrics_token_required"


class McpKeyRequired(FlowbeatError):
    """A stdio MCP server acts as one API key, and none was given."""

    code = "mcp_key_required"


class KeyNotFound(FlowbeatError):
    """No live API key has the prefix given: unknown, or revoked already."""

    code = "key_not_found"


class EgressRefused(ActionError):
    """A request the egress policy does not let out: a step failure never retried."""

    code = "egress_refused"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details, retryable=False)


class EgressSchemeRefused(EgressRefused):
    code = "egress_scheme_refused"


class EgressHostNotAllowed(EgressRefused):
    code = "egress_host_not_allowed"


class EgressAddressRefused(EgressRefused):
    code = "egress_address_refused"


class EgressRedirectRefused(EgressRefused):
    code = "egress_redirect_refused"


class HookNotFound(FlowbeatError):
    code = "hook_not_found"


class HookInvalid(FlowbeatError):
    """A hook's definition: its mapping, secret or pipeline."""

    code = "hook_invalid"


class HookSignatureInvalid(FlowbeatError):
    """A delivery whose signature headers are missing or do not match its body."""

    code = "hook_signature_invalid"


class HookTimestampStale(FlowbeatError):
    """A correctly signed delivery signed too long ago (or ahead): a replay, or a bad clock."""

    code = "hook_timestamp_stale"


class HookPayloadInvalid(FlowbeatError):
    """A delivery's body is not JSON or lacks what the hook's mapping reads."""

    code = "hook_payload_invalid"


class HookDeliverySeen(FlowbeatError):
    code = "hook_delivery_seen"


class TriggerCycle(FlowbeatError):
    """Saving the pipeline would make dependency triggers start each other in a circle."""

    code = "trigger_cycle"


class SecretNotFound(FlowbeatError):
    """A pipeline or job names a secret its owner has none of; ``details.secrets`` names them."""

    code = "secret_not_found"


class AlertNotFound(FlowbeatError):
    code = "alert_not_found"


class AlertRuleInvalid(FlowbeatError):
    """A rule that cannot work as written: a threshold its kind needs or does not take, a URL
    the egress policy would refuse, a secret the owner has none of."""

    code = "alert_rule_invalid"


class AlertRuleManaged(FlowbeatError):
    """The rule comes from ``FLOWBEAT_ALERTS``: only the settings change or remove it."""

    code = "alert_rule_managed"

"""The SQLAlchemy rows, one module per concern that owns them; every caller imports them from
here, and importing any of them loads them all, so the metadata that Alembic and the
foreign keys read is always whole."""

from service.platform.models.alerts import AlertCursorRow, AlertDeliveryRow, AlertRuleRow
from service.platform.models.audit import AuditEventRow
from service.platform.models.base import ApiKeyRow, Base
from service.platform.models.bulk import BulkActionRow
from service.platform.models.catalogue import (
    BackfillRow,
    DependencyFireRow,
    DependencyQueueRow,
    HookDeliveryRow,
    HookRow,
    PipelineRow,
    PipelineTriggerRow,
    PipelineVersionRow,
    ScheduleFireRow,
    ScheduleRow,
)
from service.platform.models.children import ChildCallRow
from service.platform.models.engine import (
    KEYED,
    NO_LABELS,
    OPEN_SHARD_PREDICATE,
    ApprovalRow,
    CompensationRow,
    EventListenerRow,
    JobEventRow,
    JobEventSeqRow,
    JobProfileRow,
    JobRow,
    JobSignalRow,
    PrunedJobRow,
    RateWaitRow,
    ResultItemRow,
    SignalWaitRow,
    StepLogRow,
    StepRoundRow,
    StepRunRow,
)
from service.platform.models.stepcache import StepCacheRow

__all__ = [
    "KEYED",
    "NO_LABELS",
    "OPEN_SHARD_PREDICATE",
    "AlertCursorRow",
    "AlertDeliveryRow",
    "AlertRuleRow",
    "ApiKeyRow",
    "ApprovalRow",
    "AuditEventRow",
    "BackfillRow",
    "Base",
    "BulkActionRow",
    "ChildCallRow",
    "CompensationRow",
    "DependencyFireRow",
    "DependencyQueueRow",
    "EventListenerRow",
    "HookDeliveryRow",
    "HookRow",
    "JobEventRow",
    "JobEventSeqRow",
    "JobProfileRow",
    "JobRow",
    "JobSignalRow",
    "PipelineRow",
    "PipelineTriggerRow",
    "PipelineVersionRow",
    "PrunedJobRow",
    "RateWaitRow",
    "ResultItemRow",
    "ScheduleFireRow",
    "ScheduleRow",
    "SignalWaitRow",
    "StepCacheRow",
    "StepLogRow",
    "StepRoundRow",
    "StepRunRow",
]

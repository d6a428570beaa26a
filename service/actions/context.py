"""What an action sees of the step it runs in."""

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from service.platform.capture import STEP_LOGGER
from service.platform.errors import StepCancelled
from service.platform.settings import Settings


@dataclass
class StepContext:
    """Handed to every action as its first argument.

    ``cancel_event`` is set by the engine's lease-renewal thread when the job is cancelled or the
    lease is lost; long-running actions should poll ``check_cancelled`` or wait via ``sleep`` so
    they stop promptly instead of finishing work nobody will keep.
    """

    job_id: str
    step_id: str
    attempt: int
    shard: int | None
    params: Mapping[str, Any]
    settings: Settings
    cancel_event: threading.Event = field(default_factory=threading.Event)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger(STEP_LOGGER))
    """Lines logged here (and any other ``logging`` call or ``print`` while the action runs)
    are kept with the attempt: ``GET /v1/jobs/{id}/steps/{step_id}/logs``."""
    idempotency_key: str | None = None
    """Set for a compensation: the same on every attempt, so the action can do its undoing
    once even when a killed worker makes it run twice."""

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def check_cancelled(self) -> None:
        if self.cancel_event.is_set():
            raise StepCancelled(f"step {self.step_id} of job {self.job_id} was cancelled")

    def sleep(self, seconds: float) -> None:
        """Sleep that wakes as soon as the step is cancelled, rather than after ``seconds``."""
        self.check_cancelled()
        if self.cancel_event.wait(max(0.0, seconds)):
            self.check_cancelled()

"""What the API refused, with its stable code: ``except FlowbeatApiError as e: e.code``."""

from typing import Any


class FlowbeatApiError(Exception):
    """An answer of 400 or above, read from the API's error envelope."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class JobWaitTimeout(TimeoutError):
    """``jobs.wait`` gave up before the job was final; the job goes on."""

    def __init__(self, job_id: str, status: str, timeout_s: float) -> None:
        super().__init__(f"job {job_id} still {status} after {timeout_s:g}s")
        self.job_id = job_id
        self.status = status

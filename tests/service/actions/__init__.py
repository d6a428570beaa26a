from pathlib import Path
from typing import Any

from service.actions import StepContext
from service.settings import Settings


def make_ctx(*, attempt: int = 1, profiles_dir: Path | None = None, **settings: Any) -> StepContext:
    if profiles_dir is not None:
        settings["profiles_dir"] = profiles_dir
    return StepContext(
        job_id="job-1",
        step_id="step-1",
        attempt=attempt,
        shard=None,
        params={},
        settings=Settings(**settings),
    )

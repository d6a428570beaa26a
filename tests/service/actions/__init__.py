from pathlib import Path
from typing import Any

from service.actions import StepContext
from service.platform.settings import Settings
from tests.conftest import LOCAL_HOSTS


def make_ctx(*, attempt: int = 1, profiles_dir: Path | None = None, **settings: Any) -> StepContext:
    if profiles_dir is not None:
        settings["profiles_dir"] = profiles_dir
    settings.setdefault("egress_allow_http", True)
    settings.setdefault("egress_internal_hosts", LOCAL_HOSTS)
    return StepContext(
        job_id="job-1",
        step_id="step-1",
        attempt=attempt,
        shard=None,
        params={},
        settings=Settings(**settings),
    )

"""Prefect 3's side of ``bench.peers``: the 3-step chain as a flow calling three no-op tasks in
turn, the fan-out as a flow mapping a task over the items on a thread pool of the run's
concurrency and gathering their results in one more task; every result persisted (the flows
and tasks say so, as well as ``PREFECT_RESULTS_PERSIST_BY_DEFAULT``)."""

import os
import time

from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner

CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "2"))


@task(persist_result=True)  # type: ignore[untyped-decorator]
def noop() -> float:
    return time.time()


@flow(persist_result=True)  # type: ignore[untyped-decorator]
def chain() -> float:
    noop()
    noop()
    return float(noop())


@task(persist_result=True)  # type: ignore[untyped-decorator]
def item(index: int) -> int:
    return index


@task(persist_result=True)  # type: ignore[untyped-decorator]
def gather(values: list[int]) -> int:
    return len(values)


@flow(  # type: ignore[untyped-decorator]
    persist_result=True, task_runner=ThreadPoolTaskRunner(max_workers=CONCURRENCY)
)
def fan_out(items: int) -> int:
    return int(gather(item.map(range(items))))

"""``flowbeat rate-limits``: each step rate-limit key's limit, use and waiting steps."""

from typing import Any

from service.cli.app import JsonOption, cli, emit_json, load_settings
from service.cli.tables import print_table


@cli.command("rate-limits")
def rate_limits(as_json: JsonOption = False) -> None:
    """Each key with a grant in its window, a step parked for it, or a limit the settings
    configure: its limit per window, the units used, how many steps wait and when the first
    is due; with ``--json``, the oldest waiting steps of each key as well."""
    from service.engine.ratekeys import rate_keys
    from service.platform.db import sessions_of, unit_of_work
    from service.platform.ratelimit import redis_client

    settings = load_settings()
    with unit_of_work(sessions_of(settings)) as session:
        uses = rate_keys(session, redis_client(settings.broker()), settings, None)
    documents: list[dict[str, Any]] = [
        {
            **vars(use),
            "window_s": round(use.window_s, 3),
            "next_wake_at": None if use.next_wake_at is None else use.next_wake_at.isoformat(),
            "steps": [
                {
                    "job_id": step.job_id,
                    "step_id": step.step_id,
                    "parked_at": step.parked_at.isoformat(),
                    "wake_at": step.wake_at.isoformat(),
                }
                for step in use.steps
            ],
        }
        for use in uses
    ]
    if as_json:
        emit_json({"keys": documents})
        return
    cells = [
        [
            doc["key"],
            f"{doc['limit']} / {doc['window_s']} s",
            str(doc["used"]),
            str(doc["waiting"]),
            doc["next_wake_at"] or "",
            "settings" if doc["configured"] else "steps",
        ]
        for doc in documents
    ]
    headers = ["key", "limit", "used", "waiting", "next due", "set by"]
    print_table(headers, cells, whole={"key"}, keep=["used", "waiting"])

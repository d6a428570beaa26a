"""``flowbeat queues``: what waits in each queue, since when, and which workers take from it."""

from datetime import UTC, datetime
from typing import Any

from service.cli.app import JsonOption, cli, emit_json, load_settings
from service.cli.tables import print_table


@cli.command("queues")
def queues(as_json: JsonOption = False) -> None:
    """Each queue with its depth, the age of its oldest message and its live workers; a queue
    with messages and no worker waits for a worker of its pool (``flowbeat worker --queues``)."""
    from service.platform.brokers import redis_client
    from tasks.broker import queue_states

    settings = load_settings()
    client = redis_client(settings.broker())
    try:
        states = queue_states(client, settings.worker_dead_after_s)
        seconds, _ = client.time()
    finally:
        client.close()
    now = datetime.fromtimestamp(float(seconds), UTC)
    documents: list[dict[str, Any]] = [
        {
            "name": state.name,
            "depth": state.depth,
            "by_priority": state.by_priority,
            "oldest_age_s": None
            if state.oldest_sent is None
            else round(max(0.0, (now - state.oldest_sent).total_seconds()), 1),
            "workers": state.workers,
        }
        for state in states
    ]
    if as_json:
        emit_json({"queues": documents})
        return
    cells = [
        [
            doc["name"],
            str(doc["depth"]),
            " ".join(f"{p}:{n}" for p, n in doc["by_priority"].items()),
            "" if doc["oldest_age_s"] is None else f"{doc['oldest_age_s']} s",
            str(len(doc["workers"])) if doc["workers"] else "none",
        ]
        for doc in documents
    ]
    headers = ["queue", "depth", "by priority", "oldest", "workers"]
    print_table(headers, cells, whole={"queue"}, keep=["depth", "oldest"])

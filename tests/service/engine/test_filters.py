"""The job filter: a label filter is planned for the labels it asks for, however often a
connection has run it, never served from one generic plan blind to how rare a label is."""

from sqlalchemy import text

from service.engine.filters import JobFilter
from service.engine.jobs import list_jobs
from service.engine.runtime import Runtime
from service.platform.db import unit_of_work


def test_a_label_filter_run_again_and_again_on_one_connection_is_never_planned_generically(
    runtime: Runtime,
) -> None:
    with unit_of_work(runtime.sessions) as session:
        for tenant in range(12):
            match = JobFilter(labels={"tenant": f"t{tenant}"}, error_code="http_status")
            list_jobs(session, owner="nobody", match=match, limit=50)
        plans = session.execute(
            text(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%labels @>%'"
            )
        ).all()

    assert plans, "psycopg prepares a statement a connection has run five times"
    assert all(generic == 0 for generic, _ in plans), plans

"""Rules from FLOWBEAT_ALERTS are written into PostgreSQL, those the settings dropped are
removed, and one that cannot work is left out and named while the others apply."""

import uuid

from sqlalchemy import select

from service.alerts.rules import sync_settings_rules
from service.engine.runtime import Runtime
from service.platform.db import unit_of_work
from service.platform.models import AlertRuleRow
from service.platform.settings import AlertRuleSetting
from tests.service.alerts.support import SECRET_NAME, URL, rule


def _names(rt: Runtime, owner: str) -> dict[str, str]:
    with unit_of_work(rt.sessions) as session:
        rows = session.scalars(select(AlertRuleRow).where(AlertRuleRow.owner == owner))
        return {row.name: row.source for row in rows}


def _setting(owner: str, name: str, **body: object) -> AlertRuleSetting:
    fields = {"kind": "job_failed", "url": URL, "secret": SECRET_NAME, **body}
    return AlertRuleSetting.model_validate({"name": name, "owner": owner, **fields})


def test_settings_rules_are_written_replaced_dropped_and_a_bad_one_named(
    runtime: Runtime,
) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    rule(runtime, owner, name="mine")
    first = [_setting(owner, "ops"), _setting(owner, "old")]
    second = [
        _setting(owner, "ops", format="slack"),
        _setting(owner, "mine"),
        _setting(owner, "broken", kind="queue_age"),
    ]

    with unit_of_work(runtime.sessions) as session:
        sync_settings_rules(session, runtime.settings.model_copy(update={"alerts": first}))
    with unit_of_work(runtime.sessions) as session:
        refused = sync_settings_rules(
            session, runtime.settings.model_copy(update={"alerts": second})
        )

    assert _names(runtime, owner) == {"ops": "settings", "mine": "settings"}
    [problem] = refused
    assert "broken" in problem.message and problem.details["field"] == "threshold"

"""The shipped Grafana dashboard and Prometheus alert rules use only metrics that flowbeat
exports, so renaming one cannot silently blank a panel or an alert."""

import json
import re
from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient
from prometheus_client import Counter, Histogram

from service.platform import metrics
from tests.api.conftest import KeyFactory

DOCKER = Path(__file__).resolve().parents[2] / "docker"
METRIC = re.compile(r"\bflowbeat_[a-z_]+\b")
SAMPLE_SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def _exported(client: TestClient, key: str) -> set[str]:
    text = client.get("/metrics", headers={"Authorization": f"Bearer {key}"}).text
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    return families | {f"{name}{suffix}" for name in families for suffix in SAMPLE_SUFFIXES}


def _dashboard_queries() -> list[str]:
    dashboard = json.loads((DOCKER / "grafana" / "flowbeat.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def _alert_rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load((DOCKER / "prometheus" / "alerts.yaml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"]]


def test_every_metric_the_dashboard_and_alerts_query_is_exported(
    client: TestClient, make_key: KeyFactory
) -> None:
    exported = _exported(client, make_key("read"))
    queries = _dashboard_queries() + [str(rule["expr"]) for rule in _alert_rules()]

    used = {name for query in queries for name in METRIC.findall(query)}
    assert used and not used - exported


def test_the_dashboard_panels_have_unique_ids_and_a_prometheus_query_each() -> None:
    dashboard = json.loads((DOCKER / "grafana" / "flowbeat.json").read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(
        panel["targets"] and panel["datasource"]["type"] == "prometheus"
        for panel in dashboard["panels"]
    )


def test_every_alert_names_a_severity_and_a_summary() -> None:
    rules = _alert_rules()
    assert {"FlowbeatNoBeatLeader", "FlowbeatSweeperRepublishing", "FlowbeatQueueWaitGrowing"} <= {
        str(rule["alert"]) for rule in rules
    }
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]


GROUPING = re.compile(r"\bby \(([^)]*)\)")
MATCHER = re.compile(r"([a-z_]+)\s*(?:=~|!~|!=|=)")
HISTOGRAM_LABELS = {"le"}
GAUGE_LABELS = {"flowbeat_jobs": {"status"}, "flowbeat_open_steps": {"status"}}


def _labels_of(name: str) -> set[str]:
    """The labels ``service.platform.metrics`` declares for a family, or the API's scrape-time
    gauges'."""
    for metric in vars(metrics).values():
        if isinstance(metric, Counter | Histogram):
            family = metric._name.removesuffix("_total")
            if name.removesuffix("_total").removesuffix("_bucket").removesuffix("_count") == family:
                extra = HISTOGRAM_LABELS if isinstance(metric, Histogram) else set()
                return set(metric._labelnames) | extra
    return GAUGE_LABELS.get(name, {"queue"} if name == "flowbeat_queue_depth" else set())


def test_every_label_a_query_groups_or_filters_by_is_one_its_metrics_carry() -> None:
    """A label the metric does not have matches nothing: a panel or an alert would stay empty."""
    queries = _dashboard_queries() + [str(rule["expr"]) for rule in _alert_rules()]
    for query in queries:
        carried = set.union(*(_labels_of(name) for name in METRIC.findall(query)))
        used = {
            label.strip()
            for grouping in GROUPING.findall(query)
            for label in grouping.split(",")
            if label.strip()
        } | set(MATCHER.findall(query))
        assert used <= carried, (query, sorted(used - carried))


def test_jobs_finished_are_shown_by_pipeline_trigger_and_status() -> None:
    assert any(
        "flowbeat_jobs_finished_total" in query and "by (pipeline, trigger, status)" in query
        for query in _dashboard_queries()
    )

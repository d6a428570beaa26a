from fastapi.testclient import TestClient


def test_health_ok(client: TestClient) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["version"] and body["uptime_s"] >= 0
    assert body["checks"]["database"]["ok"] and body["checks"]["broker"]["ok"]
    assert "error" not in body["checks"]["database"]


def test_health_degraded_without_broker(broken_broker_client: TestClient) -> None:
    response = broken_broker_client.get("/health")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["database"]["ok"]
    assert not body["checks"]["broker"]["ok"] and body["checks"]["broker"]["error"]


def test_health_degraded_without_database(broken_database_client: TestClient) -> None:
    response = broken_database_client.get("/health")
    assert response.status_code == 503
    assert not response.json()["checks"]["database"]["ok"]


def test_database_down_is_503(broken_database_client: TestClient) -> None:
    headers = {"Authorization": "Bearer fb_abcdefgh_secret"}
    response = broken_database_client.get("/v1/jobs", headers=headers)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "database_unavailable"

"""The API app as the tests drive it: through Starlette's TestClient, on the real stack."""

from fastapi.testclient import TestClient

from service.engine.runtime import Runtime
from service.platform.settings import Settings


def api_client(settings: Settings, runtime: Runtime | None = None) -> TestClient:
    """A client of an app built from ``settings``; server errors come back as 500 answers, as
    a caller would see them, not as exceptions. Use it as a context manager."""
    from api.app import create_app
    from tasks.app import create_celery  # builds the process-wide app: only once stack is up

    app = create_app(settings, runtime=runtime, celery_app=create_celery(settings))
    return TestClient(app, raise_server_exceptions=False)

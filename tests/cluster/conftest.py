"""One deployment on hosts in network namespaces per test process, shared by its scenarios:
building it (PostgreSQL's initdb, the migration, nine processes importing flowbeat) takes
longer than most scenarios. Each scenario leaves it healed and with every process running."""

from collections.abc import Iterator

import pytest

from service.platform.settings import Settings, get_settings
from tests.cluster.deployment import Deployment, deployed
from tests.cluster.network import network, usable
from tests.conftest import TEST_PROFILES, Stack
from tests.e2e.conftest import Client


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    reason = usable()
    if reason is not None:
        pytest.skip(reason)
    with network() as net, deployed(net, tmp_path_factory.mktemp("cluster")) as built:
        yield built


@pytest.fixture(scope="session")
def reader(deployment: Deployment) -> Iterator[Client]:
    """PostgreSQL and Redis read from the root namespace, which no partition cuts off. The
    Celery app the reader imports takes its broker from the environment, so that is the
    cluster's while the session lasts."""
    urls = {
        "FLOWBEAT_DATABASE_URL": deployment.database_url,
        "FLOWBEAT_BROKER_URL": deployment.broker_url,
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in urls.items():
            patch.setenv(name, value)
        get_settings.cache_clear()
        settings = Settings(profiles_dir=TEST_PROFILES, action_modules=["tests.drill_actions"])
        client = Client(Stack(deployment.database_url, deployment.broker_url, "cluster"), settings)
        yield client
        client.close()
    get_settings.cache_clear()


@pytest.fixture
def hosts(deployment: Deployment) -> Iterator[Deployment]:
    """The deployment for one scenario, healed and running again afterwards however it ended."""
    yield deployment
    deployment.net.heal()
    deployment.running()

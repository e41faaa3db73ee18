"""Session fixtures: the real Kafka, etcd and Redis, started once on free ports in a temp dir.

A service whose STREAMTRAIN_KAFKA / STREAMTRAIN_ETCD / STREAMTRAIN_REDIS variable is set is
used as it is instead (an external cluster). Tests isolate themselves by unique names
(`unique`), never by restarting services.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from streamtrain.infra import Endpoints, LocalServices, Ports
from streamtrain.infra.clients import TopicSpec, ensure_topics, etcd_client, redis_client


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    local = LocalServices(tmp_path_factory.mktemp("services"), Ports.free())
    try:
        local.up()
        yield local.endpoints
    finally:
        local.down()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Names no other test uses: topics, job names, key prefixes."""
    return lambda stem: f"{stem}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def topic_factory(services: Endpoints, unique: Callable[[str], str]) -> Callable[..., str]:
    def make(stem: str = "topic", partitions: int = 1, **config: str) -> str:
        name = unique(stem)
        ensure_topics(services, [TopicSpec(name, partitions, config)])
        return name

    return make


@pytest.fixture
def etcd(services: Endpoints):
    client = etcd_client(services)
    yield client
    client.close()


@pytest.fixture
def redis_conn(services: Endpoints):
    client = redis_client(services)
    yield client
    client.close()

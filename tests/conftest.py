"""Session fixtures: the real Kafka, etcd and Redis, started once on free ports in a temp dir,
and a real schema registry for the tests that ask for one.

A service whose STREAMTRAIN_KAFKA / STREAMTRAIN_ETCD / STREAMTRAIN_REDIS / STREAMTRAIN_REGISTRY
variable is set is used as it is instead (an external cluster). Tests isolate themselves by unique names
(`unique`), never by restarting services.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest

from streamtrain.infra import Endpoints, LocalServices, Ports
from streamtrain.infra.clients import TopicSpec, ensure_topics, etcd_client, redis_client
from streamtrain.infra.endpoints import ENV_REGISTRY
from streamtrain.infra.schema_registry import SchemaRegistryServer


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    local = LocalServices(tmp_path_factory.mktemp("services"), Ports.free())
    try:
        local.up()
        yield local.endpoints
    finally:
        local.down()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of Confluent's API on a real schema registry (Apicurio, infra/schema_registry.py),
    started for the tests that need one; STREAMTRAIN_REGISTRY names an external one instead."""
    if external := os.environ.get(ENV_REGISTRY):
        yield external
        return
    server = SchemaRegistryServer(tmp_path_factory.mktemp("registry"), Ports.free().registry)
    try:
        server.start()
        yield server.address
    finally:
        server.stop()


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

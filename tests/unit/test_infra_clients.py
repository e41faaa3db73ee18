"""How the job's topics are replicated when a process creates them (`infra.clients.replication`)."""

from __future__ import annotations

import pytest

from streamtrain.infra.clients import replication
from streamtrain.infra.errors import InfraError
from streamtrain.schemas.config import JobConfig, JobConfigError


@pytest.mark.parametrize("brokers, factor, min_insync, want", [
    (1, 0, 0, (1, 1)),  # one local broker: nothing else can work
    (2, 0, 0, (2, 2)),
    (3, 0, 0, (3, 2)),
    (5, 0, 0, (3, 2)),
    (5, 5, 0, (5, 2)),
    (5, 0, 3, (3, 3)),
])
def test_defaults_follow_the_cluster_and_settings_win(brokers, factor, min_insync, want) -> None:
    assert replication(brokers, factor, min_insync) == want


@pytest.mark.parametrize("brokers, factor, min_insync, words", [
    (1, 3, 0, "needs that many brokers"),
    (1, 0, 2, "above the replication factor"),
])
def test_a_replication_the_cluster_cannot_give_is_refused(brokers, factor, min_insync, words) -> None:
    with pytest.raises(InfraError, match=words):
        replication(brokers, factor, min_insync)


def test_the_job_file_names_the_replication_and_refuses_one_that_acknowledges_nothing() -> None:
    base = '[job]\nname = "j"\n[input]\ntopics = ["t"]\n'
    assert JobConfig.from_toml(base).kafka.replication_factor == 0
    config = JobConfig.from_toml(base + "[kafka]\nreplication_factor = 3\nmin_insync_replicas = 2\n")
    assert (config.kafka.replication_factor, config.kafka.min_insync_replicas) == (3, 2)
    assert JobConfig.from_json(config.to_json()) == config
    with pytest.raises(JobConfigError, match="kafka.min_insync_replicas"):
        JobConfig.from_toml(base + "[kafka]\nreplication_factor = 2\nmin_insync_replicas = 3\n")
    with pytest.raises(JobConfigError, match="kafka.replication_factor"):
        JobConfig.from_toml(base + "[kafka]\nreplication_factor = -1\n")


def test_several_etcd_endpoints_are_read_each_without_its_scheme(monkeypatch) -> None:
    from streamtrain.infra import Endpoints
    from streamtrain.infra.endpoints import ENV_ETCD, Ports

    monkeypatch.setenv(ENV_ETCD, "http://etcd-0:2379, etcd-1:2379/,https://etcd-2:2380")
    endpoints = Endpoints.overlay_env(Endpoints.local(Ports.default()))
    assert endpoints.etcd == "etcd-0:2379,etcd-1:2379,etcd-2:2380" and "etcd" in endpoints.external
    assert endpoints.etcd_members == [("etcd-0", 2379), ("etcd-1", 2379), ("etcd-2", 2380)]


def test_an_etcd_endpoint_without_a_port_is_named() -> None:
    from streamtrain.infra import Endpoints

    with pytest.raises(ValueError, match="'etcd-1'"):
        Endpoints("k:9092", "etcd-0:2379,etcd-1", "redis://r:6379/0").etcd_members


def test_a_failed_etcd_member_is_left_for_the_next_even_after_its_retry_interval() -> None:
    from pyetcd import exceptions as etcd_exc

    from streamtrain.infra import Endpoints
    from streamtrain.infra.clients import etcd_client

    # Nothing listens on these ports: every call fails at once with UNAVAILABLE.
    client = etcd_client(Endpoints("k:9092", "127.0.0.1:9,127.0.0.1:11,127.0.0.1:13", "redis://r:6379/0"),
                         timeout=2.0)
    tried = []
    for _ in range(3):
        tried.append(client._current_endpoint_label)
        with pytest.raises(etcd_exc.ConnectionFailedError):
            client.get("/k")
        for endpoint in client.endpoints.values():
            endpoint.last_failed = 0  # its retry interval passed, as for a caller polling slowly
    assert sorted(tried) == ["127.0.0.1:11", "127.0.0.1:13", "127.0.0.1:9"]
    client.close()


def test_a_read_tries_every_member_once_before_it_fails() -> None:
    from streamtrain.infra import Endpoints
    from streamtrain.infra.clients import etcd_client
    from streamtrain.jobstate.errors import EtcdError
    from streamtrain.jobstate.etcd import Etcd

    # Nothing listens on these ports: a one-shot reader (the CLI, a scorer) must not be failed
    # by the first dead member while others may be up, so the read goes round them all.
    client = etcd_client(Endpoints("k:9092", "127.0.0.1:9,127.0.0.1:11,127.0.0.1:13", "redis://r:6379/0"),
                         timeout=2.0)
    tried = []
    fetch = client.get
    client.get = lambda key: (tried.append(client._current_endpoint_label), fetch(key))[1]
    etcd = Etcd(client)
    with pytest.raises(EtcdError, match="get /k"):
        etcd.get("/k")
    assert sorted(tried) == ["127.0.0.1:11", "127.0.0.1:13", "127.0.0.1:9"]
    etcd.close()

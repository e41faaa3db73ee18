"""Local services' ports and the endpoints they make (`infra.endpoints`), an etcd of several
members included."""

from __future__ import annotations

import pytest

from streamtrain.infra.endpoints import Endpoints, Ports, record_ports, recorded_ports
from streamtrain.schemas import SchemaError


def test_an_etcd_of_three_members_takes_ports_ten_apart_and_is_one_endpoint_list() -> None:
    ports = Ports.from_base(19092).with_etcd_members(3)
    assert ports.etcd_members == [(19094, 19095), (19104, 19105), (19114, 19115)]
    assert Endpoints.local(ports).etcd == "127.0.0.1:19094,127.0.0.1:19104,127.0.0.1:19114"
    assert ports.with_etcd_members(3) is ports
    assert ports.with_etcd_members(1) == Ports.from_base(19092)
    assert Endpoints.local(Ports.from_base(19092)).etcd == "127.0.0.1:19094"


def test_the_members_are_recorded_with_the_ports(tmp_path) -> None:
    ports = Ports.free(etcd_members=3)
    assert len(set(p for pair in ports.etcd_members for p in pair)) == 6
    record_ports(tmp_path, ports)
    assert recorded_ports(tmp_path) == ports


def test_ports_recorded_before_etcd_had_members_read_as_one(tmp_path) -> None:
    (tmp_path / "services.json").write_text(
        '{"ports": {"kafka": 1, "kafka_controller": 2, "etcd": 3, "etcd_peer": 4, "redis": 5}}')
    assert recorded_ports(tmp_path).etcd_members == [(3, 4)]


@pytest.mark.parametrize("count", [0, 10])
def test_an_etcd_size_out_of_range_is_refused(count) -> None:
    with pytest.raises(ValueError, match=f"an etcd of {count} members"):
        Ports.from_base(19092).with_etcd_members(count)


def test_a_kafka_of_three_brokers_takes_ports_ten_apart_and_is_one_bootstrap_list() -> None:
    ports = Ports.from_base(19092).with_kafka_brokers(3).with_etcd_members(3)
    assert ports.kafka_brokers == [(19092, 19093), (19102, 19103), (19112, 19113)]
    assert Endpoints.local(ports).kafka == "127.0.0.1:19092,127.0.0.1:19102,127.0.0.1:19112"
    every = [p for pair in ports.kafka_brokers + ports.etcd_members for p in pair] + [ports.redis, ports.registry]
    assert len(set(every)) == len(every)  # the two clusters' ports never collide
    assert ports.with_kafka_brokers(1).kafka_brokers == [(19092, 19093)]


def test_free_ports_for_both_clusters_are_distinct_and_recorded(tmp_path) -> None:
    ports = Ports.free(etcd_members=3, kafka_brokers=3)
    assert len(ports.etcd_members) == 3 and len(ports.kafka_brokers) == 3
    every = [p for pair in ports.kafka_brokers + ports.etcd_members for p in pair]
    assert len(set(every)) == 12
    record_ports(tmp_path, ports)
    assert recorded_ports(tmp_path) == ports


@pytest.mark.parametrize("count", [0, 10])
def test_a_kafka_size_out_of_range_is_refused(count) -> None:
    with pytest.raises(ValueError, match=f"a Kafka of {count} brokers"):
        Ports.from_base(19092).with_kafka_brokers(count)


def test_a_single_nodes_ports_are_recorded_as_older_versions_wrote_them(tmp_path) -> None:
    record_ports(tmp_path, Ports.from_base(19092))
    assert "_more" not in (tmp_path / "services.json").read_text()
    assert recorded_ports(tmp_path) == Ports.from_base(19092)


def test_recorded_ports_of_an_unknown_version_are_refused_naming_the_file(tmp_path) -> None:
    record_ports(tmp_path, Ports.from_base(19092))
    path = tmp_path / "services.json"
    path.write_text(path.read_text().replace('"v": 1', '"v": 2'))
    with pytest.raises(SchemaError, match="unknown version 2") as caught:
        recorded_ports(tmp_path)
    assert str(path) in str(caught.value)


def test_a_redis_cluster_is_recorded_with_the_ports(tmp_path) -> None:
    ports = Ports.from_base(19092).with_redis_cluster(3)
    record_ports(tmp_path, ports)
    assert recorded_ports(tmp_path) == ports

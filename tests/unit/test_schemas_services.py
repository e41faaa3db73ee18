"""services.json (schemas/services.py): round trips, files written before it had a version, and
errors that name the field and the file."""

from __future__ import annotations

import json

import pytest

from streamtrain.schemas import SchemaError, ServicePorts

SINGLE = ServicePorts(19092, 19093, 19094, 19095, 19096, 19097)
CLUSTERS = ServicePorts(19092, 19093, 19094, 19095, 19096, 19097, etcd_more=((19104, 19105), (19114, 19115)),
                        kafka_more=((19102, 19103),), redis_cluster=((19096, 19101), (19106, 19111)))


@pytest.mark.parametrize("ports", [SINGLE, CLUSTERS], ids=["single", "clusters"])
def test_ports_round_trip_through_the_file_and_are_versioned(ports, tmp_path) -> None:
    assert ServicePorts.from_json(ports.to_json()) == ports
    ports.write(tmp_path / "services.json")
    assert ServicePorts.read(tmp_path / "services.json") == ports
    assert json.loads((tmp_path / "services.json").read_text())["v"] == 1
    assert not (tmp_path / "services.json.tmp").exists()


def test_a_single_nodes_file_leaves_the_empty_lists_out_and_pairs_read_back_as_tuples() -> None:
    assert set(json.loads(SINGLE.to_json())["ports"]) == {"kafka", "kafka_controller", "etcd", "etcd_peer",
                                                          "redis", "registry"}
    assert ServicePorts(1, 2, 3, 4, 5, 6, etcd_more=[[7, 8]]).etcd_more == ((7, 8),)


def test_a_file_without_a_version_reads_as_version_1(tmp_path) -> None:
    path = tmp_path / "services.json"
    # As `streamtrain up` wrote it before the version, and before the registry had a port.
    path.write_text(json.dumps({"ports": {"kafka": 1, "kafka_controller": 2, "etcd": 3, "etcd_peer": 4,
                                          "redis": 5, "etcd_more": [[13, 14]]}}, indent=2))
    assert ServicePorts.read(path) == ServicePorts(1, 2, 3, 4, 5, 6, etcd_more=((13, 14),))


def test_no_file_is_no_ports(tmp_path) -> None:
    assert ServicePorts.read(tmp_path / "services.json") is None


def test_a_file_of_an_unknown_version_is_refused_naming_the_file(tmp_path) -> None:
    path = tmp_path / "services.json"
    path.write_text(json.dumps({"v": 2, "ports": {}}))
    with pytest.raises(SchemaError) as caught:
        ServicePorts.read(path)
    assert (caught.value.format, caught.value.field) == ("ServicePorts", "v")
    assert "unknown version 2" in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize("doc, field", [
    ({"v": 1}, "ports"),
    ({"v": 1, "ports": {"kafka": 1, "kafka_controller": 2, "etcd": 3, "etcd_peer": 4}}, "ports.redis"),
    ({"v": 1, "ports": {"kafka": 1, "kafka_controller": 2, "etcd": "3", "etcd_peer": 4, "redis": 5}}, "ports.etcd"),
    ({"v": 1, "ports": {"kafka": 0, "kafka_controller": 2, "etcd": 3, "etcd_peer": 4, "redis": 5}}, "ports.kafka"),
    ({"v": 1, "ports": {"kafka": 1, "kafka_controller": 2, "etcd": 3, "etcd_peer": 4, "redis": 65535}},
     "ports.registry"),
    ({"v": 1, "ports": {"kafka": 1, "kafka_controller": 2, "etcd": 3, "etcd_peer": 4, "redis": 5,
                        "kafka_more": [[11]]}}, "ports.kafka_more[0]"),
    ({"v": 1, "ports": {"kafka": 1, "kafka_controller": 2, "etcd": 3, "etcd_peer": 4, "redis": 5,
                        "redis_cluster": [[5, 70000]]}}, "ports.redis_cluster[0][1]"),
    ({"v": 1, "ports": {"kafka": 1, "kafka_controller": 2, "etcd": 3, "etcd_peer": 4, "redis": 5,
                        "etcd_more": {}}}, "ports.etcd_more"),
])
def test_a_malformed_file_names_the_field_and_the_file(doc, field, tmp_path) -> None:
    path = tmp_path / "services.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SchemaError) as caught:
        ServicePorts.read(path)
    assert caught.value.field == field and str(path) in str(caught.value), caught.value


def test_a_file_that_is_not_json_names_the_file(tmp_path) -> None:
    path = tmp_path / "services.json"
    path.write_text('{"ports": {')
    with pytest.raises(SchemaError, match="services.json") as caught:
        ServicePorts.read(path)
    assert caught.value.field == "$"

"""The broker's runtime is resolved from the pom shipped in the package, wherever it is run from."""

import subprocess
import sys


def test_the_pom_is_found_outside_the_repository(tmp_path):
    # Run from an empty directory: a lookup by a top-level name ("infra") only worked from the
    # repository's root, where the folder shadows the installed package.
    code = "from streamtrain.infra.kafka_broker import _pom_text; print(b'kafka_2.13' in _pom_text())"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def _properties(broker) -> dict[str, str]:
    return dict(line.split("=", 1) for line in broker._server_properties().splitlines())


def test_a_cluster_of_three_nodes_is_one_quorum_with_replicated_internal_topics(tmp_path):
    from streamtrain.infra.cluster import kafka_brokers
    from streamtrain.infra.endpoints import Ports

    brokers = kafka_brokers(tmp_path, Ports.from_base(19092).with_kafka_brokers(3))
    assert list(brokers) == ["kafka", "kafka-1", "kafka-2"]
    props = [_properties(b) for b in brokers.values()]
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    voters = "1@127.0.0.1:19093,2@127.0.0.1:19103,3@127.0.0.1:19113"
    assert all(p["controller.quorum.voters"] == voters for p in props)
    assert props[1]["listeners"] == "PLAINTEXT://127.0.0.1:19102,CONTROLLER://127.0.0.1:19103"
    assert all(p["transaction.state.log.replication.factor"] == "3" and p["transaction.state.log.min.isr"] == "2"
               and p["offsets.topic.replication.factor"] == "3" for p in props)
    single = _properties(kafka_brokers(tmp_path / "one", Ports.from_base(19092))["kafka"])
    assert single["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert single["transaction.state.log.replication.factor"] == "1" and single["transaction.state.log.min.isr"] == "1"


def test_the_nodes_of_a_cluster_share_the_first_cluster_id_written(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from streamtrain.infra.kafka_broker import shared_cluster_id

    path = tmp_path / "kafka" / "cluster.id"
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: shared_cluster_id(path), range(32)))
    assert len(ids) == 1
    (found,) = ids
    assert len(found) == 22 and shared_cluster_id(path) == found  # Kafka's base64 UUID, kept
    assert [p.name for p in path.parent.iterdir()] == ["cluster.id"]  # no staged copy left behind


def test_a_new_cluster_id_never_reads_as_an_option(monkeypatch):
    import uuid

    from streamtrain.infra import kafka_broker

    # The first draw encodes to "-..." (0xf8: the 62nd base64url digit, "-", first).
    draws = iter([uuid.UUID(bytes=b"\xf8" + b"\0" * 15), uuid.UUID(int=1)])
    monkeypatch.setattr(kafka_broker.uuid, "uuid4", lambda: next(draws))
    assert kafka_broker.new_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAQ"


def test_up_refuses_another_count_of_brokers_than_the_data_dirs_hold(tmp_path, monkeypatch):
    import pytest

    from streamtrain.infra import InfraError, LocalServices
    from streamtrain.infra.endpoints import ENV_KAFKA, Ports

    monkeypatch.delenv(ENV_KAFKA, raising=False)
    for node in ("kafka", "kafka-1"):  # two of three nodes' data left, services.json gone
        (tmp_path / node / "logs").mkdir(parents=True)
        (tmp_path / node / "logs" / "meta.properties").write_text("node.id=1\n")
    with pytest.raises(InfraError, match="kafka in .* has data of 2 node"):
        LocalServices(tmp_path, Ports.from_base(19092).with_kafka_brokers(3))._check_nodes()
    with pytest.raises(InfraError, match="has data of 2 node"):
        LocalServices(tmp_path, Ports.from_base(19092))._check_nodes()
    (tmp_path / "kafka-2" / "logs").mkdir(parents=True)
    (tmp_path / "kafka-2" / "logs" / "meta.properties").write_text("node.id=3\n")
    LocalServices(tmp_path, Ports.from_base(19092).with_kafka_brokers(3))._check_nodes()

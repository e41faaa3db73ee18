"""Each real service answers the operations streamtrain is built on."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from streamtrain.infra import Endpoints

pytestmark = pytest.mark.services


def test_kafka_transaction_is_visible_to_read_committed_consumer_only_after_commit(
    services: Endpoints, topic_factory, unique
) -> None:
    topic = topic_factory("smoke", partitions=2)
    producer = Producer({"bootstrap.servers": services.kafka,
                         "transactional.id": unique("smoke-tx")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=f"m{i}".encode(), partition=i % 2)
    producer.commit_transaction(30)

    producer.begin_transaction()
    producer.produce(topic, value=b"aborted", partition=0)
    producer.abort_transaction(30)

    consumer = Consumer({"bootstrap.servers": services.kafka, "group.id": unique("g"),
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    seen: list[bytes] = []
    for _ in range(50):
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            seen.append(msg.value())
        if len(seen) == 10:
            break
    for _ in range(5):  # the aborted message must never show up
        msg = consumer.poll(0.2)
        assert msg is None or msg.error() or msg.value() != b"aborted"
    consumer.close()
    assert sorted(seen) == sorted(f"m{i}".encode() for i in range(10))


def test_etcd_lease_txn_and_watch(etcd, unique) -> None:
    prefix = f"/smoke/{unique('p')}/"
    lease = etcd.lease(5)
    etcd.put(prefix + "member", b"alive", lease=lease)

    events = []
    watched = threading.Event()
    iterator, cancel = etcd.watch_prefix(prefix + "w/")

    def watch() -> None:
        for event in iterator:
            events.append(event)
            watched.set()
            cancel()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()

    # Compare-and-swap: succeeds while the leased key exists, fails on a stale version.
    ok, _ = etcd.transaction(
        compare=[etcd.transactions.version(prefix + "member") > 0],
        success=[etcd.transactions.put(prefix + "w/a", b"1")],
        failure=[],
    )
    assert ok
    ok, _ = etcd.transaction(
        compare=[etcd.transactions.version(prefix + "w/a") == 0],
        success=[etcd.transactions.put(prefix + "w/a", b"2")],
        failure=[],
    )
    assert not ok
    assert watched.wait(5)
    assert events[0].key == (prefix + "w/a").encode() and events[0].value == b"1"

    lease.revoke()
    assert etcd.get(prefix + "member")[0] is None


def test_redis_pipeline_round_trip(redis_conn, unique) -> None:
    prefix = unique("st:smoke")
    with redis_conn.pipeline(transaction=False) as pipe:
        for i in range(100):
            pipe.set(f"{prefix}:{i}", i.to_bytes(4, "little"))
        pipe.execute()
    values = redis_conn.mget([f"{prefix}:{i}" for i in range(100)])
    assert [int.from_bytes(v, "little") for v in values] == list(range(100))


def test_an_etcd_client_of_several_members_fails_over_past_one_that_is_down(services: Endpoints, unique) -> None:
    import socket
    from dataclasses import replace

    from streamtrain.jobstate.errors import EtcdError
    from streamtrain.jobstate.etcd import Etcd

    with socket.socket() as s:  # a port nothing listens on: a member that is down
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]
    etcd = Etcd.connect(replace(services, etcd=f"127.0.0.1:{down},{services.etcd}"), timeout=2)
    key = unique("/failover/")

    def put(value: bytes) -> bool:
        try:
            etcd.put(key, value)
            return True
        except EtcdError:  # the member that is down, if it was tried first: marked failed
            return False

    try:
        assert put(b"0") or put(b"0")
        for i in range(1, 20):  # the live member serves from then on
            assert put(str(i).encode())
        assert etcd.get(key).value == b"19"
    finally:
        etcd.close()

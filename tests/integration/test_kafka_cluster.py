"""A job on a 3-broker Kafka (as `streamtrain up --kafka-brokers 3` makes it) whose busiest
broker is SIGKILLed mid-job: the job's topics are created with three replicas and
min.insync.replicas 2, every producer asks for all of them, the clients move to the new
leaders, and by ledger nothing is lost or applied twice. The job reads its topic online and
half the examples are written after the kill, so the job cannot have ended before it."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest

from conftest import wait_for
from streamtrain import JobConfig, LocalJob
from streamtrain.infra import InfraError, LocalServices, Ports
from streamtrain.infra.clients import TopicSpec, ensure_topics, kafka_admin
from streamtrain.infra.endpoints import ENV_ETCD, ENV_REDIS
from streamtrain.schemas import Topics
from test_trainer import MODEL, all_done, applied_exactly, make_job, write_examples

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture
def kafka_cluster(services, tmp_path, monkeypatch) -> Iterator[LocalServices]:
    """Three brokers started by `LocalServices.up`; etcd and Redis are the session's, named
    as external so that only Kafka is started here."""
    monkeypatch.setenv(ENV_ETCD, services.etcd)
    monkeypatch.setenv(ENV_REDIS, services.redis)
    local = LocalServices(tmp_path / "cluster", Ports.free(kafka_brokers=3))
    try:
        local.up()
        yield local
    finally:
        local.down()


def test_a_job_goes_on_through_a_brokers_death(services, kafka_cluster, redis_conn, unique, tmp_path) -> None:
    statuses = {s.name: s for s in kafka_cluster.status()}
    brokers = [statuses[n] for n in ("kafka", "kafka-1", "kafka-2")]
    assert all(b.healthy and not b.external for b in brokers), statuses
    endpoints = replace(services, kafka=kafka_cluster.endpoints.kafka)
    assert endpoints.kafka == ",".join(b.address for b in brokers)

    topic = unique("brokerdeath")
    ensure_topics(endpoints, [TopicSpec(topic, 2)])  # the defaults: 3 replicas, 2 in sync
    examples = [e.to_json() for e in MODEL.examples(40_000)]
    first = write_examples(endpoints, topic, examples[:20_000], 2)
    config = JobConfig.from_json(make_job(unique("brokerdeath"), topic, tmp_path, passes=0, max_records=500).to_json())

    with LocalJob(config, trainers=2, endpoints=endpoints, log_dir=tmp_path / "logs") as job:
        wait_for(lambda: job.status().examples > 0, 90, "training under way")
        grads = [Topics(config.name).grad(s) for s in range(2)]
        replicas = _replicas(endpoints, [topic, *grads])
        assert all(r == (3, 2) for r in replicas.values()), replicas
        busiest = partition_leaders(endpoints, [topic, *grads]).most_common(1)[0][0]
        victim = kafka_cluster.servers["kafka" if busiest == 1 else f"kafka-{busiest - 1}"]
        os.kill(victim.pid(), signal.SIGKILL)
        more = write_examples(endpoints, topic, examples[20_000:], 2)  # through the leaders left
        written = {p: first[p] + more[p] for p in first}
        wait_for(lambda: applied_exactly(redis_conn, config.name, written, topic), 240, "every example applied once")
        wait_for(lambda: all_done(job.status(), written), 60, "each task's metrics once, no task left")

    result = job.result
    assert result is not None and result.tasks.get("todo") == 0 and result.tasks.get("pending") == 0, result

    # The nodes keep their controller quorum in their data: `up` with one broker refuses it.
    kafka_cluster.down()
    with pytest.raises(InfraError, match="has data of 3 node"):
        LocalServices(kafka_cluster.home, replace(kafka_cluster.ports, kafka_more=())).up()


def partition_leaders(endpoints, topics: list[str]) -> Counter[int]:
    """Partitions led, by node id."""
    found = kafka_admin(endpoints).list_topics(timeout=10).topics
    return Counter(p.leader for t in topics for p in found[t].partitions.values())


def _replicas(endpoints, topics: list[str]) -> dict[str, tuple[int, int]]:
    """Each topic's (replicas of its first partition, min.insync.replicas)."""
    from confluent_kafka.admin import ConfigResource

    admin = kafka_admin(endpoints)
    found = admin.list_topics(timeout=10).topics
    configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics])
    return {resource.name: (len(found[resource.name].partitions[0].replicas),
                            int(future.result(10)["min.insync.replicas"].value))
            for resource, future in configs.items()}

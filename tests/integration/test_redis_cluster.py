"""A job on a Redis Cluster of three masters with a replica each (as `streamtrain up
--redis-cluster 3` makes it) whose master holding shard 0's keys is SIGKILLed mid-job: its
replica takes over within the node timeout, pulls and publishes find the new master, and by
ledger nothing is lost or applied twice; the parameters the job leaves in the cluster score
the holdout as well as one process trained on the same examples.

The job reads its topic online and half the examples are written only after the kill, so the
job cannot have ended before it (a bounded job of 40,000 examples sometimes had)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import replace

import pytest

from conftest import wait_for
from streamtrain import JobConfig, LocalJob
from streamtrain.infra import InfraError, LocalServices, Ports
from streamtrain.infra.clients import TopicSpec, ensure_topics, redis_client
from streamtrain.infra.endpoints import ENV_ETCD, ENV_KAFKA
from streamtrain.schemas import RedisKeys
from test_trainer import MODEL, all_done, applied_exactly, job_and_one_process_auc, make_job, write_examples

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture
def redis_cluster(services, tmp_path, monkeypatch) -> Iterator[LocalServices]:
    """Six Redis nodes made one cluster by `LocalServices.up`; Kafka and etcd are the
    session's, named as external so that only Redis is started here."""
    monkeypatch.setenv(ENV_KAFKA, services.kafka)
    monkeypatch.setenv(ENV_ETCD, services.etcd)
    local = LocalServices(tmp_path / "cluster", Ports.free(redis_masters=3))
    try:
        local.up()
        yield local
    finally:
        local.down()


def test_a_job_goes_on_through_a_redis_masters_death(services, redis_cluster, unique, tmp_path) -> None:
    statuses = {s.name: s for s in redis_cluster.status()}
    nodes = [statuses["redis"], *(statuses[f"redis-{i}"] for i in range(1, 6))]
    assert all(n.healthy and not n.external for n in nodes), statuses
    endpoints = replace(services, redis=redis_cluster.endpoints.redis)
    assert endpoints.redis.startswith("redis+cluster://")
    client = redis_client(endpoints)
    info = client.cluster_info()
    assert (int(info["cluster_size"]), int(info["cluster_known_nodes"])) == (3, 6), info  # 3 masters, a replica each

    topic = unique("redisdeath")
    ensure_topics(endpoints, [TopicSpec(topic, 2)])
    train = MODEL.examples(40_000)
    first = write_examples(endpoints, topic, [e.to_json() for e in train[:20_000]], 2)
    config = JobConfig.from_json(make_job(unique("redisdeath"), topic, tmp_path, passes=0, max_records=500).to_json())
    keys = RedisKeys(config.name)
    try:
        with LocalJob(config, trainers=2, endpoints=endpoints, log_dir=tmp_path / "logs") as job:
            wait_for(lambda: job.status().examples > 0, 90, "training under way")
            port = client.get_node_from_key(keys.version(0)).port
            victim = next(s for name, s in redis_cluster.servers.items() if name.startswith("redis") and s.port == port)
            os.kill(victim.pid(), signal.SIGKILL)
            more = write_examples(endpoints, topic, [e.to_json() for e in train[20_000:]], 2)
            written = {p: first[p] + more[p] for p in first}
            wait_for(lambda: serving_port(client, keys.version(0)) != port, 30,
                     "shard 0's slot served by the promoted replica", interval=0.5)
            wait_for(lambda: applied_exactly(client, config.name, written, topic), 240, "every example applied once")
            wait_for(lambda: all_done(job.status(), written), 60, "each task's metrics once, no task left")
        result = job.result
        assert result is not None and result.tasks.get("todo") == 0 and result.tasks.get("pending") == 0, result

        distributed, single = job_and_one_process_auc(endpoints, client, config, train)
        assert abs(distributed - single) < 0.01, (distributed, single)
    finally:
        client.close()

    # The nodes keep their cluster in nodes.conf: `up` with a single Redis refuses it.
    redis_cluster.down()
    with pytest.raises(InfraError, match="has data of 6 node"):
        LocalServices(redis_cluster.home, replace(redis_cluster.ports, redis_cluster=())).up()


def serving_port(client, key: str) -> int | None:
    """The port of the master serving `key` as the cluster says now (None: no node answered)."""
    try:
        client.nodes_manager.initialize()
    except Exception:  # noqa: BLE001  mid-failover
        return None
    return client.get_node_from_key(key).port

"""A job on the local cluster profile, `streamtrain up --kafka-brokers 3 --etcd-members 3
--redis-cluster 3`: the broker leading most of the job's partitions, then the etcd leader, then
the Redis master holding shard 0's keys are SIGKILLed mid-job, none restarted. Records keep
arriving between the kills (the job reads its topic online), and the job trains each batch of
them on what is left before the next kill. By ledger every example is applied once, each task's
metrics count once, and the parameters left in the Redis Cluster score the holdout as well as
one process trained on the same examples."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from conftest import wait_for
from streamtrain import JobConfig, LocalJob
from streamtrain.infra import LocalServices, Ports
from streamtrain.infra.clients import TopicSpec, ensure_topics, redis_client
from streamtrain.infra.endpoints import ENV_ETCD, ENV_KAFKA, ENV_REDIS
from streamtrain.infra.etcd_server import is_leader
from streamtrain.schemas import RedisKeys, Topics
from test_kafka_cluster import partition_leaders
from test_redis_cluster import serving_port
from test_trainer import MODEL, all_done, applied_exactly, job_and_one_process_auc, make_job, write_examples

pytestmark = [pytest.mark.services, pytest.mark.slow]

BATCH = 15_000  # records written before the first kill and after each


def where_it_stands(job: LocalJob, written: dict[int, int]) -> str:
    """The job's counts, and the newest warnings and errors of each of its processes."""
    status = job.status()
    lines = [f"examples in metrics {status.examples} of {sum(written.values())} written; queues {status.queues}"]
    for log in sorted(job.log_dir.glob("*.log")):
        worth = [line for line in log.read_text(errors="replace").splitlines()
                 if any(word in line for word in ("WARNING", "ERROR", "Error", "Traceback", "lost", "fail"))]
        lines += [f"{log.name}: {line[:300]}" for line in worth[-8:]]
    return "\n".join(lines)


@pytest.fixture
def clusters(tmp_path, monkeypatch) -> Iterator[LocalServices]:
    for env in (ENV_KAFKA, ENV_ETCD, ENV_REDIS):
        monkeypatch.delenv(env, raising=False)
    local = LocalServices(tmp_path / "clusters", Ports.free(kafka_brokers=3, etcd_members=3, redis_masters=3))
    try:
        local.up()
        yield local
    finally:
        local.down()


def test_a_job_goes_on_through_a_death_in_each_cluster(clusters, unique, tmp_path) -> None:
    names = {s.name for s in clusters.status() if s.healthy and not s.external}
    assert {"kafka-2", "etcd-2", "redis-5"} <= names, names
    endpoints = clusters.endpoints
    topic = unique("clusters")
    ensure_topics(endpoints, [TopicSpec(topic, 2)])
    train = MODEL.examples(4 * BATCH)
    batches = [[e.to_json() for e in train[i * BATCH:(i + 1) * BATCH]] for i in range(4)]
    config = JobConfig.from_json(make_job(unique("clusters"), topic, tmp_path, passes=0, max_records=500).to_json())
    client = redis_client(endpoints)
    written: dict[int, int] = {0: 0, 1: 0}

    def write(batch: list[bytes]) -> None:
        for p, n in write_examples(endpoints, topic, batch, 2).items():
            written[p] += n

    def kill_broker() -> str:
        busiest = partition_leaders(endpoints, [topic, *(Topics(config.name).grad(s) for s in range(2))])
        name = "kafka" if (node := busiest.most_common(1)[0][0]) == 1 else f"kafka-{node - 1}"
        os.kill(clusters.servers[name].pid(), signal.SIGKILL)
        return name

    def kill_etcd_leader() -> str:
        name = next(n for n, s in clusters.servers.items() if n.startswith("etcd") and is_leader(s.address))
        os.kill(clusters.servers[name].pid(), signal.SIGKILL)
        return name

    def kill_redis_master() -> str:
        port = client.get_node_from_key(RedisKeys(config.name).version(0)).port
        name = next(n for n, s in clusters.servers.items() if n.startswith("redis") and s.port == port)
        os.kill(clusters.servers[name].pid(), signal.SIGKILL)
        wait_for(lambda: serving_port(client, RedisKeys(config.name).version(0)) not in (None, port), 30,
                 "shard 0's slot served by the promoted replica", interval=0.5)
        return name

    try:
        write(batches[0])
        with LocalJob(config, trainers=2, endpoints=endpoints, log_dir=tmp_path / "logs") as job:
            wait_for(lambda: job.status().examples > 0, 120, "training under way")
            killed = []
            for i, kill in enumerate((kill_broker, kill_etcd_leader, kill_redis_master), start=1):
                killed.append(kill())
                write(batches[i])
                # Trained past what was written before this kill: the job went on without the node.
                wait_for(lambda i=i: job.status().examples > i * BATCH, 120, f"training after {killed[-1]}'s death")
            wait_for(lambda: applied_exactly(client, config.name, written, topic), 120, "every example applied once")
            # As long as the other waits: a task whose end's heartbeat etcd did not answer is
            # dropped, and waits out its 30 s timeout before it is trained again.
            wait_for(lambda: all_done(job.status(), written), 120, "each task's metrics once, no task left",
                     detail=lambda: where_it_stands(job, written))
        result = job.result
        assert result is not None and result.tasks.get("todo") == 0 and result.tasks.get("pending") == 0, result
        assert [n.split("-")[0] for n in killed] == ["kafka", "etcd", "redis"], killed

        distributed, single = job_and_one_process_auc(endpoints, client, config, train)
        assert abs(distributed - single) < 0.01, (distributed, single)
    finally:
        client.close()

"""A job on a 3-member etcd cluster whose leader is SIGKILLed mid-job: the job's clients fail
over to the other members, leases and the master's lock hold through the election (a standby
master stays a standby, or takes over fenced), and by ledger nothing is lost or applied twice.
The job reads its topic online and half the examples are written after the kill, so the job
cannot have ended before it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import wait_for
from streamtrain import JobConfig, LocalJob
from streamtrain.infra import InfraError, LocalServices, Ports
from streamtrain.infra.clients import etcd_client
from streamtrain.infra.cluster import etcd_members
from streamtrain.infra.endpoints import ENV_KAFKA, ENV_REDIS
from streamtrain.infra.etcd_server import EtcdServer, is_leader
from test_trainer import MODEL, all_done, applied_exactly, make_job, write_examples

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[list[EtcdServer]]:
    """Three members as `streamtrain up --etcd-members 3` makes them, on free ports."""
    members = list(etcd_members(tmp_path, Ports.free(etcd_members=3)).values())
    try:
        # Together: a member is healthy only once a quorum is up.
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda m: m.start(), members))
        yield members
    finally:
        for m in members:
            m.stop()


def test_a_job_goes_on_through_the_etcd_leaders_death(services, etcd_cluster, redis_conn, topic_factory,
                                                      unique, tmp_path) -> None:
    topic = topic_factory("etcdleader", partitions=2)
    examples = [e.to_json() for e in MODEL.examples(40_000)]
    first = write_examples(services, topic, examples[:20_000], 2)
    config = JobConfig.from_json(make_job(unique("etcdleader"), topic, tmp_path, passes=0, max_records=500).to_json())
    endpoints = replace(services, etcd=",".join(m.address for m in etcd_cluster))

    logs = tmp_path / "logs"
    with LocalJob(config, trainers=2, endpoints=endpoints, log_dir=logs) as job:
        # The job's own master leads first: started beside it, forked warm, either could win.
        wait_for(lambda: "became leader" in read(logs / "master.log"), 60, "the job's master to lead")
        job.add("master-standby", ["master", "--job", str(job.job_file)])
        wait_for(lambda: "standby:" in read(logs / "master-standby.log"), 60, "the second master to stand by")
        wait_for(lambda: job.status().examples > 0, 60, "training under way")
        leader = next(m for m in etcd_cluster if is_leader(m.address))
        os.kill(leader.pid(), signal.SIGKILL)
        more = write_examples(services, topic, examples[20_000:], 2)
        written = {p: first[p] + more[p] for p in first}
        wait_for(lambda: applied_exactly(redis_conn, config.name, written, topic), 180, "every example applied once")
        wait_for(lambda: all_done(job.status(), written), 60, "each task's metrics once, no task left")

    result = job.result
    assert result is not None and result.tasks.get("todo") == 0 and result.tasks.get("pending") == 0, result
    # One leader at a time: the standby leads only if the first lost the lock (its lease ran out
    # during the election), and then the first never led again.
    leaders = [read(logs / f"{name}.log").count("became leader") for name in ("master", "master-standby")]
    assert leaders in ([1, 0], [1, 1]), leaders


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_up_starts_an_etcd_of_three_members_and_keeps_to_it(services, tmp_path, monkeypatch) -> None:
    # Kafka and Redis named as external: only etcd is started here.
    monkeypatch.setenv(ENV_KAFKA, services.kafka)
    monkeypatch.setenv(ENV_REDIS, services.redis)
    local = LocalServices(tmp_path, Ports.free(etcd_members=3))
    try:
        local.up()
        statuses = {s.name: s for s in local.status()}
        assert [n for n in statuses if n.startswith("etcd")] == ["etcd", "etcd-1", "etcd-2"]
        assert all(s.healthy and not s.external for n, s in statuses.items() if n.startswith("etcd")), statuses
        assert local.endpoints.etcd == ",".join(statuses[n].address for n in ("etcd", "etcd-1", "etcd-2"))
        client = etcd_client(local.endpoints)
        client.put("/smoke", b"1")
        assert client.get("/smoke")[0] == b"1"
        client.close()
    finally:
        local.down()
    with pytest.raises(InfraError, match="has data of 3 node"):
        LocalServices(tmp_path, Ports.free()).up()

"""A job whose services go away mid-run and come back (issue 16): the processes wait, resume by
themselves, and the ledger still holds. Private services, so the session's are never stopped."""

from __future__ import annotations

import dataclasses
import time

import pytest

from conftest import wait_for
from streamtrain.infra import LocalServices, Ports
from streamtrain.infra.clients import TopicSpec, ensure_topics, redis_client
from streamtrain.jobstate.errors import EtcdError
from streamtrain.jobstate.etcd import Etcd
from test_trainer import MODEL, Background, applied_exactly, finished, make_job, run_job, write_examples

pytestmark = [pytest.mark.services, pytest.mark.slow]


def finished_or_away(etcd: Etcd, job: str) -> bool:
    try:
        return finished(etcd, job)
    except EtcdError:  # this test's own client meets etcd away too
        return False


@pytest.fixture
def own_services(tmp_path_factory):
    local = LocalServices(tmp_path_factory.mktemp("away"), Ports.free())
    local.up()
    try:
        yield local
    finally:
        local.down()


@pytest.mark.parametrize("service", ["kafka", "etcd", "redis"])
def test_a_job_goes_on_after_a_service_restarts(own_services, tmp_path, service) -> None:
    services = own_services.endpoints
    topic = f"away-{service}"
    ensure_topics(services, [TopicSpec(topic, 2)])
    counts = write_examples(services, topic, [e.to_json() for e in MODEL.examples(30_000)], 2)
    config = make_job(f"away-{service}", topic, tmp_path, max_records=500)
    # The job's default leader lease (10 s), not the tests' 2 s: etcd comes back with every lease
    # renewed for one TTL, and a client reconnecting after the outage can take longer than 2 s
    # to send its keep-alive; a leader whose lease ends steps down (fenced) and exits for its
    # supervisor to restart it, which these threads do not have (CI, 2026-11-24).
    config = dataclasses.replace(config, master=dataclasses.replace(config.master, lock_ttl_s=10))
    coord, background, redis_conn = Etcd.connect(services), Background(), redis_client(services)
    try:
        # Leases of the CLI's default length, longer than the outage: with 2 s ones a shard's
        # lease could end while etcd was down, and the shard stops for its supervisor to
        # restart it, which these threads do not have (CI, 2026-11-23).
        run_job(services, coord, config, background, trainers=2, lease_ttl_s=10)
        time.sleep(8)  # training under way
        server = own_services.servers[service]
        server.stop()
        time.sleep(5)
        server.start()
        wait_for(lambda: finished_or_away(coord, config.name), 240, "the job's pass after the restart", interval=1.0)
        wait_for(lambda: applied_exactly(redis_conn, config.name, counts, topic), 60, "every example applied once")
    finally:
        background.close()
        coord.close()
        redis_conn.close()

"""`streamtrain up / services / down` on its own state dir, as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from streamtrain.infra.clients import TopicSpec, ensure_topics
from streamtrain.infra.endpoints import Endpoints
from streamtrain.infra.process import pid_alive

pytestmark = [pytest.mark.services, pytest.mark.slow]


def _free_port_block(size: int = 6) -> int:
    """A base port with `size` consecutive free ports after it."""
    for base in range(23000, 60000, 97):
        socks = []
        try:
            for port in range(base, base + size):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port block")


class Cli:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("STREAMTRAIN_KAFKA", "STREAMTRAIN_ETCD", "STREAMTRAIN_REDIS", "STREAMTRAIN_REGISTRY")}
        self.env["STREAMTRAIN_HOME"] = str(home)

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([sys.executable, "-m", "streamtrain", *args], env=self.env,
                                capture_output=True, text=True, timeout=180)
        if check and result.returncode != 0:
            raise AssertionError(f"streamtrain {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result

    def status(self) -> dict:
        return json.loads(self("services", "--json", check=False).stdout)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    cli = Cli(tmp_path_factory.mktemp("st-home"))
    result = cli("up", "--port-base", str(_free_port_block()))
    print(result.stdout)
    yield cli
    cli("down", check=False)


def _processes_under(home: Path) -> list[int]:
    """Live processes whose working directory lies in `home` (our servers run there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd.startswith(str(home)) and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_up_starts_three_healthy_services_and_reports_kafka_cold_start(cli: Cli) -> None:
    status = cli.status()
    assert set(status) == {"kafka", "etcd", "redis"}
    assert all(s["healthy"] and s["pid"] for s in status.values()), status
    again = cli("up")  # idempotent
    assert again.stdout.count("already running") == 3


def test_killed_broker_comes_back_with_topics_and_messages(cli: Cli) -> None:
    endpoints = Endpoints(kafka=cli.status()["kafka"]["address"], etcd="", redis="")
    topic = "survivor"
    ensure_topics(endpoints, [TopicSpec(topic, partitions=3)])
    producer = Producer({"bootstrap.servers": endpoints.kafka, "transactional.id": "survivor-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(300):
        producer.produce(topic, value=str(i).encode(), partition=i % 3)
    producer.commit_transaction(30)

    pid = cli.status()["kafka"]["pid"]
    os.kill(pid, signal.SIGKILL)
    assert not cli.status()["kafka"]["healthy"]

    cli("up")
    assert cli.status()["kafka"]["healthy"]
    consumer = Consumer({"bootstrap.servers": endpoints.kafka, "group.id": "survivor-check",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    assert len(consumer.list_topics(topic, timeout=10).topics[topic].partitions) == 3
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    values: set[int] = set()
    deadline = time.monotonic() + 60
    while len(values) < 300 and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            values.add(int(msg.value()))
    consumer.close()
    assert values == set(range(300))


def test_down_leaves_no_process_behind(cli: Cli) -> None:
    assert len(_processes_under(cli.home)) == 3
    result = cli("down")
    assert "kafka" in result.stdout and "etcd" in result.stdout and "redis" in result.stdout
    assert _processes_under(cli.home) == []
    assert not any(s["healthy"] for s in cli.status().values())


def test_up_with_registry_adds_a_schema_registry_that_down_stops(cli: Cli) -> None:
    result = cli("up", "--registry")
    assert "registry" in result.stdout, result.stdout
    status = cli.status()
    assert set(status) == {"kafka", "etcd", "redis", "registry"}
    assert status["registry"]["healthy"] and status["registry"]["address"].endswith("/apis/ccompat/v7"), status
    assert "registry" in cli("down").stdout
    assert _processes_under(cli.home) == []


def test_missing_program_error_names_the_install_command(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    cli.env["PATH"] = str(tmp_path / "empty-bin")
    result = cli("up", "--port-base", str(_free_port_block()), check=False)
    assert result.returncode == 1
    assert "apt-get install" in result.stderr + result.stdout

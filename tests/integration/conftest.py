"""Helpers for tests that run job processes against the session's real services."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from streamtrain.infra import Endpoints
from streamtrain.jobstate.errors import TaskLostError
from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.offsets import InputOffsets
from streamtrain.jobstate.tasks import ClaimedTask, TaskClient
from streamtrain.master.service import Master
from streamtrain.schemas import EtcdKeys, Holder, PartitionCursor
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.reader import RangeReader

T = TypeVar("T")


def produce(endpoints: Endpoints, topic: str, per_partition: dict[int, int],
            transactional: bool = False) -> None:
    """Write records; with `transactional`, commit markers take offsets too (as in real
    transactional input), so offsets and record counts differ."""
    conf = {"bootstrap.servers": endpoints.kafka, "linger.ms": 5}
    if transactional:
        conf["transactional.id"] = f"{topic}-loader-{time.monotonic_ns()}"
    producer = Producer(conf)
    if transactional:
        producer.init_transactions(30)
    for partition, count in per_partition.items():
        for start in range(0, count, 500):
            if transactional:
                producer.begin_transaction()
            for i in range(start, min(count, start + 500)):
                producer.produce(topic, value=f"{partition}:{i}".encode(), partition=partition)
            if transactional:
                producer.commit_transaction(30)
    producer.flush(30)


def stable_ends(endpoints: Endpoints, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    """Each partition's last stable offset: where the master's tasks end."""
    consumer = Consumer({"bootstrap.servers": endpoints.kafka, "group.id": "probe",
                         "isolation.level": "read_committed"})
    try:
        return {(topic, p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
    finally:
        consumer.close()


def read_partition(endpoints: Endpoints, topic: str, partition: int = 0) -> list[Message]:
    """The committed records of one partition, from its start to its last stable offset now."""
    end = stable_ends(endpoints, topic, partition + 1)[(topic, partition)]
    reader = RangeReader(endpoints, f"probe-{time.time_ns()}")
    try:
        return list(reader.read(topic, partition, 0, end))
    finally:
        reader.close()


def job_config(name: str, topic: str, **sections: dict) -> JobConfig:
    doc = {"job": {"name": name}, "input": {"topics": [topic]},
           "master": {"lock_ttl_s": 2, "poll_ms": 50},
           "tasks": {"linger_ms": 100, "timeout_s": 30}}
    for section, values in sections.items():
        doc.setdefault(section, {}).update(values)
    lines = []
    for section, values in doc.items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {_toml(v)}" for k, v in values.items())
    return JobConfig.from_toml("\n".join(lines))


def _toml(value: object) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table
        return "{ " + ", ".join(f"{_toml(str(k))} = {_toml(v)}" for k, v in value.items()) + " }"
    return str(value).lower() if isinstance(value, bool) else str(value)


def write_job_file(path: Path, config: JobConfig) -> Path:
    lines = []
    for section, values in config.to_dict().items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {_toml(v)}" for k, v in values.items() if v not in (None, [], ()))
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class MasterThread:
    master: Master
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.master.run(self.stop)
        except BaseException as exc:  # surfaced by close()
            self.error = exc

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)
        if self.error is not None:
            raise self.error


@pytest.fixture
def start_master(services: Endpoints) -> Iterator[Callable[[JobConfig], MasterThread]]:
    running: list[MasterThread] = []
    clients: list[Etcd] = []

    def start(config: JobConfig, identity: str | None = None) -> MasterThread:
        etcd = Etcd.connect(services)
        clients.append(etcd)
        m = MasterThread(Master(etcd, InputOffsets(services), config, identity))
        running.append(m)
        return m

    yield start
    for m in running:
        m.close()
    for c in clients:
        c.close()


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    """SIGKILL whatever a test started and left running (a failed test's hung or frozen
    process would otherwise run on, and load the box, for the rest of the session)."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


class StreamtrainProcess:
    """A `streamtrain ...` command as a real process, for kill and freeze tests."""

    def __init__(self, endpoints: Endpoints, args: list[str], name: str, log_dir: Path) -> None:
        env = dict(os.environ, STREAMTRAIN_KAFKA=endpoints.kafka, STREAMTRAIN_ETCD=endpoints.etcd,
                   STREAMTRAIN_REDIS=endpoints.redis)
        self.log = log_dir / f"{name}.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "streamtrain", *args], env=env,
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        _STARTED.append(self.proc)
        self.name = name

    def kill(self, sig: int = 9) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 20) -> int:
        return self.proc.wait(timeout)


class MasterProcess(StreamtrainProcess):
    def __init__(self, endpoints: Endpoints, job_file: Path, name: str, log_dir: Path) -> None:
        super().__init__(endpoints, ["master", "--job", str(job_file), "--identity", name], name, log_dir)


def publish_job(etcd: Etcd, config: JobConfig) -> None:
    """What a master writes first (config, ps_desired, slot map), for tests that run
    pservers or trainers without one."""
    from streamtrain.jobstate.sharding import SlotMap

    keys = EtcdKeys(config.name)
    etcd.put(keys.config, config.to_json())
    etcd.put(keys.ps_desired, keys.ps_desired_value(config.pservers.count))
    etcd.put(keys.slots, SlotMap.uniform(config.pservers.slots, config.pservers.count).to_json())


def leader_name(etcd: Etcd, job: str) -> str | None:
    entry = etcd.get(EtcdKeys(job).master_lock)
    return Holder.from_json(entry.value).name if entry else None


def cursors(etcd: Etcd, job: str) -> dict[tuple[str, int], PartitionCursor]:
    found = {}
    for e in etcd.range(EtcdKeys(job).cursors_prefix):
        c = PartitionCursor.from_json(e.value)
        found[(c.topic, c.partition)] = c
    return found


@dataclass
class FakeTrainer:
    """Claims and completes tasks as fast as etcd allows (completing and claiming the next in
    one transaction, as a busy trainer does), recording every completed range."""

    client: TaskClient
    completed: list[tuple[str, int, int, int, int]] = field(default_factory=list)  # topic, part, start, end, pass
    lost: int = 0
    held: ClaimedTask | None = None

    def drain_once(self) -> bool:
        task = self.held or self.client.claim()
        self.held = None
        if task is None:
            return False
        try:
            self.held = self.client.complete(task, claim_next=True)
        except TaskLostError:
            self.lost += 1
            return True
        r = task.record
        self.completed.append((r.topic, r.partition, r.start, r.end, r.pass_no))
        return True


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05,
             detail: Callable[[], str] | None = None) -> None:
    """`detail`: what the failure message adds, read when the time is up (the state a CI log
    needs to tell why)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}" +
                                 (f"\n{detail()}" if detail is not None else ""))
        time.sleep(interval)


def wait_for_value(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """The first value `probe` returns that is not None."""
    found: list[T] = []
    wait_for(lambda: (value := probe()) is not None and not found.append(value), timeout, what, interval)
    return found[0]


def assert_exact_cover(completed, ends: dict[tuple[str, int], int], pass_no: int = 0) -> None:
    """Completed ranges of each partition tile [0, end) with no gap and no overlap."""
    by_partition: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for topic, part, start, end, p in completed:
        if p == pass_no:
            by_partition.setdefault((topic, part), []).append((start, end))
    for tp, end in ends.items():
        ranges = sorted(by_partition.get(tp, []))
        position = 0
        for start, stop in ranges:
            assert start == position, (f"{tp}: {'gap' if start > position else 'overlap'} at {position} "
                                       f"(next range starts {start})")
            position = stop
        assert position == end, f"{tp}: covered up to {position}, end is {end}"

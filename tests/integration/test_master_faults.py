"""The master under process faults: SIGKILL with a standby, SIGSTOP past its lease, and an
endless stream of tasks that must not grow etcd."""

from __future__ import annotations

import json
import random
import signal
import threading
import time

import pytest

from conftest import (
    FakeTrainer,
    MasterProcess,
    MasterThread,
    assert_exact_cover,
    cursors,
    job_config,
    leader_name,
    produce,
    stable_ends,
    wait_for,
    write_job_file,
)
from streamtrain.jobstate.errors import EtcdError, NotLeaderError
from streamtrain.jobstate.etcd import Etcd, put_op
from streamtrain.jobstate.offsets import InputOffsets
from streamtrain.jobstate.tasks import TaskClient
from streamtrain.master.service import Master
from streamtrain.schemas import CheckpointRequest, EtcdKeys, JobState

pytestmark = [pytest.mark.services, pytest.mark.slow]


class TrainerLoop:
    """A fake trainer working in the background until stopped."""

    def __init__(self, trainer: FakeTrainer) -> None:
        self.trainer = trainer
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.trainer.drain_once():
                time.sleep(0.02)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def test_master_killed_five_times_during_slicing_loses_and_duplicates_nothing(
    services, topic_factory, unique, tmp_path
) -> None:
    rng = random.Random(7)
    topic = topic_factory("killed", partitions=3)
    config = job_config(unique("killed"), topic, tasks={"max_records": 37, "linger_ms": 50})
    job_file = write_job_file(tmp_path / "job.toml", config)
    etcd = Etcd.connect(services)
    masters = [MasterProcess(services, job_file, f"m{i}", tmp_path) for i in range(2)]
    loop = TrainerLoop(FakeTrainer(TaskClient(etcd, config.name, "t", 30, 3)))

    stop_producing = threading.Event()

    def keep_producing() -> None:
        while not stop_producing.is_set():
            produce(services, topic, {p: rng.randint(5, 60) for p in range(3)},
                    transactional=rng.random() < 0.5)
            time.sleep(0.05)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    takeovers = []
    try:
        for kill in range(5):
            wait_for(lambda: leader_name(etcd, config.name) is not None, 30, "a leader")
            time.sleep(rng.uniform(0.3, 1.5))  # somewhere in the middle of slicing and dispatch
            victim_name = leader_name(etcd, config.name)
            victim = next(m for m in masters if m.name == victim_name)
            victim.kill(signal.SIGKILL)
            killed_at = time.monotonic()
            masters.append(MasterProcess(services, job_file, f"m{len(masters)}", tmp_path))
            wait_for(lambda: leader_name(etcd, config.name) not in (None, victim_name), 30,
                     f"a standby to take over after kill {kill + 1}")
            takeovers.append(time.monotonic() - killed_at)
        stop_producing.set()
        producer.join(30)
        ends = stable_ends(services, topic, 3)
        wait_for(lambda: all(c.trained == ends[tp] for tp, c in cursors(etcd, config.name).items())
                 and len(cursors(etcd, config.name)) == 3, 60, "everything produced to be trained")
    finally:
        stop_producing.set()
        loop.close()
        for m in masters:
            m.kill(signal.SIGTERM)
        for m in masters:
            m.wait(20)
    assert_exact_cover(loop.trainer.completed, ends)
    assert loop.trainer.lost == 0
    # Takeover happens within the lock's TTL (2 s here) plus the standby's polling.
    assert max(takeovers) < config.master.lock_ttl_s + 2, takeovers
    print("takeover seconds:", [round(t, 2) for t in takeovers])
    etcd.close()


def test_master_frozen_past_its_lease_cannot_write_after_resuming(
    services, topic_factory, unique, tmp_path
) -> None:
    topic = topic_factory("frozen")
    produce(services, topic, {0: 100})
    config = job_config(unique("frozen"), topic, master={"lock_ttl_s": 4, "poll_ms": 50},
                        tasks={"max_records": 10})
    job_file = write_job_file(tmp_path / "job.toml", config)
    etcd = Etcd.connect(services)
    first = MasterProcess(services, job_file, "first", tmp_path)
    wait_for(lambda: leader_name(etcd, config.name) == "first", 30, "first to lead")
    second = MasterProcess(services, job_file, "second", tmp_path)
    try:
        wait_for(lambda: "standby:" in second.log.read_text(), 30, "second to stand by")
        first.kill(signal.SIGSTOP)
        wait_for(lambda: leader_name(etcd, config.name) == "second", 15, "second to take over")
        # Past its start-up writes (config, cursors): frozen now, it has no write in flight.
        wait_for(lambda: "partition cursors" in second.log.read_text(), 15, "second to load the cursors")
        second.kill(signal.SIGSTOP)
        # New input: a resumed leader that still believed in itself would slice it.
        produce(services, topic, {0: 100})
        before = etcd.range(EtcdKeys(config.name).prefix)
        revision = max(e.mod_revision for e in before)
        first.kill(signal.SIGCONT)
        assert first.wait(3) == 3  # it noticed it had lost the lock and exited
        after = etcd.range(EtcdKeys(config.name).prefix)
        assert max(e.mod_revision for e in after) == revision, "the frozen master wrote after resuming"
        assert "no longer ours" in first.log.read_text() or "expired" in first.log.read_text()
    finally:
        second.kill(signal.SIGCONT)
        for m in (first, second):
            m.kill(signal.SIGTERM)
            m.wait(20)
    etcd.close()


def test_every_master_write_is_refused_once_another_master_holds_the_lock(
    services, topic_factory, unique
) -> None:
    topic = topic_factory("fence")
    config = job_config(unique("fence"), topic)
    etcd = Etcd.connect(services)
    master = Master(etcd, InputOffsets(services), config, identity="old")
    assert master.lock.acquire(threading.Event())
    keys = EtcdKeys(config.name)
    # The old tenure ends (as if its lease expired) and a new master takes the lock.
    etcd.delete_prefix(keys.master_lock)
    etcd.put(keys.master_lock, json.dumps({"master": "new"}).encode())
    with pytest.raises(NotLeaderError):
        master.lock.write([put_op(keys.prefix + "probe", b"x")])
    assert etcd.get(keys.prefix + "probe") is None
    # Its checkpoint writes too: asked for one, it begins it, and may not write its record.
    asked = CheckpointRequest(ask="a", at=time.time()).to_json()
    with pytest.raises(NotLeaderError):
        master.checkpoints.step(request=asked, busy=False)
    assert etcd.range(keys.checkpoints_prefix) == []
    etcd.close()


class AnswerLost(Etcd):
    """etcd killed after it applied a transaction and before it answered: the first
    transaction that folds done tasks is applied, then reported as failed."""

    lost = False

    def txn(self, compare, success, failure=()):
        result = super().txn(compare, success, failure)
        if not self.lost and any("/tasks/done/" in str(getattr(op, "key", "")) for op in success):
            self.lost = True
            raise EtcdError("txn: etcd went away before it answered")
        return result


def test_a_fold_applied_but_answered_as_failed_loses_no_task(services, topic_factory, unique) -> None:
    """Issue 16's full chaos profile: a fold that etcd applied as it was killed, but that the
    master saw fail, left the master's cursor below the tasks the fold had deleted; no task
    after it could fold, its next slice wrote the stale watermark back, and the job never
    finished. The master now reads its cursors again after any failed round."""
    topic = topic_factory("answer-lost")
    produce(services, topic, {0: 200})
    config = job_config(unique("answer-lost"), topic, tasks={"max_records": 10}, input={"passes": 1})
    etcd = Etcd.connect(services)
    trainer = FakeTrainer(TaskClient(etcd, config.name, "t1", config.tasks.timeout_s, config.tasks.max_attempts))
    flaky = AnswerLost.connect(services)
    master = MasterThread(Master(flaky, InputOffsets(services), config))
    state_key = EtcdKeys(config.name).state
    try:
        wait_for(lambda: not trainer.drain_once() and etcd.get(state_key) is not None, 60, "job finished")
    finally:
        master.close()
        flaky.close()
    assert flaky.lost and JobState.from_json(etcd.get(state_key).value).finished
    assert_exact_cover(trainer.completed, {(topic, 0): 200})
    etcd.close()


@pytest.mark.timeout(900)
def test_task_keys_stay_bounded_after_20k_tasks(services, topic_factory, unique, start_master) -> None:
    # 20,000 tasks: a history kept would be twenty times the bound below. 40,000 took 125 s
    # on a fast day and 218 s on a slow one (2026-11-28), the longest test but the chaos
    # profile's, for no defect 20,000 would miss; 100,000 took several minutes.
    total = 20_000
    topic = topic_factory("endless", partitions=2)
    produce(services, topic, {0: total // 2, 1: total // 2})
    # No shard runs here, so a periodic checkpoint would never complete: its manifest would
    # stay and be counted at the end (13 keys after a 100,000-task run that took minutes).
    config = job_config(unique("endless"), topic,
                        tasks={"max_records": 1, "max_todo": 200, "linger_ms": 0},
                        pservers={"checkpoint_every_s": 3600})
    etcd = Etcd.connect(services)
    keys = EtcdKeys(config.name)
    loops = [TrainerLoop(FakeTrainer(TaskClient(Etcd.connect(services), config.name, f"t{i}", 30, 3)))
             for i in range(4)]
    start_master(config)
    peak = 0
    started = time.monotonic()
    try:
        while True:
            count = etcd.count(keys.prefix)
            peak = max(peak, count)
            trained = sum(c.trained for c in cursors(etcd, config.name).values())
            if trained == total:
                break
            assert time.monotonic() - started < 600, f"only {trained} of {total} trained"
            time.sleep(0.5)
    finally:
        for loop in loops:
            loop.close()
    elapsed = time.monotonic() - started
    completed = [r for loop in loops for r in loop.trainer.completed]
    assert len(completed) == total
    assert_exact_cover(completed, {(topic, 0): total // 2, (topic, 1): total // 2})
    # todo is capped by max_todo, pending by the trainers, done by folding: never the history
    # (20,000 here). Done tasks pile up for one master step between folds, up to a couple of
    # hundred with four fast trainers on a loaded 2-core box (measured 425-491 in all), and
    # more when the machine is slow, hence 5x.
    assert peak <= 5 * config.tasks.max_todo, peak
    final = etcd.count(keys.prefix)
    assert final <= 10, [e.key for e in etcd.range(keys.prefix)]
    print(f"{total} tasks in {elapsed:.1f} s ({total / elapsed:.0f} cycles/s); peak keys {peak}, final {final}")
    etcd.close()

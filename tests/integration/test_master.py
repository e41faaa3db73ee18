"""The master against real Kafka and etcd: slicing, queues, timeouts, passes, compaction."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka.admin import AdminClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FakeTrainer, assert_exact_cover, cursors, job_config, produce, stable_ends, wait_for
from streamtrain.jobstate.errors import TaskLostError
from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.membership import members, register_pserver, register_trainer
from streamtrain.jobstate.tasks import TaskClient
from streamtrain.schemas import EtcdKeys, JobState, TaskRecord

pytestmark = pytest.mark.services


def trained_to(trainer: FakeTrainer, etcd: Etcd, job: str, tp: tuple[str, int]) -> int | None:
    """Let the trainer work one task, then read the partition's watermark."""
    trainer.drain_once()
    cursor = cursors(etcd, job).get(tp)
    return None if cursor is None else cursor.trained


def client(etcd: Etcd, config, trainer: str = "t1") -> TaskClient:
    return TaskClient(etcd, config.name, trainer, config.tasks.timeout_s, config.tasks.max_attempts)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    counts=st.lists(st.integers(0, 700), min_size=1, max_size=4),
    max_records=st.integers(1, 300),
    transactional=st.booleans(),
)
def test_done_tasks_cover_every_partition_exactly_once(
    services, topic_factory, unique, start_master, counts, max_records, transactional
) -> None:
    topic = topic_factory("input", partitions=len(counts))
    produce(services, topic, dict(enumerate(counts)), transactional=transactional)
    ends = stable_ends(services, topic, len(counts))
    config = job_config(unique("cover"), topic, tasks={"max_records": max_records})
    etcd = Etcd.connect(services)
    trainer = FakeTrainer(client(etcd, config))
    master = start_master(config)

    def all_trained() -> bool:
        # Everything claimable at each look, not a task a look: with a task a record, 1,500
        # records at one task per 50 ms poll would not fit the wait.
        while trainer.drain_once():
            pass
        found = cursors(etcd, config.name)
        return len(found) == len(ends) and all(found[tp].trained == end for tp, end in ends.items())

    wait_for(all_trained, 60, "every partition trained to its end")
    master.close()
    assert_exact_cover(trainer.completed, ends)
    assert all(0 < end - start <= max_records for _, _, start, end, _ in trainer.completed)
    keys = EtcdKeys(config.name)
    assert etcd.count(keys.tasks("done")) == 0  # folded into the watermark
    etcd.close()


def test_a_backlog_is_claimed_across_partitions_in_offset_order(
    services, topic_factory, unique, start_master
) -> None:
    """A drifting stream must not be trained partition after partition: the slicer cuts a
    backlog in rounds (a task from each partition) and claims keep to them, so at every point
    the partitions have had about as many tasks claimed."""
    topic = topic_factory("backlog", partitions=3)
    produce(services, topic, {0: 300, 1: 300, 2: 300})
    config = job_config(unique("rounds"), topic, tasks={"max_records": 1})
    etcd = Etcd.connect(services)
    start_master(config)
    keys = EtcdKeys(config.name)
    wait_for(lambda: etcd.count(keys.tasks("todo")) == 900, 30, "the whole backlog sliced")
    trainer = FakeTrainer(client(etcd, config))
    while trainer.drain_once():
        pass
    claimed = [0, 0, 0]
    worst = 0
    for _, partition, _, _, _ in trainer.completed:
        claimed[partition] += 1
        worst = max(worst, max(claimed) - min(claimed))
    assert claimed == [300, 300, 300]
    # Claims pick at random among the first 32 left in order, so one partition can get about
    # that far ahead of another; partition after partition it would be 300.
    assert worst <= 40, worst
    etcd.close()


def test_partitions_added_later_are_followed(services, topic_factory, unique, start_master) -> None:
    topic = topic_factory("grow", partitions=1)
    produce(services, topic, {0: 50})
    config = job_config(unique("grow"), topic, tasks={"max_records": 20})
    etcd = Etcd.connect(services)
    trainer = FakeTrainer(client(etcd, config))
    start_master(config)
    wait_for(lambda: trained_to(trainer, etcd, config.name, (topic, 0)) == 50, 30, "partition 0 trained")
    from confluent_kafka.admin import NewPartitions

    admin = AdminClient({"bootstrap.servers": services.kafka})
    admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
    produce(services, topic, {1: 30})
    wait_for(lambda: trained_to(trainer, etcd, config.name, (topic, 1)) == 30, 30, "new partition trained")
    assert_exact_cover(trainer.completed, {(topic, 0): 50, (topic, 1): 30})
    etcd.close()


def test_partial_task_at_the_head_is_cut_after_linger(services, topic_factory, unique, start_master) -> None:
    topic = topic_factory("head")
    produce(services, topic, {0: 7})
    config = job_config(unique("linger"), topic, tasks={"max_records": 1000, "linger_ms": 300})
    etcd = Etcd.connect(services)
    start_master(config)
    keys = EtcdKeys(config.name)
    wait_for(lambda: etcd.count(keys.tasks("todo")) == 1, 10, "the partial task")
    (entry,) = etcd.range(keys.tasks("todo"))
    task = TaskRecord.from_json(entry.value)
    assert (task.start, task.end) == (0, 7)
    etcd.close()


def one_partition_job(services, topic_factory, unique, start_master, stem: str, records: int, tasks: dict,
                      todo: int):
    """A master over one partition of `records` records, once it has cut `todo` tasks:
    (topic, config, etcd client, keys)."""
    topic = topic_factory(stem)
    produce(services, topic, {0: records})
    config = job_config(unique(stem), topic, tasks=tasks)
    etcd = Etcd.connect(services)
    keys = EtcdKeys(config.name)
    start_master(config)
    wait_for(lambda: etcd.count(keys.tasks("todo")) == todo, 10, f"{todo} tasks")
    return topic, config, etcd, keys


def test_dead_trainers_task_returns_to_todo_after_timeout_with_its_attempt_unchanged(
    services, topic_factory, unique, start_master
) -> None:
    topic, config, etcd, keys = one_partition_job(services, topic_factory, unique, start_master,
                                                  "timeout", 10, {"max_records": 10, "timeout_s": 1}, todo=1)
    dead = client(etcd, config, "doomed")
    task = dead.claim()
    assert task is not None and task.record.attempt == 0
    assert etcd.count(keys.tasks("pending")) == 1
    wait_for(lambda: etcd.count(keys.tasks("todo")) == 1, 10, "requeue after timeout")
    (entry,) = etcd.range(keys.tasks("todo"))
    requeued = TaskRecord.from_json(entry.value)
    assert requeued.attempt == 0 and requeued.trainer_id is None
    assert "timed out" in requeued.reason

    # The zombie wakes up: every call of its old attempt is refused.
    with pytest.raises(TaskLostError):
        dead.complete(task)
    with pytest.raises(TaskLostError):
        dead.heartbeat(task)
    live = client(etcd, config, "healthy")
    again = live.claim()
    assert again is not None and again.record.attempt == 0
    # What a completion whose reply was lost looks up: done by this attempt, before and after
    # the master folds the done key into the cursor.
    assert not live.completed(again) and not dead.completed(task)
    live.complete(again)
    assert live.completed(again)
    wait_for(lambda: etcd.get(keys.task("done", again.task_id)) is None, 10, "the done task folded")
    assert live.completed(again)
    etcd.close()


def test_a_trainer_that_leaves_gives_its_task_back_at_once_not_after_the_timeout(
    services, topic_factory, unique, start_master
) -> None:
    """Issue 16: a dead trainer's tasks waited out the task timeout; its membership lease ends
    far sooner."""
    topic, config, etcd, keys = one_partition_job(services, topic_factory, unique, start_master,
                                                  "left", 10, {"max_records": 10, "timeout_s": 60}, todo=1)
    lease = register_trainer(etcd, config.name, "leaving", ttl_s=1)
    wait_for(lambda: etcd.get(keys.trainer("leaving")) is not None, 5, "membership")
    time.sleep(1.0)  # the master sees the member before it leaves
    task = client(etcd, config, "leaving").claim()
    assert task is not None
    lease.revoke()  # what its death does, once the lease's TTL runs out
    began = time.monotonic()
    wait_for(lambda: etcd.get(keys.task_back("todo", task.task_id)) is not None, 10, "the task back")
    assert time.monotonic() - began < 10
    requeued = TaskRecord.from_json(etcd.get(keys.task_back("todo", task.task_id)).value)
    assert requeued.attempt == 0 and "trainer leaving left" in requeued.reason
    etcd.close()


def test_a_trainer_restarted_under_its_id_requeues_what_its_predecessor_held(
    services, topic_factory, unique, start_master
) -> None:
    topic, config, etcd, keys = one_partition_job(services, topic_factory, unique, start_master,
                                                  "again", 20, {"max_records": 10, "timeout_s": 60}, todo=2)
    held = client(etcd, config, "trainer-0").claim()
    other = client(etcd, config, "trainer-1").claim()
    assert client(etcd, config, "trainer-0").requeue_predecessors() == [held.task_id]
    back = TaskRecord.from_json(etcd.get(keys.task_back("todo", held.task_id)).value)
    assert back.attempt == 0 and "trainer trainer-0 restarted" in back.reason
    assert etcd.get(keys.task("pending", other.task_id)) is not None  # another trainer's: untouched
    etcd.close()


def test_tasks_given_back_are_claimed_before_the_rest_of_todo_and_in_input_order(
    services, topic_factory, unique, start_master
) -> None:
    """Issue 16: a task given back was written to todo anew, so claims, oldest first, took it
    after every task already waiting: on a bounded job, at the very end, the last input the
    model saw, however old (a killed trainer gives back the task in hand and the one it had
    claimed ahead)."""
    topic, config, etcd, keys = one_partition_job(services, topic_factory, unique, start_master,
                                                  "back", 50, {"max_records": 10, "timeout_s": 60}, todo=5)
    holder = client(etcd, config, "t1")
    # Claims pick at random among the oldest (one transaction here): whichever two they were.
    earlier, later = sorted((holder.claim(), holder.claim()), key=lambda t: t.record.start)
    holder.release(later)
    holder.fail(earlier, "its loader died")
    other = client(etcd, config, "t2")
    again = [other.claim() for _ in range(3)]
    assert [t.task_id for t in again[:2]] == [earlier.task_id, later.task_id]
    assert [t.record.attempt for t in again[:2]] == [1, 0]  # a release counts no attempt
    rest = {0, 10, 20, 30, 40} - {earlier.record.start, later.record.start}
    assert again[2].record.start in rest and not etcd.range(keys.retry_prefix)
    # A task whose partition was away goes behind the tasks waiting instead.
    other.release(again[2], behind=True)
    assert not etcd.range(keys.retry_prefix) and etcd.get(keys.task("todo", again[2].task_id)) is not None
    etcd.close()


def test_task_claimed_by_a_sigkilled_trainer_process_returns_to_todo_with_its_attempt_unchanged(
    services, topic_factory, unique, start_master
) -> None:
    topic, config, etcd, keys = one_partition_job(services, topic_factory, unique, start_master,
                                                  "sigkill", 10, {"max_records": 10, "timeout_s": 1}, todo=1)
    env = dict(os.environ, STREAMTRAIN_KAFKA=services.kafka, STREAMTRAIN_ETCD=services.etcd,
               STREAMTRAIN_REDIS=services.redis)
    script = (
        "import sys, time\n"
        "from streamtrain.infra import Endpoints\n"
        "from streamtrain.jobstate.etcd import Etcd\n"
        "from streamtrain.jobstate.tasks import TaskClient\n"
        f"client = TaskClient.for_job(Etcd.connect(Endpoints.resolve()), {config.name!r}, 'victim')\n"
        "print(client.claim().task_id, flush=True)\n"
        "time.sleep(600)\n"
    )
    victim = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    claimed = victim.stdout.readline().strip()
    assert etcd.get(keys.task("pending", claimed)) is not None
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    wait_for(lambda: etcd.get(keys.task_back("todo", claimed)) is not None, 10, "the requeue")
    requeued = TaskRecord.from_json(etcd.get(keys.task_back("todo", claimed)).value)
    assert requeued.attempt == 0 and "victim" in requeued.reason
    etcd.close()


def test_a_task_lost_again_and_again_is_never_failed_and_one_failing_ends_in_failed_after_max_attempts(
    services, topic_factory, unique, start_master
) -> None:
    """Issue 16: a lost holder (killed, frozen, cut off from etcd) counted an attempt, so a
    run of faults used tasks' attempts up and dropped their records as failed."""
    topic, config, etcd, keys = one_partition_job(services, topic_factory, unique, start_master,
                                                  "poison", 30, {"max_records": 10, "timeout_s": 0.5,
                                                                 "max_attempts": 3}, todo=3)
    unlucky, poison = TaskRecord.make_id(topic, 0, 0), TaskRecord.make_id(topic, 0, 10)
    trainer = FakeTrainer(client(etcd, config, "t"))
    lost = failures = 0

    def settle() -> bool:
        nonlocal lost, failures
        task = trainer.client.claim()
        if task is None:  # (todo counted too: a requeue may land between the claim and the counts)
            return etcd.count(keys.tasks("failed")) == 1 and etcd.count(keys.tasks("pending")) == 0 == \
                etcd.count(keys.tasks("todo"))
        if task.task_id == unlucky and lost < 5:
            lost += 1  # its trainer "dies" holding it: the master times it out
        elif task.task_id == poison:
            failures += 1  # its records kill the loader: the trainer says so
            trainer.client.fail(task, "the record loader died twice")
        else:
            assert task.record.attempt == 0
            trainer.client.complete(task)
        return False

    wait_for(settle, 30, "the poison task to fail")
    assert (lost, failures) == (5, 3)
    (entry,) = etcd.range(keys.tasks("failed"))
    failed = TaskRecord.from_json(entry.value)
    assert failed.task_id == poison and "attempt 3 of 3" in failed.reason
    # The watermark moves past the failed range: it does not block the partition.
    wait_for(lambda: cursors(etcd, config.name)[(topic, 0)].trained == 30, 10, "fold past failure")
    etcd.close()


def test_trainer_fail_and_release(services, topic_factory, unique, start_master) -> None:
    topic, config, etcd, keys = one_partition_job(services, topic_factory, unique, start_master,
                                                  "fail", 5, {"max_records": 5, "max_attempts": 2}, todo=1)
    c = client(etcd, config)
    task = c.claim(push_every=4)
    assert task.record.push_every == 4
    c.release(task)
    task = c.claim(push_every=1)
    assert task.record.attempt == 0  # a release is not a failure
    # Its first claim cut its push groups for every attempt: the shards apply each seq once.
    assert task.record.push_every == 4
    assert c.fail(task, "decoder exploded") == "todo"
    task = c.claim(push_every=2)
    assert task.record.push_every == 4
    assert c.fail(task, "decoder exploded") == "failed"
    (entry,) = etcd.range(keys.tasks("failed"))
    assert "decoder exploded" in TaskRecord.from_json(entry.value).reason
    etcd.close()


def test_bounded_input_is_trained_once_per_pass_then_the_job_finishes(
    services, topic_factory, unique, start_master
) -> None:
    topic = topic_factory("bounded", partitions=2)
    produce(services, topic, {0: 40, 1: 25})
    config = job_config(unique("passes"), topic, tasks={"max_records": 10}, input={"passes": 3})
    etcd = Etcd.connect(services)
    trainer = FakeTrainer(client(etcd, config))
    start_master(config)
    state_key = EtcdKeys(config.name).state

    wait_for(lambda: not trainer.drain_once() and etcd.get(state_key) is not None, 60, "job finished")
    assert JobState.from_json(etcd.get(state_key).value).finished
    for p in range(3):
        assert_exact_cover(trainer.completed, {(topic, 0): 40, (topic, 1): 25}, pass_no=p)
    ids = {TaskRecord.make_id(t, part, s, p) for t, part, s, _, p in trainer.completed}
    assert len(ids) == len(trainer.completed)  # every pass's tasks are distinct for dedup
    etcd.close()


def test_membership_trainers_and_pserver_indexes(services, unique, topic_factory, start_master) -> None:
    topic = topic_factory("members")
    config = job_config(unique("members"), topic, pservers={"count": 2})
    etcd = Etcd.connect(services)
    start_master(config)
    keys = EtcdKeys(config.name)
    wait_for(lambda: etcd.get(keys.ps_desired) is not None, 10, "ps_desired")
    from streamtrain.jobstate.sharding import SlotMap

    assert SlotMap.from_json(etcd.get(keys.slots).value) == SlotMap.uniform(config.pservers.slots, 2)
    first, lease0 = register_pserver(etcd, config.name, "127.0.0.1:1")
    second, lease1 = register_pserver(etcd, config.name, "127.0.0.1:2")
    assert (first, second) == (0, 1)
    from streamtrain.jobstate.errors import NoFreeIndexError

    with pytest.raises(NoFreeIndexError):
        register_pserver(etcd, config.name, "127.0.0.1:3")
    trainer_lease = register_trainer(etcd, config.name, "trainer-a", ttl_s=5)
    view = members(etcd, config.name)
    assert set(view.trainers) == {"trainer-a"} and set(view.pservers) == {0, 1}
    lease0.revoke()
    assert register_pserver(etcd, config.name, "127.0.0.1:4")[0] == 0  # the freed index
    trainer_lease.revoke()
    assert members(etcd, config.name).trainers == {}
    lease1.revoke()
    etcd.close()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _held_by(etcd: Etcd, key: str, pid: int) -> None:
    from dataclasses import replace

    from streamtrain.jobstate.etcd import put_op
    from streamtrain.jobstate.predecessors import this_holder

    lease = etcd.lease(30)
    etcd.txn([], [put_op(key, replace(this_holder("pserver", "0"), pid=pid).to_json(), lease)])


def test_a_key_whose_holder_is_a_dead_process_of_this_machine_is_taken_at_once(services, unique) -> None:
    """A restarted shard or master does not wait out its killed predecessor's 30 s lease; one
    whose predecessor still runs (here: frozen, say) does."""
    from streamtrain.jobstate.errors import NoFreeIndexError
    from streamtrain.master.leader import LeaderLock

    job = unique("successor")
    keys = EtcdKeys(job)
    etcd = Etcd.connect(services)
    etcd.put(keys.ps_desired, keys.ps_desired_value(1))
    _held_by(etcd, keys.ps(0), _dead_pid())
    began = time.monotonic()
    index, lease = register_pserver(etcd, job, "127.0.0.1:1", wait_s=5, index=0)
    assert index == 0 and time.monotonic() - began < 3
    lease.revoke()

    _held_by(etcd, keys.ps(0), os.getppid())  # alive
    with pytest.raises(NoFreeIndexError):
        register_pserver(etcd, job, "127.0.0.1:1", wait_s=1, index=0)

    _held_by(etcd, keys.master_lock, _dead_pid())
    lock = LeaderLock(etcd, keys.master_lock, 10, b'{"master": "next"}')
    import threading

    began = time.monotonic()
    assert lock.acquire(threading.Event()) and time.monotonic() - began < 5
    lock.release()
    etcd.close()

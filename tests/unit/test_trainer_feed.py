"""The task feed's hand-over logic, with an in-memory source of chunks (the loader process
and the Kafka read are covered by the integration tests): chunks in order, tasks claimed
ahead up to `ahead_records` offsets and no further, a task given up mid-read is read no
further, unbegun tasks are handed back on close."""

from __future__ import annotations

import math
import threading
import time

from streamtrain.jobstate.errors import TaskLostError
from streamtrain.jobstate.tasks import ClaimedTask
from streamtrain.schemas import TaskRecord
from streamtrain.trainer.feed import MAX_AHEAD_TASKS, TaskFeed
from streamtrain.trainer.reader import RangeReadError


class Ranges:
    """Offsets as records, in chunks of 10; `fail_at` raises RangeReadError when reading
    reaches it."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.read_upto: dict[int, int] = {}
        self.fail_at = fail_at

    def read(self, topic: str, partition: int, start: int, end: int):
        for at in range(start, end, 10):
            offsets = list(range(at, min(at + 10, end)))
            if self.fail_at in offsets:
                raise RangeReadError(f"broken at {self.fail_at}")
            self.read_upto[partition] = offsets[-1]
            yield offsets


class Tasks:
    def __init__(self, count: int, size: int) -> None:
        self.todo = [ClaimedTask(TaskRecord.for_range("t", p, 0, size), b"") for p in range(count)]
        self.claimed: list[str] = []

    def claim(self) -> ClaimedTask | None:
        if not self.todo:
            return None
        task = self.todo.pop(0)
        self.claimed.append(task.task_id)
        return task


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def assert_claims_no_more(feed: TaskFeed, tasks: Tasks) -> None:
    """The feed has twice decided, on what it holds now, not to claim: the first such decision
    may have begun before the state was reached, the second cannot have."""
    claimed, waits = len(tasks.claimed), feed.full_waits
    wait_until(lambda: feed.full_waits >= waits + 2)
    assert len(tasks.claimed) == claimed


def test_chunks_come_in_order_and_the_feed_claims_one_task_ahead_at_most() -> None:
    tasks = Tasks(count=4, size=25)
    feed = TaskFeed(tasks.claim, Ranges()).start()
    try:
        wait_until(lambda: len(tasks.claimed) == 1)
        assert_claims_no_more(feed, tasks)  # nothing begun yet: one task fed, no more
        first = feed.first(timeout=5)
        got = [first.records]
        chunk = first
        while not chunk.last:
            chunk = feed.more()
            assert chunk.task == first.task
            got.append(chunk.records)
        assert got == [list(range(10)), list(range(10, 20)), list(range(20, 25)), None]
        wait_until(lambda: len(tasks.claimed) == 2)  # the first begun: the second claimed
        assert_claims_no_more(feed, tasks)
    finally:
        feed.close()


def test_small_tasks_are_claimed_ahead_until_they_span_ahead_records() -> None:
    tasks = Tasks(count=6, size=25)
    feed = TaskFeed(tasks.claim, Ranges(), chunks_ahead=16, ahead_records=60).start()
    try:
        wait_until(lambda: len(tasks.claimed) == 3)  # 0, 25, 50 offsets unbegun when claiming
        assert_claims_no_more(feed, tasks)  # 75 >= 60: no fourth
        first = feed.first(timeout=5)
        assert first.task.task_id == tasks.claimed[0]
        wait_until(lambda: len(tasks.claimed) == 4)  # 50 unbegun again: one more
        assert_claims_no_more(feed, tasks)
    finally:
        feed.close()


def test_a_task_given_up_is_read_no_further_and_the_next_one_follows() -> None:
    tasks = Tasks(count=2, size=10_000)
    ranges = Ranges()
    feed = TaskFeed(tasks.claim, ranges, chunks_ahead=2).start()
    try:
        first = feed.first(timeout=5)
        feed.abandon(first)
        second = feed.first(timeout=5)
        assert second.task != first.task and second.records[:3] == [0, 1, 2]
        assert ranges.read_upto[first.task.record.partition] < 100
    finally:
        feed.close()


def test_a_read_error_ends_its_task_with_the_error() -> None:
    feed = TaskFeed(Tasks(count=1, size=30).claim, Ranges(fail_at=15)).start()
    try:
        first = feed.first(timeout=5)
        assert first.records == list(range(10)) and not first.last
        rest = feed.more()
        assert rest.last and rest.records is None
        assert isinstance(rest.error, RangeReadError)
    finally:
        feed.close()


def test_tiny_tasks_are_claimed_ahead_a_few_at_most() -> None:
    tasks = Tasks(count=20, size=1)
    feed = TaskFeed(tasks.claim, Ranges(), chunks_ahead=64, ahead_records=1000).start()
    try:
        wait_until(lambda: len(tasks.claimed) == MAX_AHEAD_TASKS)
        assert_claims_no_more(feed, tasks)  # far fewer than 1000 offsets, but no more
    finally:
        feed.close()


def test_close_hands_back_the_tasks_claimed_and_not_begun() -> None:
    tasks = Tasks(count=4, size=5)
    feed = TaskFeed(tasks.claim, Ranges(), max_tasks=3, ahead_records=10).start()
    first = feed.first(timeout=5)
    wait_until(lambda: len(tasks.claimed) == 3)
    unbegun = feed.close()
    assert first.task.task_id == tasks.claimed[0]
    assert [task.task_id for task in unbegun] == tasks.claimed[1:]
    assert len(tasks.claimed) == 3  # max_tasks: no fourth claim


def test_a_crashed_feed_is_reported_to_the_trainer() -> None:
    def claim() -> ClaimedTask:
        raise ValueError("bug")

    feed = TaskFeed(claim, Ranges()).start()
    try:
        wait_until(lambda: not feed._thread.is_alive())
        try:
            feed.first(timeout=0.05)
        except RuntimeError as exc:
            assert isinstance(exc.__cause__, ValueError)
        else:
            raise AssertionError("the crash was not reported")
    finally:
        feed.close()


def test_nothing_to_claim_waits_quietly() -> None:
    calls = threading.Event()

    def claim() -> None:
        calls.set()
        return None

    feed = TaskFeed(claim, Ranges()).start()
    try:
        assert feed.first(timeout=0.3) is None
        assert calls.is_set()
    finally:
        assert feed.close() == []


class Beats:
    """A heartbeat that counts, returning each task with a new value (as etcd's would);
    `lost` tasks raise TaskLostError."""

    def __init__(self, lost: set[str] = frozenset()) -> None:
        self.calls: list[str] = []
        self.called_at: dict[str, list[float]] = {}  # per task, time.monotonic() as each call began
        self.lost = lost

    def __call__(self, task: ClaimedTask) -> ClaimedTask:
        self.called_at.setdefault(task.task_id, []).append(time.monotonic())
        self.calls.append(task.task_id)
        if task.task_id in self.lost:
            raise TaskLostError(task.task_id)
        return ClaimedTask(task.record, task.value + b"+")


def test_tasks_claimed_ahead_are_heartbeaten_until_begun_and_begun_as_last_heartbeaten() -> None:
    """A slow task in training must not let the one claimed behind it time out: the feed
    heartbeats it, and the trainer takes it with the value its heartbeats compare against."""
    tasks, beats = Tasks(count=2, size=25), Beats()
    ahead, behind = (task.task_id for task in tasks.todo)
    feed = TaskFeed(tasks.claim, Ranges(), chunks_ahead=2, heartbeat=beats, heartbeat_every_s=0.02).start()
    try:
        wait_until(lambda: beats.calls.count(ahead) >= 3)  # unbegun, its chunks waiting for room
        first = feed.first(timeout=5)
        assert first.task.value == b"+" * beats.calls.count(first.task.task_id)
        # The last heartbeat's time, not the claim's: the feed reads the clock after each
        # heartbeat returns, so the time it hands on is at or after the last call began; the
        # claim's time is before the first call began (a heartbeat is due `heartbeat_every_s`
        # after the claim, and the chunk's time is taken before any heartbeat is sent).
        last_beat = beats.called_at[first.task.task_id][-1]
        assert last_beat <= first.claimed_at <= time.monotonic(), (first.claimed_at, beats.called_at)
        begun = beats.calls.count(first.task.task_id)
        while not feed.more().last:
            pass
        wait_until(lambda: beats.calls.count(behind) >= 2)
        assert beats.calls.count(ahead) == begun  # begun: the trainer's to heartbeat now
        unbegun = feed.close()
        assert [t.value for t in unbegun] == [b"+" * beats.calls.count(behind)]
    finally:
        feed.close()


def test_a_task_lost_while_claimed_ahead_is_begun_as_due_for_a_heartbeat() -> None:
    tasks = Tasks(count=1, size=25)
    beats = Beats(lost={tasks.todo[0].task_id})
    feed = TaskFeed(tasks.claim, Ranges(), heartbeat=beats, heartbeat_every_s=0.02).start()
    try:
        wait_until(lambda: len(beats.calls) == 1)
        assert_claims_no_more(feed, tasks)
        assert len(beats.calls) == 1  # lost: not heartbeaten again
        first = feed.first(timeout=5)
        assert first.claimed_at == -math.inf  # the trainer's check on beginning it finds it lost
    finally:
        feed.close()

"""Tasks and their records ahead of training: a thread claims the next task and has its range
read and decoded (trainer/loader.py) while the trainer trains the one before.

Claiming is a round trip to etcd and reading a range waits on the broker's fetches; done in
line, the trainer sits idle for both at every task. The feed claims another task while the
tasks it holds that the trainer has not begun span fewer than `ahead_records` offsets, and
are fewer than `MAX_AHEAD_TASKS`: small tasks are claimed two or more ahead, so a claim, a
fetch or a loader descheduled for a moment does not leave the trainer waiting, while a
trainer never hoards more than that of a bounded input's tail (nor hundreds of the tiny
tasks cut at the head of a live stream). Records are handed over in chunks through a short queue
(so a large task is never all in memory), and nothing is claimed while the job is paused.
Tasks it claimed that the trainer never began are handed back by `close`, for the trainer
to release.

A task claimed ahead can wait in the feed longer than the job's task timeout (a slow task
trains before it); the feed heartbeats it every `heartbeat_every_s` until it is begun, or the
master would requeue it and, after a few such waits, fail it for good. The trainer takes it
with the value of its last heartbeat (`Chunk.task`), and heartbeats it itself from then on.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Generator
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any, Protocol

from streamtrain.jobstate.errors import EtcdError, TaskLostError
from streamtrain.jobstate.tasks import ClaimedTask

log = logging.getLogger(__name__)


class Source(Protocol):
    def read(self, topic: str, partition: int, start: int, end: int) -> Generator[Any, None, None]:
        """The range's records in chunks, in offset order (closed early if the task is
        given up)."""


@dataclass(frozen=True)
class Chunk:
    """Records of one task in offset order; a chunk with `last` set ends the task, with no
    records, or with `error` if the range could not be read to its end."""

    task: ClaimedTask  # as of its last heartbeat, in the chunk `first` returns
    claimed_at: float  # time.monotonic() of the claim, or of its last heartbeat in `first`'s chunk
    records: Any = None  # one chunk of the source's (a `trainer.loader.Loaded`)
    last: bool = False
    error: Exception | None = None  # the range could not be read (RangeReadError) or worse


# Each task ahead hides one claim and one first fetch; beyond a few that buys nothing more.
MAX_AHEAD_TASKS = 4


class TaskFeed:
    def __init__(self, claim: Callable[[], ClaimedTask | None], source: Source, max_tasks: int | None = None,
                 chunks_ahead: int = 4, ahead_records: int = 1,
                 heartbeat: Callable[[ClaimedTask], ClaimedTask] | None = None,
                 heartbeat_every_s: float = 10.0) -> None:
        self._claim = claim
        self._heartbeat = heartbeat
        self._heartbeat_every_s = heartbeat_every_s
        # Unbegun task id -> its value as of its claim or last heartbeat, and the time of that.
        self._beats: dict[str, tuple[ClaimedTask, float]] = {}
        self._source = source
        self._max_tasks = max_tasks
        self._ahead_records = ahead_records
        self._chunks: queue.Queue[Chunk] = queue.Queue(chunks_ahead)
        self._closing = threading.Event()
        self._abandoned: str | None = None  # task id the trainer gave up: stop reading it
        self._unbegun: list[ClaimedTask] = []  # claimed, first chunk not yet taken
        self._crashed: BaseException | None = None
        # Times the feed found enough claimed ahead and waited: two more than at some moment
        # prove it has since decided not to claim on what it held then (tests rely on it).
        self.full_waits = 0
        self._lock = threading.Lock()
        self._begun = threading.Condition(self._lock)  # notified when the trainer begins a task
        self._thread = threading.Thread(target=self._run, name="task-feed", daemon=True)

    def start(self) -> TaskFeed:
        self._thread.start()
        return self

    # -- the trainer's side --------------------------------------------------------------
    def first(self, timeout: float) -> Chunk | None:
        """The first chunk of the next task, or None if none came within `timeout`."""
        try:
            chunk = self._chunks.get(timeout=timeout)
        except queue.Empty:
            if self._crashed is not None:
                raise RuntimeError("the task feed stopped") from self._crashed
            return None
        with self._begun:
            self._unbegun = [task for task in self._unbegun if task is not chunk.task]
            latest = self._beats.pop(chunk.task.task_id, None)
            self._begun.notify()
        return chunk if latest is None else replace(chunk, task=latest[0], claimed_at=latest[1])

    def more(self) -> Chunk:
        """The next chunk of the task begun (blocks while the feed reads it)."""
        return self._chunks.get()

    def abandon(self, chunk: Chunk) -> None:
        """The trainer gives up the task of `chunk` (lost, failed, released): drop the rest of
        its records, reading no more of them."""
        self._abandoned = chunk.task.task_id
        while not chunk.last:
            chunk = self._chunks.get()
        self._abandoned = None  # the feed is past that task now

    def close(self) -> list[ClaimedTask]:
        """Stop; returns the tasks claimed that the trainer never began."""
        self._closing.set()
        while self._thread.is_alive():
            try:  # unblock a feed waiting for room in the queue
                self._chunks.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(0.05)
        with self._lock:
            return [self._latest(task) for task in self._unbegun]

    def _latest(self, task: ClaimedTask) -> ClaimedTask:
        """`task` as of its last heartbeat (lock held)."""
        beat = self._beats.get(task.task_id)
        return task if beat is None else beat[0]

    # -- the feed's thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._claim_and_read()
        except BaseException as exc:  # surfaced to the trainer by `first`
            log.exception("task feed stopped")
            self._crashed = exc

    def _claim_and_read(self) -> None:
        claimed = 0
        while not self._closing.is_set() and (self._max_tasks is None or claimed < self._max_tasks):
            self._keep_alive()
            with self._begun:
                if (self._unbegun_offsets() >= self._ahead_records
                        or len(self._unbegun) >= MAX_AHEAD_TASKS):
                    self.full_waits += 1
                    self._begun.wait(0.1)
                    continue
            task = self._claim_next()
            if task is None:
                continue
            claimed += 1
            self._feed(task, time.monotonic())

    def _claim_next(self) -> ClaimedTask | None:
        try:
            task = self._claim()
        except EtcdError as exc:
            log.warning("task feed: %s; retrying", exc)
            self._closing.wait(1.0)
            return None
        if task is None:
            self._closing.wait(0.2)
            return None
        with self._lock:
            self._unbegun.append(task)
            self._beats[task.task_id] = (task, time.monotonic())
        return task

    def _unbegun_offsets(self) -> int:
        return sum(task.record.end - task.record.start for task in self._unbegun)

    def _feed(self, task: ClaimedTask, claimed_at: float) -> None:
        record = task.record
        try:
            with closing(self._source.read(record.topic, record.partition, record.start, record.end)) as read:
                for records in read:
                    if not self._put(Chunk(task, claimed_at, records)):
                        return
                    if self._abandoned == task.task_id:
                        break
        except Exception as exc:  # noqa: BLE001  the trainer decides (trainer/policy.task_end)
            self._put(Chunk(task, claimed_at, last=True, error=exc))
            return
        self._put(Chunk(task, claimed_at, last=True))

    def _put(self, chunk: Chunk) -> bool:
        while not self._closing.is_set():
            try:
                self._chunks.put(chunk, timeout=0.1)
                return True
            except queue.Full:
                self._keep_alive()
        return False

    def _keep_alive(self) -> None:
        """Heartbeat the unbegun tasks last heartbeaten (or claimed) `heartbeat_every_s` ago.
        The lock is held across each call, so the trainer never begins a task with a value
        a heartbeat in flight is about to replace."""
        if self._heartbeat is None:
            return
        now = time.monotonic()
        with self._lock:
            due = [task for task in self._unbegun
                   if self._heartbeat_every_s <= now - self._beats[task.task_id][1] < math.inf]
            for task in due:
                try:
                    self._beats[task.task_id] = (self._heartbeat(self._latest(task)), time.monotonic())
                except TaskLostError:
                    # Requeued already; beaten "never", so the trainer's own heartbeat finds
                    # that as it begins the task, and drops it.
                    self._beats[task.task_id] = (self._latest(task), -math.inf)
                except EtcdError as exc:
                    log.warning("task feed: heartbeat of %s: %s; retrying", task.task_id, exc)

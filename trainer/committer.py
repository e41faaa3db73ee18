"""Finishing a trainer's pushes and tasks in the background: waiting for the broker's
acknowledgements, committing a task's side outputs, then completing it in etcd, while the
trainer trains on.

The training thread hands each push over once its deltas are produced (`hand`) and never waits
for a broker round trip. The committer's one thread runs `Delivery.commit` for whatever has been
handed since its last one: every delta sent so far acknowledged (and, at a task's end, its DLQ
letters and metrics record committed). A task's end (`end`) is completed in etcd only after
that, and after every push handed before it, so a completed task's groups are all in the shards'
topics (pserver/dedup.py folds its ledger on that).

A zombie (a trainer frozen past its task's timeout, then resumed) learns that it lost its task
from a heartbeat: the trainer's own every third of the timeout, and the committer's before it
completes a task. Groups it sends meanwhile are dropped by the shards' ledger: the rescuer's
copies of a group and the zombie's share `(task_id, seq)`, and the first to arrive is the one
applied. A failed commit gives back the tasks whose pushes it covered (fails them if the
broker refused a message); the trainer learns it at its next `hand` or `raise_failed`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from streamtrain.jobstate.errors import EtcdError, TaskLostError
from streamtrain.jobstate.tasks import ClaimedTask, TaskClient
from streamtrain.trainer.delivery import Delivery, DeliveryError, Messages
from streamtrain.trainer.metrics import TaskMetrics
from streamtrain.trainer.policy import COMPLETE_RETRY_S, task_end

Ending = Literal["done", "lost", "failed", "released"]


def one_commit(ends: list[bool]) -> int:
    """How many of the queued items (`ends`: whether each is a task's end, rather than a push)
    one commit takes: every push up to and including the first task end, so a task is
    completed with exactly the groups handed before it, and pushes queued behind an end wait
    for the next commit."""
    for i, end in enumerate(ends):
        if end:
            return i + 1
    return len(ends)


@dataclass(frozen=True)
class Ended:
    task: ClaimedTask
    metrics: TaskMetrics
    ending: Ending
    reason: str = ""
    commit_s: float | None = None  # the last commit's duration, when it ran


@dataclass
class _Item:
    task_id: str
    messages: Messages
    end: tuple[ClaimedTask, TaskMetrics] | None = None  # set: the task's end
    done: threading.Event = field(default_factory=threading.Event)


class Committer:
    """`on_ended` hears how each task ended, on the committer's thread, as soon as it has (a
    task's metrics must not lag its completion in etcd). At most `depth` task ends and
    `max_handed` groups wait; more waits the training thread."""

    def __init__(self, delivery: Delivery, tasks: TaskClient, on_ended: Callable[[Ended], None],
                 depth: int = 2, max_handed: int = 64) -> None:
        self._delivery = delivery
        self._tasks = tasks
        self._on_ended = on_ended
        self._depth = depth
        self._max_handed = max_handed
        self._queue: deque[_Item] = deque()
        self._cond = threading.Condition()
        self._busy = False  # the thread holds items taken from the queue
        self._failed: dict[str, DeliveryError] = {}  # task id -> why its groups were not committed
        self._error: BaseException | None = None  # a bug on the thread, raised to the caller
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="commit", daemon=True)
        self._thread.start()

    # -- the training thread ---------------------------------------------------------------
    def hand(self, task_id: str) -> None:
        """Wait for the acknowledgement of a push of `task_id` in the background, with whatever
        else waits. Raises the DeliveryError of an earlier push of this task that failed."""
        self.raise_failed(task_id)
        with self._cond:
            self._wait_until(lambda: sum(i.end is None for i in self._queue) < self._max_handed)
            self._queue.append(_Item(task_id, []))
            self._cond.notify_all()

    def end(self, task: ClaimedTask, messages: Messages, metrics: TaskMetrics) -> None:
        """Commit `messages`, then complete `task`, in the background."""
        with self._cond:
            self._wait_until(lambda: sum(i.end is not None for i in self._queue) + self._busy < self._depth)
            self._queue.append(_Item(task.task_id, messages, (task, metrics)))
            self._cond.notify_all()

    def drop(self, task_id: str) -> None:
        """Forget the groups of `task_id` not yet taken for a commit (an attempt given up)."""
        with self._cond:
            self._queue = deque(i for i in self._queue if i.task_id != task_id or i.end is not None)
            self._failed.pop(task_id, None)

    def raise_failed(self, task_id: str) -> None:
        """Raise the DeliveryError of a handed group of `task_id` that could not be committed."""
        self._raise_error()
        with self._cond:
            failed = self._failed.pop(task_id, None)
        if failed is not None:
            raise failed

    def wait(self) -> None:
        """Until everything handed or ended so far is done."""
        with self._cond:
            self._wait_until(lambda: not self._queue and not self._busy)
        self._raise_error()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._thread.join()

    def _wait_until(self, ready: Callable[[], bool]) -> None:
        while not ready() and self._error is None:
            self._cond.wait(0.5)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError("the committer thread failed") from self._error

    # -- the committer's thread ------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._closed:
                        self._cond.wait()
                    if not self._queue:
                        return
                    items = self._take()
                    self._busy = True
                try:
                    self._commit(items)
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
                    for item in items:
                        item.done.set()
        except BaseException as exc:  # a bug, not an outcome: the training thread raises it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _take(self) -> list[_Item]:
        return [self._queue.popleft() for _ in range(one_commit([item.end is not None for item in self._queue]))]

    def _commit(self, items: list[_Item]) -> None:
        ending = items[-1].end
        if ending is not None:
            task, metrics = ending
            with self._cond:
                lost_groups = self._failed.pop(task.task_id, None)
            if lost_groups is not None:  # never complete a task with groups not committed
                items = items[:-1]
                self._undelivered(task, metrics, lost_groups)
                ending = None
        if ending is not None:
            try:
                # A zombie learns here that its task was requeued, before completing it.
                task = self._tasks.heartbeat(task)
            except (TaskLostError, EtcdError) as exc:
                # Not ours any more, or etcd unreachable for a moment (then it times out and is
                # requeued if it still was): the groups handed before still go out below.
                items = items[:-1]
                self._on_ended(Ended(task, metrics, "lost", str(exc)))
                ending = None
        messages = [m for item in items for m in item.messages]
        started = time.perf_counter()
        try:
            self._delivery.commit(messages)
        except DeliveryError as exc:
            with self._cond:
                for item in items:
                    if item.end is None:
                        self._failed[item.task_id] = exc
            if ending is not None:
                self._undelivered(task, metrics, exc)
            return
        if ending is None:
            return
        committed = time.perf_counter() - started
        try:
            self._complete(task)
        except (TaskLostError, EtcdError) as exc:
            self._on_ended(Ended(task, metrics, "lost", str(exc)))
            return
        self._on_ended(Ended(task, metrics, "done", commit_s=committed))

    def _complete(self, task: ClaimedTask) -> None:
        """Complete the task, trying again while etcd does not answer (`COMPLETE_RETRY_S`).
        Safe: the completion is a compare-and-set on the task as this attempt holds it, so a
        try whose reply was lost but applied makes the next one's compare fail, which
        `completed` then tells apart from a task requeued meanwhile."""
        retried = False
        for wait in (*COMPLETE_RETRY_S, None):
            try:
                self._tasks.complete(task)
                return
            except EtcdError:
                if wait is None:
                    raise
                time.sleep(wait)
                retried = True
            except TaskLostError:
                if retried and self._tasks.completed(task):
                    return
                raise

    def _undelivered(self, task: ClaimedTask, metrics: TaskMetrics, exc: DeliveryError) -> None:
        """The task's pushes or side outputs did not go out: failed if the broker refused
        them, else given back (the broker was away), as `policy.task_end` says."""
        with self._cond:  # a later attempt of the task by this trainer starts clean
            self._failed.pop(task.task_id, None)
        end = task_end(exc)
        assert end is not None  # a DeliveryError ends the task (policy.task_end)
        try:
            if end.ending == "failed":
                self._tasks.fail(task, str(exc))
            else:
                self._tasks.release(task, behind=end.behind)
        except (TaskLostError, EtcdError):
            pass
        self._on_ended(Ended(task, metrics, end.ending, str(exc)))

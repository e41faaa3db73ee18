"""Ending a task in the background: its last Kafka transaction, then its completion in etcd,
while the trainer trains the next task.

A commit is a round trip to the broker's transaction coordinator and a completion one to
etcd: about 30 ms per task, in which the trainer would otherwise sit idle. Nothing about
delivery changes: a task is still completed only after its last commit, and an attempt that
lost its task (a zombie) still learns it before committing. Every use of the transactional
producer runs on the committer's one thread, in the order submitted, so a trainer's
transactions never overlap. At most `depth` tasks wait to end, which absorbs the odd slow
commit without holding more than a couple of tasks back from other trainers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from master.errors import CoordinationError, TaskLostError
from master.tasks import ClaimedTask, TaskClient
from trainer.delivery import Delivery, DeliveryError, Messages
from trainer.metrics import TaskMetrics

Ending = Literal["done", "lost", "failed"]


@dataclass(frozen=True)
class Ended:
    task: ClaimedTask
    metrics: TaskMetrics
    ending: Ending
    reason: str = ""
    commit_s: float | None = None  # the last commit's duration, when it ran


class Committer:
    """`on_ended` hears how each task ended, on the committer's thread, as soon as it has (a
    task's metrics must not lag its completion in etcd)."""

    def __init__(self, delivery: Delivery, tasks: TaskClient, on_ended: Callable[[Ended], None],
                 depth: int = 2) -> None:
        self._delivery = delivery
        self._tasks = tasks
        self._on_ended = on_ended
        self._depth = depth
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="commit")
        self._ending: deque[Future[None]] = deque()

    def commit(self, messages: Messages) -> None:
        """Commit now, once every task ending in the background has. Raises DeliveryError."""
        self.wait()
        self._thread.submit(self._delivery.commit, messages).result()

    def end(self, task: ClaimedTask, messages: Messages, metrics: TaskMetrics) -> None:
        """Commit `messages`, then complete `task`, in the background."""
        self._settle(self._depth - 1)
        self._ending.append(self._thread.submit(self._end, task, messages, metrics))

    def wait(self) -> None:
        """Until every task ending in the background has ended."""
        self._settle(0)

    def _settle(self, pending: int) -> None:
        """Until at most `pending` tasks are still ending; raises what an ending raised that
        it does not handle (a bug, not an outcome)."""
        while self._ending and (len(self._ending) > pending or self._ending[0].done()):
            self._ending.popleft().result()

    def _end(self, task: ClaimedTask, messages: Messages, metrics: TaskMetrics) -> None:
        ended = self._ended(task, messages, metrics)
        self._on_ended(ended)

    def _ended(self, task: ClaimedTask, messages: Messages, metrics: TaskMetrics) -> Ended:
        try:
            # A zombie learns here that its task was requeued, before making anything visible.
            task = self._tasks.heartbeat(task)
            started = time.perf_counter()
            self._delivery.commit(messages)
            committed = time.perf_counter() - started
            self._tasks.complete(task)
            return Ended(task, metrics, "done", commit_s=committed)
        except (TaskLostError, CoordinationError) as exc:
            # Not ours any more, or etcd unreachable for a moment (then it times out and is
            # requeued if it still was).
            return Ended(task, metrics, "lost", str(exc))
        except DeliveryError as exc:
            try:
                self._tasks.fail(task, str(exc))
            except (TaskLostError, CoordinationError):
                pass
            return Ended(task, metrics, "failed", str(exc))

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._thread.shutdown()

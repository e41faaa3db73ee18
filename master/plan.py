"""The master's decisions as pure functions of state: what to cut and in which transactions,
fold, expire, restart.

Nothing here touches etcd or Kafka (the service applies the decisions), so every rule can be
tested exhaustively without services. The rules trainers apply too (claim order, retries) are
in jobstate/queue.py; docs/master.md has the queue's design.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from streamtrain.jobstate.sharding import SlotMap
from streamtrain.schemas import PartitionCursor, TaskRecord


def cut(cursor: PartitionCursor, end: int, max_records: int, linger_due: bool,
        budget: int) -> tuple[list[TaskRecord], PartitionCursor]:
    """Contiguous tasks from the cursor towards `end` (the partition's last stable offset).

    Full tasks of `max_records` offsets are cut whenever there is room; the partial task at the
    head of a live stream only once `linger_due` (freshness against task overhead). Bounded
    input stops at `cursor.stop` and cuts its last partial task at once: nothing more is coming.
    At most `budget` tasks, so that a backlog waits in Kafka rather than in etcd.
    """
    limit = end if cursor.stop is None else min(end, cursor.stop)
    start = cursor.next
    tasks: list[TaskRecord] = []
    while len(tasks) < budget and limit - start >= max_records:
        tasks.append(TaskRecord.for_range(cursor.topic, cursor.partition, start,
                                          start + max_records, cursor.pass_no))
        start += max_records
    at_stop = cursor.stop is not None and limit == cursor.stop
    if len(tasks) < budget and start < limit and (linger_due or at_stop):
        tasks.append(TaskRecord.for_range(cursor.topic, cursor.partition, start, limit,
                                          cursor.pass_no))
        start = limit
    return tasks, replace(cursor, next=start)


@dataclass(frozen=True)
class Head:
    """What the slicer knows of one partition: its cursor, its last stable offset, and whether
    its partial head task is due (see `cut`)."""

    cursor: PartitionCursor
    end: int
    linger_due: bool


def cut_rounds(heads: Sequence[Head], max_records: int,
               budget: int) -> tuple[list[list[TaskRecord]], list[PartitionCursor]]:
    """Cut every partition at once, one task from each per round, within a shared `budget`.

    Round k holds the k-th task of each partition that still has one. Written round by round
    and claimed in rounds (`jobstate.queue.claim_order`), a backlog is trained in about the order its records
    arrived, not partition after partition, which a drifting stream would punish. Within a
    round the partition with the most records waiting goes first, so a budget that runs out
    mid-round (or a step with room for one task) serves the partition furthest behind.

    Returns the non-empty rounds and every head's cursor moved past what was cut.
    """
    cursors = [h.cursor for h in heads]
    active = list(range(len(heads)))
    rounds: list[list[TaskRecord]] = []
    while active and budget > 0:
        active.sort(key=lambda i: (-_waiting(cursors[i], heads[i].end),
                                   cursors[i].topic, cursors[i].partition))
        this: list[TaskRecord] = []
        for i in list(active):
            if budget == 0:
                break
            tasks, cursors[i] = cut(cursors[i], heads[i].end, max_records, heads[i].linger_due, 1)
            if tasks:
                this += tasks
                budget -= 1
            else:
                active.remove(i)  # its head only moves forward: nothing more this step
        if this:
            rounds.append(this)
    return rounds, cursors


def _waiting(cursor: PartitionCursor, end: int) -> int:
    return (end if cursor.stop is None else min(end, cursor.stop)) - cursor.next


def transactions(tasks: Sequence[TaskRecord],
                 max_ops: int) -> list[tuple[list[TaskRecord], dict[tuple[str, int], int]]]:
    """`tasks` (in the order they are to be claimed) as consecutive transactions, each with
    the end of its last task in every partition it reaches: the cursor put that covers them.

    Tasks and their cursor go in one transaction, so every offset below a stored cursor belongs
    to exactly one stored task across any crash; each holds as many tasks as fit in `max_ops`
    operations with their cursor puts. Claims take the oldest transaction first
    (`jobstate.queue.claim_order`), so the order of `tasks` is kept.
    """
    if max_ops < 2:
        raise ValueError(f"max_ops {max_ops}: a transaction must hold a task and its cursor")
    out: list[tuple[list[TaskRecord], dict[tuple[str, int], int]]] = []
    i = 0
    while i < len(tasks):
        ends: dict[tuple[str, int], int] = {}
        j = i
        while j < len(tasks):
            p = (tasks[j].topic, tasks[j].partition)
            if (j - i) + len(ends) + (p not in ends) + 1 > max_ops:
                break
            ends[p] = tasks[j].end
            j += 1
        out.append((list(tasks[i:j]), ends))
        i = j
    return out


def fold(cursor: PartitionCursor, resolved: Iterable[TaskRecord],
         limit: int | None = None) -> tuple[PartitionCursor, list[TaskRecord]]:
    """Advance `trained` over resolved (done or failed) tasks that start exactly at it.

    Returns the new cursor and the tasks folded in (at most `limit`, so the deletes fit one
    transaction). Tasks of another pass or below the watermark are ignored; ranges above a
    gap wait for the gap to resolve.
    """
    by_start = {t.start: t for t in resolved
                if t.pass_no == cursor.pass_no and t.start >= cursor.trained}
    trained = cursor.trained
    folded: list[TaskRecord] = []
    while (limit is None or len(folded) < limit) and (task := by_start.get(trained)) is not None:
        folded.append(task)
        trained = task.end
    return (replace(cursor, trained=trained) if folded else cursor), folded


def why_requeue(task: TaskRecord, gone: Mapping[str, float], last_write: float, timed_out: bool,
                timeout_s: float) -> str | None:
    """Why a pending task must go back to todo now, or None. A trainer that was a member and
    left (`gone`: when its membership lease ended: it died, or stopped without releasing)
    gives back the tasks it has not written since (`last_write`, its claim or last heartbeat):
    one that still heartbeats is alive, its lease only lapsed, and it keeps its task. Any
    other waits for the task timeout, which also covers trainers the master never saw (a
    master that just started, a client without membership). Times are the master's clock."""
    left = gone.get(task.trainer_id) if task.trainer_id is not None else None
    if left is not None and last_write <= left:
        return f"trainer {task.trainer_id} left (its membership lease ended)"
    if timed_out:
        return f"timed out after {timeout_s:g} s on trainer {task.trainer_id}"
    return None


def next_pass(cursors: Iterable[PartitionCursor], passes: int,
              open_passes: Iterable[int]) -> tuple[str, list[PartitionCursor]]:
    """Bounded input: when the lowest pass is trained everywhere and none of its tasks is
    open (todo or pending), restart every partition of that pass at its origin with pass + 1.

    Returns ("running" | "advance" | "finished", cursors to write). Partitions already moved
    on (a master died halfway through an advance) are left alone, so the step is idempotent.
    """
    cursors = list(cursors)
    if not cursors or any(c.stop is None for c in cursors):
        return "running", []
    low = min(c.pass_no for c in cursors)
    lowest = [c for c in cursors if c.pass_no == low]
    if low in set(open_passes) or not all(c.complete for c in lowest):
        return "running", []
    if low + 1 >= passes:
        return "finished", []
    return "advance", [replace(c, next=c.origin, trained=c.origin, pass_no=low + 1) for c in lowest]


def layout_refused(job: str, slots: int, shards: int, mapped: SlotMap | None) -> str | None:
    """Why a master must not lead `job` with the job file's `shards` pserver shards over
    `slots` slots, given the job's slot map in etcd, or None if it may (it then leads with the
    map's shard count): a job without a map yet gets the file's. A changed count would leave
    the map owning slots to shards that never register (pulls stall) or shards that own
    nothing; a changed slot count would rehash every parameter. Once `streamtrain resize` has
    changed the map (epoch > 0), the count is the map's and `streamtrain resize` changes it:
    the file's count only set the one the job began with (were it held to the map's, a master
    restarted after the next resize, with its job file unchanged, would never lead again)."""
    if mapped is None or mapped.slots == slots and (shards == mapped.shards or mapped.epoch > 0):
        return None
    return (f"job {job!r}: the job file asks for pservers.count = {shards} over pservers.slots = {slots}, "
            f"but the job's slot map in etcd spreads {mapped.slots} slots over {mapped.shards} shard(s), and its "
            f"parameters live where that map says. Set pservers.count = {mapped.shards} and pservers.slots = "
            f"{mapped.slots}, or resize the job with `streamtrain resize --pservers {shards}`, or start afresh "
            f"under another job name")

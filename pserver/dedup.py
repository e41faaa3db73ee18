"""Which gradient deltas a shard has applied: `(task_id, seq)` exactly once, in bounded memory.

Why a max per task is enough: a trainer cuts a task into deterministic push groups numbered
0, 1, 2, … and sends them in order through one idempotent producer that leaves no gaps
(trainer/delivery.py), so every attempt of a task delivers its groups to a shard in increasing
`seq` (a shard may get no delta for some group, the same in every attempt). Two attempts'
copies may interleave; the first copy of each `seq` to arrive is applied and the later one
dropped, because a delta is new iff its seq is above the highest applied for its task: for a
copy to be dropped wrongly, a higher seq would have had to arrive first from both attempts,
which their order forbids. A re-run attempt, or a zombie resuming after its task was
requeued, repeats seqs already applied and is dropped.

Why memory stays bounded: once the master's watermark for a partition has passed a task, the
task is complete and no delta of it can be new. The shard folds the per-task entries below the
watermark away, but only after it has consumed everything written when it read the
watermark — up to the log end (a trainer has every delta of a task acknowledged before it
completes the task, so that is enough: folding earlier could drop a delta still in flight).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamtrain.schemas import LedgerEntry, LedgerSnapshot, TaskRecord, partition_label

Partition = tuple[str, int]


@dataclass
class _PartitionLedger:
    pass_no: int = 0
    watermark: int = 0  # every task of this pass starting below it is fully applied
    max_seq: dict[int, int] = field(default_factory=dict)  # task start -> highest applied seq


class Dedup:
    def __init__(self) -> None:
        self._ledgers: dict[Partition, _PartitionLedger] = {}
        self.dropped = 0

    def admit(self, task_id: str, seq: int) -> bool:
        """True (and recorded) if this delta is new; False for a duplicate or a stale one."""
        task = TaskRecord.parse_id(task_id)
        ledger = self._ledgers.setdefault((task.topic, task.partition), _PartitionLedger())
        if task.pass_no < ledger.pass_no or (task.pass_no == ledger.pass_no and task.start < ledger.watermark):
            self.dropped += 1
            return False
        if task.pass_no > ledger.pass_no:
            # The partition moved on to a new pass: the old pass is complete.
            ledger.pass_no, ledger.watermark, ledger.max_seq = task.pass_no, 0, {}
        if seq <= ledger.max_seq.get(task.start, -1):
            self.dropped += 1
            return False
        ledger.max_seq[task.start] = seq
        return True

    def fold(self, watermarks: dict[Partition, tuple[int, int]]) -> None:
        """Forget tasks below the master's watermarks: {(topic, partition): (pass_no, trained)}.

        Call only once everything committed before the watermarks were read is consumed.
        """
        for tp, (pass_no, trained) in watermarks.items():
            ledger = self._ledgers.setdefault(tp, _PartitionLedger())
            if pass_no < ledger.pass_no:
                continue
            if pass_no > ledger.pass_no:
                ledger.pass_no, ledger.max_seq = pass_no, {}
                ledger.watermark = 0
            ledger.watermark = max(ledger.watermark, trained)
            ledger.max_seq = {s: q for s, q in ledger.max_seq.items() if s >= ledger.watermark}

    def marks(self) -> dict[Partition, tuple[int, int]]:
        """{(topic, partition): (pass_no, watermark)}: what `fold` was last given, per partition."""
        return {tp: (ledger.pass_no, ledger.watermark) for tp, ledger in self._ledgers.items()}

    def watermarks(self) -> dict[str, int]:
        """{"topic:partition": offset below which every task is applied}, for the manifest."""
        return {partition_label(t, p): ledger.watermark for (t, p), ledger in sorted(self._ledgers.items())}

    @property
    def entries(self) -> int:
        return sum(len(ledger.max_seq) for ledger in self._ledgers.values())

    def to_json(self) -> bytes:
        """For the checkpoint: replaying the gradient topic from the checkpoint's offsets must
        drop exactly what the shard had dropped."""
        return LedgerSnapshot(self.dropped, tuple(
            LedgerEntry(t, p, ledger.pass_no, ledger.watermark, tuple(sorted(ledger.max_seq.items())))
            for (t, p), ledger in sorted(self._ledgers.items()))).to_json()

    @classmethod
    def from_json(cls, data: bytes) -> Dedup:
        """Raises: SchemaError."""
        snapshot = LedgerSnapshot.from_json(data)
        dedup = cls()
        dedup.dropped = snapshot.dropped
        for p in snapshot.partitions:
            dedup._ledgers[(p.topic, p.partition)] = _PartitionLedger(p.pass_no, p.watermark, dict(p.max_seq))
        return dedup

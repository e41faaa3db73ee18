"""`TaskReport`: what a trainer reports of each task it trained, one record per attempt on
`<job>.metrics` (keyed by task id, written in the task's transaction with its side outputs).

Read by the live view and `LocalJob.status` (rolling AUC, loss, freshness), `streamtrain
curves` (TensorBoard) and the tests. `loss` and `auc` are None for a task with no examples
(and `auc` for one whose labels hold a single class); `auc` is prequential: every example was
scored before its mini-batch trained.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from . import _json
from ._check import Check

VERSION = 1


@dataclass(frozen=True)
class TaskReport:
    task_id: str
    trainer_id: str
    attempt: int
    examples: int
    bad_records: int
    positives: int
    loss: float | None
    auc: float | None
    pull_s: float
    compute_s: float
    push_s: float
    started_at: float
    finished_at: float
    max_event_time_ms: int = 0  # the newest event time among its examples (0: none carried one)

    def __post_init__(self) -> None:
        _report.text("task_id", self.task_id)
        _report.text("trainer_id", self.trainer_id)
        for key in ("attempt", "examples", "bad_records", "positives", "max_event_time_ms"):
            _report.integer(key, getattr(self, key))
        for key in ("pull_s", "compute_s", "push_s", "started_at", "finished_at"):
            _report.number(key, getattr(self, key))
        if self.loss is not None:
            _report.number("loss", self.loss)
        if self.auc is not None and not 0 <= _report.number("auc", self.auc) <= 1:
            raise _report.error("auc", f"{self.auc} is outside [0, 1]")

    def to_json(self) -> bytes:
        return _json.dumps({"v": VERSION, **asdict(self)})

    @classmethod
    def from_json(cls, data: bytes | str) -> TaskReport:
        """Raises: SchemaError."""
        doc = _json.loads(_report, data)
        (task_id, trainer_id, attempt, examples, bad_records, positives, loss, auc, pull_s, compute_s, push_s,
         started_at, finished_at) = _json.required(_report, doc, "task_id", "trainer_id", "attempt", "examples",
                                                   "bad_records", "positives", "loss", "auc", "pull_s", "compute_s",
                                                   "push_s", "started_at", "finished_at")
        return cls(task_id, trainer_id, attempt, examples, bad_records, positives, loss, auc, pull_s, compute_s,
                   push_s, started_at, finished_at, doc.get("max_event_time_ms", 0))


_report = Check("TaskReport", VERSION)

"""What a trainer reports per task to `<job>.metrics` (`TaskReport`): loss, prequential AUC,
counts, timings.

Prequential: every example is scored by the model *before* the gradient of its mini-batch is
computed, so the AUC is an honest out-of-sample estimate on a stream that is never held out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from streamtrain.schemas import TaskReport


def auc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """Area under the ROC curve by ranks (ties share their average rank); None when the labels
    hold a single class, where AUC is undefined."""
    labels = np.asarray(labels, dtype=np.float64) > 0.5
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return None
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    # Average rank of each run of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


@dataclass
class TaskMetrics:
    task_id: str
    trainer_id: str
    attempt: int
    examples: int = 0
    bad_records: int = 0
    loss_sum: float = 0.0
    pull_s: float = 0.0
    compute_s: float = 0.0
    push_s: float = 0.0
    started_at: float = field(default_factory=time.time)
    max_event_time_ms: int = 0
    _labels: list[np.ndarray] = field(default_factory=list, repr=False)
    _scores: list[np.ndarray] = field(default_factory=list, repr=False)

    def observe(self, labels: np.ndarray, scores: np.ndarray, loss_sum: float) -> None:
        self._labels.append(labels)
        self._scores.append(scores)
        self.examples += len(labels)
        self.loss_sum += loss_sum

    def _observed(self) -> tuple[np.ndarray, np.ndarray]:
        labels = np.concatenate(self._labels) if self._labels else np.zeros(0)
        scores = np.concatenate(self._scores) if self._scores else np.zeros(0)
        return labels, scores

    def auc(self) -> float | None:
        """Prequential AUC of the examples so far (None with a single class)."""
        return auc(*self._observed())

    def report(self) -> TaskReport:
        """The task's record for `<job>.metrics`, as of now."""
        labels, scores = self._observed()
        return TaskReport(self.task_id, self.trainer_id, self.attempt, self.examples, self.bad_records,
                          int((labels > 0.5).sum()), self.loss_sum / self.examples if self.examples else None,
                          auc(labels, scores), self.pull_s, self.compute_s, self.push_s, self.started_at, time.time(),
                          self.max_event_time_ms)

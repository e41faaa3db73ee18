"""The joiner's decisions, without Kafka: which impressions wait, which close, with what label.

Each impression waits for its click until event time has passed `ts + window + grace`; a click
at most `window` after its impression makes label 1, anything else label 0. A click may arrive
before its impression (they travel on different topics), so an unmatched click waits too, for
as long as its impression could still be shown within the window; a click whose impression
already closed (too late, or a repeat) is dropped when it expires. Every change to the waiting
set is returned as a `StateChange`, which the joiner writes to its changelog in the same
transaction as the outputs (the value a `schemas.JoinWaiting`), so a restart rebuilds exactly
this state.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from streamtrain.schemas import Example, ImpressionRecord, JoinWaiting


@dataclass(frozen=True)
class StateChange:
    impression_id: str
    partition: int
    waiting: JoinWaiting | None  # None: resolved, delete it


@dataclass(frozen=True)
class Emit:
    impression_id: str
    example: Example


@dataclass
class JoinCounters:
    positives: int = 0
    negatives: int = 0
    clicks_dropped: int = 0  # clicks whose impression never came within the window


class JoinState:
    def __init__(self, window_ms: int, grace_ms: int) -> None:
        self.window_ms = window_ms
        self.grace_ms = grace_ms
        self.waiting: dict[str, JoinWaiting] = {}
        self._deadlines: list[tuple[int, str]] = []  # (expiry ms, id), stale entries skipped
        self.counters = JoinCounters()

    def restore(self, impression_id: str, waiting: JoinWaiting | None) -> None:
        """Apply one changelog record (replayed in order at assignment)."""
        if waiting is None:
            self.waiting.pop(impression_id, None)
        else:
            self.waiting[impression_id] = waiting
            heapq.heappush(self._deadlines, (self._expiry(waiting), impression_id))

    def drop_partitions(self, partitions: set[int]) -> None:
        self.waiting = {k: w for k, w in self.waiting.items() if w.partition not in partitions}

    def on_impression(self, imp: ImpressionRecord, partition: int) -> tuple[list[Emit], list[StateChange]]:
        held = self.waiting.get(imp.impression_id)
        if held is not None and held.impression is not None:
            return [], []  # a repeated impression: the first one is already waiting
        if held is not None and held.click_ms is not None:
            return self._resolve(imp.impression_id, imp, held.click_ms, partition)
        return self._wait(imp.impression_id, JoinWaiting(partition, imp, None))

    def on_click(self, impression_id: str, click_ms: int, partition: int) -> tuple[list[Emit], list[StateChange]]:
        held = self.waiting.get(impression_id)
        if held is not None and held.impression is not None:
            return self._resolve(impression_id, held.impression, click_ms, partition)
        if held is not None and held.click_ms is not None and held.click_ms <= click_ms:
            return [], []  # the earlier click is the one that counts
        return self._wait(impression_id, JoinWaiting(partition, None, click_ms))

    def expire(self, watermark_ms: int) -> tuple[list[Emit], list[StateChange]]:
        """Close everything whose time has passed: impressions get label 0, clicks are dropped."""
        emits, changes = [], []
        while self._deadlines and self._deadlines[0][0] < watermark_ms:
            expiry, impression_id = heapq.heappop(self._deadlines)
            held = self.waiting.get(impression_id)
            if held is None or self._expiry(held) != expiry:
                continue  # resolved or replaced since this deadline was set
            del self.waiting[impression_id]
            changes.append(StateChange(impression_id, held.partition, None))
            if held.impression is None:
                self.counters.clicks_dropped += 1
            else:
                emits.append(self._emit(impression_id, held.impression, 0.0))
        return emits, changes

    def _wait(self, impression_id: str, waiting: JoinWaiting) -> tuple[list[Emit], list[StateChange]]:
        self.restore(impression_id, waiting)
        return [], [StateChange(impression_id, waiting.partition, waiting)]

    def _resolve(self, impression_id: str, imp: ImpressionRecord, click_ms: int,
                 partition: int) -> tuple[list[Emit], list[StateChange]]:
        self.waiting.pop(impression_id, None)
        label = 1.0 if click_ms - imp.event_time_ms <= self.window_ms else 0.0
        return [self._emit(impression_id, imp, label)], [StateChange(impression_id, partition, None)]

    def _emit(self, impression_id: str, imp: ImpressionRecord, label: float) -> Emit:
        if label:
            self.counters.positives += 1
        else:
            self.counters.negatives += 1
        return Emit(impression_id, imp.to_example(label))

    def _expiry(self, waiting: JoinWaiting) -> int:
        # An unmatched click waits as long as any impression it could belong to (shown before
        # the click) can still be open: that impression closes before this does.
        ts = waiting.impression.event_time_ms if waiting.impression is not None else waiting.click_ms
        assert ts is not None  # what waits is an impression, a click, or both
        return ts + self.window_ms + self.grace_ms

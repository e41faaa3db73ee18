"""A live synthetic click log: impressions now, each click later, at a paced rate.

Impressions go to one topic and clicks to another, both keyed by impression id. A clicked
impression's click is sent when its delay (log-normal, from the click model) has passed in
real time, and carries that time as its event time, so the two topics look like a real log:
clicks arrive out of step with their impressions and a few very late. Clicks later than
`max_click_delay_ms` never happen (the user has left). With `examples_topic`, labelled examples
(label = clicked, at any delay) go straight to a topic instead, for when no joiner is wanted.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from streamtrain.producers.clickmodel import ClickModel, ClickModelConfig, Impression
from streamtrain.producers.pacing import TokenBucket
from streamtrain.producers.sink import KafkaSink
from streamtrain.schemas import ClickRecord, ImpressionRecord

# Impressions generated per model call: vectorised generation, bounded memory.
_CHUNK = 1000


@dataclass(frozen=True)
class SyntheticSourceConfig:
    impressions_topic: str | None = None
    clicks_topic: str | None = None
    examples_topic: str | None = None
    rate: float = 1000.0  # impressions per second; 0 = as fast as Kafka takes them
    count: int | None = None  # impressions to write; None = until stopped
    start: int = 0  # index of the first impression (to continue a log where it stopped)
    max_click_delay_ms: int = 30_000
    model: ClickModelConfig = field(default_factory=ClickModelConfig)

    def __post_init__(self) -> None:
        if (self.impressions_topic is None) != (self.clicks_topic is None):
            raise ValueError("a click log needs both an impressions topic and a clicks topic")
        if self.impressions_topic is None and self.examples_topic is None:
            raise ValueError("nothing to write: give impressions and clicks topics, or an examples topic")
        if self.count is not None and self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count}")
        if self.max_click_delay_ms < 0:
            raise ValueError(f"max_click_delay_ms must be >= 0, got {self.max_click_delay_ms}")


@dataclass
class SourceStats:
    impressions: int = 0
    clicks: int = 0
    examples: int = 0
    clicks_dropped: int = 0  # clicked, but later than max_click_delay_ms or pending at a stop


class SyntheticSource:
    def __init__(self, config: SyntheticSourceConfig, sink: KafkaSink,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.model = ClickModel(config.model)
        self._sink = sink
        self._clock = clock
        self._bucket = TokenBucket(config.rate)
        self._pending: list[tuple[int, str]] = []  # (due ms, impression id): a heap
        self.stats = SourceStats()

    def run(self, stop: threading.Event | None = None) -> SourceStats:
        """Write until `count` impressions and their clicks are out, or `stop` is set (pending
        clicks are then dropped). Flushes before returning.

        Raises: DeliveryError.
        """
        stop = stop or threading.Event()
        index, end = self.config.start, None if self.config.count is None else self.config.start + self.config.count
        while not stop.is_set() and (end is None or index < end):
            size = _CHUNK if end is None else min(_CHUNK, end - index)
            for imp in self.model.impressions(size, start=index):
                while (wait := self._bucket.delay()) > 0 and not stop.is_set():
                    self._send_due_clicks()
                    time.sleep(min(wait, self._until_next_click()))
                if stop.is_set():
                    break
                self._send(imp)
            index += size
        while self._pending and not stop.is_set():
            self._send_due_clicks()
            time.sleep(self._until_next_click())
        self.stats.clicks_dropped += len(self._pending)
        self._sink.flush()
        return self.stats

    def _send(self, imp: Impression) -> None:
        now = self._now_ms()
        cfg = self.config
        record = ImpressionRecord(imp.impression_id, now, {k: (v,) for k, v in imp.sparse.items()}, imp.dense)
        if cfg.impressions_topic is not None:
            self._sink.send(cfg.impressions_topic, record.to_json(), key=imp.impression_id)
            self.stats.impressions += 1
            if imp.clicked and imp.click_delay_ms is not None and imp.click_delay_ms <= cfg.max_click_delay_ms:
                heapq.heappush(self._pending, (now + imp.click_delay_ms, imp.impression_id))
            elif imp.clicked:
                self.stats.clicks_dropped += 1
        if cfg.examples_topic is not None:
            example = record.to_example(1.0 if imp.clicked else 0.0)
            self._sink.send(cfg.examples_topic, example.to_json(), key=imp.impression_id)
            self.stats.examples += 1
        self._send_due_clicks(now)

    def _send_due_clicks(self, now: int | None = None) -> None:
        now = self._now_ms() if now is None else now
        while self._pending and self._pending[0][0] <= now:
            assert self.config.clicks_topic is not None  # clicks pend only with both topics set
            due, impression_id = heapq.heappop(self._pending)
            self._sink.send(self.config.clicks_topic, ClickRecord(impression_id, due).to_json(), key=impression_id)
            self.stats.clicks += 1

    def _until_next_click(self) -> float:
        # Sleep at most 50 ms at a time so a stop is noticed promptly.
        if not self._pending:
            return 0.05
        return min(0.05, max(0.0, (self._pending[0][0] - self._now_ms()) / 1000))

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

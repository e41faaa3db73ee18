"""Join impressions with clicks into labelled examples, exactly once across crashes.

Consume-transform-produce in Kafka transactions (confluent-kafka): the examples emitted, the
changes to the waiting set (a compacted changelog topic, `<group>.state`) and the consumed input
offsets are committed in one transaction, every `commit_ms`. A SIGKILL aborts the open
transaction (the next instance's `init_transactions` fences it); the restart rebuilds the
waiting set from the changelog and resumes from the committed offsets, so each impression's
example is committed once: never twice, never lost. Consumers of the output must read with
`isolation.level=read_committed` (the trainers do).

Why not faust: see docs/producers.md (its exactly-once mode sends to a sink topic outside the
transaction here, so a crash duplicates output).

Event time: the watermark is the minimum, over assigned input partitions that still have data,
of the newest event time seen; a partition at its end and quiet for `idle_ms` stops holding it
back, and when every partition is quiet the wall clock (less `idle_ms`) drives it, so the tail
of a finished log still closes. Impressions and clicks topics must be co-partitioned: the same
partition count, keyed by impression id with the same partitioner (one producer writes both).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from streamtrain.producers.errors import ProducerError
from streamtrain.producers.joinstate import Emit, JoinState, StateChange
from streamtrain.schemas import ClickRecord, ImpressionRecord, JoinWaiting, SchemaError

log = logging.getLogger("streamtrain.joiner")


class JoinerError(ProducerError):
    """The joiner cannot go on (misconfigured topics, a failed transaction); restart it: the
    open transaction is aborted and nothing committed is lost."""


@dataclass(frozen=True)
class JoinerConfig:
    impressions_topic: str
    clicks_topic: str
    output_topic: str
    window_ms: int = 10_000
    group: str = "join"
    grace_ms: int = 1_000  # how long event time waits for a straggling click
    idle_ms: int = 2_000
    commit_ms: int = 200
    instance: str = "0"  # distinct per concurrently running joiner of one group

    def __post_init__(self) -> None:
        if len({self.impressions_topic, self.clicks_topic, self.output_topic}) != 3:
            raise ValueError("impressions, clicks and output must be three different topics")
        for name in ("window_ms", "grace_ms", "idle_ms", "commit_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def state_topic(self) -> str:
        return f"{self.group}.state"


class Joiner:
    def __init__(self, config: JoinerConfig, bootstrap: str) -> None:
        self.config = config
        self._bootstrap = bootstrap
        self.state = JoinState(config.window_ms, config.grace_ms)
        self._newest: dict[tuple[str, int], int] = {}  # newest event time per input partition
        self._at_end: dict[tuple[str, int], float] = {}  # partition -> when it reached its end
        self._assigned: set[tuple[str, int]] = set()
        self._dirty = False

    def run(self, stop: threading.Event) -> None:
        """Join until `stop` is set, then commit what is done and leave the group.

        Raises: JoinerError.
        """
        partitions = self._prepare_topics()
        cfg = self.config
        self._producer = Producer({
            "bootstrap.servers": self._bootstrap,
            "transactional.id": f"{cfg.group}-joiner-{cfg.instance}",
            "linger.ms": 5,
        })
        self._consumer = Consumer({
            "bootstrap.servers": self._bootstrap,
            "group.id": cfg.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            # Range gives a member the same partition numbers of both co-partitioned topics.
            "partition.assignment.strategy": "range",
            # Static membership: a restarted joiner takes its partitions back at once instead
            # of waiting out the killed one's session.
            "group.instance.id": f"{cfg.group}-joiner-{cfg.instance}",
            "session.timeout.ms": 10_000,
        })
        try:
            self._producer.init_transactions(30)
            self._producer.begin_transaction()
            self._consumer.subscribe([cfg.impressions_topic, cfg.clicks_topic],
                                     on_assign=self._on_assign, on_revoke=self._on_revoke)
            log.info("joining %s + %s -> %s (%d partitions, window %d ms)", cfg.impressions_topic,
                     cfg.clicks_topic, cfg.output_topic, partitions, cfg.window_ms)
            last_commit = time.monotonic()
            while not stop.is_set():
                for msg in self._consumer.consume(500, timeout=0.1):
                    self._on_message(msg)
                self._apply(*self.state.expire(self._watermark()))
                if time.monotonic() - last_commit >= cfg.commit_ms / 1000:
                    self._commit()
                    last_commit = time.monotonic()
            self._commit()
            self._consumer.close()  # revokes: nothing left to commit
        except KafkaException as exc:
            raise JoinerError(f"joiner transaction failed: {exc.args[0].str()}") from exc

    # -- records ---------------------------------------------------------------------------

    def _on_message(self, msg) -> None:
        tp = (msg.topic(), msg.partition())
        if msg.error() is not None:
            if msg.error().code() == KafkaError._PARTITION_EOF:
                self._at_end.setdefault(tp, time.monotonic())
                return
            raise JoinerError(f"consuming {tp[0]}[{tp[1]}]: {msg.error().str()}")
        self._at_end.pop(tp, None)
        record: ImpressionRecord | ClickRecord
        try:
            if msg.topic() == self.config.impressions_topic:
                record = ImpressionRecord.from_json(msg.value())
                result = self.state.on_impression(record, msg.partition())
            else:
                record = ClickRecord.from_json(msg.value())
                result = self.state.on_click(record.impression_id, record.event_time_ms, msg.partition())
        except SchemaError as exc:
            # A long-running joiner skips what it cannot read, and says where it was.
            log.warning("skipping %s[%d]@%d: %s", tp[0], tp[1], msg.offset(), exc)
            self._dirty = True
            return
        self._newest[tp] = max(self._newest.get(tp, 0), record.event_time_ms)
        self._apply(*result)
        self._dirty = True

    def _apply(self, emits: list[Emit], changes: list[StateChange]) -> None:
        for e in emits:
            self._producer.produce(self.config.output_topic, value=e.example.to_json(), key=e.impression_id)
        for c in changes:
            value = None if c.waiting is None else c.waiting.to_json()
            self._producer.produce(self.config.state_topic, value=value, key=c.impression_id,
                                   partition=c.partition)
        if emits or changes:
            self._dirty = True
            self._producer.poll(0)

    def _watermark(self) -> int:
        now = time.monotonic()
        quiet = self.config.idle_ms / 1000
        active = [self._newest.get(tp) for tp in self._assigned
                  if not (tp in self._at_end and now - self._at_end[tp] >= quiet)]
        if not active:
            return int(time.time() * 1000) - self.config.idle_ms
        delivered = [a for a in active if a is not None]
        if len(delivered) < len(active):
            return 0  # a partition with data has not delivered yet: hold everything
        return min(delivered)

    # -- transactions and assignment -------------------------------------------------------

    def _commit(self) -> None:
        if not self._dirty:
            return
        positions = [tp for tp in self._consumer.position(self._consumer.assignment()) if tp.offset >= 0]
        if positions:
            self._producer.send_offsets_to_transaction(positions, self._consumer.consumer_group_metadata(), 30)
        self._producer.commit_transaction(30)
        self._producer.begin_transaction()
        self._dirty = False

    def _on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        numbers = {tp.partition for tp in partitions}
        self._restore(numbers)
        self._assigned = {(tp.topic, tp.partition) for tp in partitions}
        log.info("assigned partitions %s; %d impressions or clicks waiting", sorted(numbers),
                 len(self.state.waiting))

    def _on_revoke(self, consumer, partitions: list[TopicPartition]) -> None:
        self._commit()
        self.state.drop_partitions({tp.partition for tp in partitions})
        self._assigned = set()
        self._newest.clear()
        self._at_end.clear()

    def _restore(self, partitions: set[int]) -> None:
        """Rebuild the waiting set of these partitions from the changelog (committed records)."""
        reader = Consumer({"bootstrap.servers": self._bootstrap, "group.id": f"{self.config.group}.restore",
                           "enable.auto.commit": False, "isolation.level": "read_committed",
                           "enable.partition.eof": True})
        try:
            tps = [TopicPartition(self.config.state_topic, p, 0) for p in partitions]
            ends = {tp.partition: reader.get_watermark_offsets(tp, timeout=30)[1] for tp in tps}
            pending = {p for p, end in ends.items() if end > 0}
            reader.assign(tps)
            while pending:
                for msg in reader.consume(1000, timeout=1.0):
                    error = msg.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            pending.discard(msg.partition())
                            continue
                        raise JoinerError(f"restoring from {self.config.state_topic}: {error.str()}")
                    try:
                        value = msg.value()
                        waiting = None if value is None else JoinWaiting.from_json(value)
                    except SchemaError as exc:
                        # Skipping it would label its impression or click wrongly; a record of
                        # another version is a newer joiner's: run that one.
                        raise JoinerError(f"restoring from {self.config.state_topic}[{msg.partition()}]"
                                          f"@{msg.offset()}: {exc}") from exc
                    key = msg.key()
                    assert key is not None  # the state topic's records are keyed by impression
                    self.state.restore(key.decode(), waiting)
        finally:
            reader.close()

    def _prepare_topics(self) -> int:
        """Check the inputs are co-partitioned; create the changelog and output if missing."""
        from confluent_kafka.admin import AdminClient

        from streamtrain.infra import Endpoints
        from streamtrain.infra.clients import TopicSpec, ensure_topics

        cfg = self.config
        meta = AdminClient({"bootstrap.servers": self._bootstrap}).list_topics(timeout=30).topics
        counts = {}
        for topic in (cfg.impressions_topic, cfg.clicks_topic):
            if topic not in meta or meta[topic].error is not None:
                raise JoinerError(f"input topic {topic!r} does not exist")
            counts[topic] = len(meta[topic].partitions)
        if len(set(counts.values())) != 1:
            raise JoinerError(f"impressions and clicks must have the same partition count, got {counts}")
        n = counts[cfg.impressions_topic]
        ensure_topics(Endpoints(self._bootstrap, "", ""), [
            TopicSpec(cfg.state_topic, n, {"cleanup.policy": "compact"}),
            TopicSpec(cfg.output_topic, n),
        ])
        if cfg.state_topic in meta and len(meta[cfg.state_topic].partitions) != n:
            raise JoinerError(f"changelog {cfg.state_topic!r} has {len(meta[cfg.state_topic].partitions)} "
                              f"partitions, the inputs {n}")
        return n

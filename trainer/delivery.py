"""How a trainer's messages reach Kafka.

Gradient deltas are produced as they are made (`send`), through an idempotent producer that
never gives up on a message (`message.timeout.ms` 0) and stops rather than leave a gap
(`enable.gapless.guarantee`): each shard's topic gets a producer's deltas in the order sent,
once each. Every attempt of a task sends its push groups in `seq` order, so the shards' ledger
(pserver/dedup.py) applies each `(task_id, seq)` exactly once, whichever attempt's copy
arrives first: a redone task, a zombie, or one producer's deltas arriving after a failed
commit add nothing twice. That is all exactly-once parameters need, and it is cheap: a Kafka
transaction per push costs the broker several times the produce itself, a large part of the
whole job's CPU a record (bench/RESULTS.md, "deltas without transactions").

What the ledger does not cover is a task's side outputs, its DLQ letters and its metrics
record (`add`). Under `exactly_once` they wait for the task's commit and go out in one
transaction, so an attempt that dies before its end leaves none of them; under
`at_least_once` they are produced at once, and a redone task can repeat them.

`commit` is what a task's completion waits for: every delta sent so far acknowledged, then the
side outputs. A producer that fails for good (a fatal error, or a message the broker refused)
raises `DeliveryBroken`, which stops the trainer: going on could leave a gap that the ledger
would then make permanent, and its tasks are redone by others after their timeout.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaError, KafkaException, Producer

from streamtrain.infra import Endpoints
from streamtrain.schemas import StreamtrainError

log = logging.getLogger(__name__)

TRANSACTION_TIMEOUT_MS = 10_000
ACK_TIMEOUT_S = 30.0

Messages = list[tuple[str, bytes, bytes | None]]  # (topic, value, key)


class DeliveryError(StreamtrainError, RuntimeError):
    """Messages not acknowledged or side outputs not committed: the task must not complete.
    `refused`: the broker or the client refused a message (too large, say), which every
    attempt would meet again; otherwise the broker was away, which the next attempt may not
    meet."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class DeliveryBroken(StreamtrainError, RuntimeError):
    """The delta producer failed for good; the trainer must stop."""


class Delivery:
    """One trainer's producers: deltas through an idempotent one, side outputs through a
    transactional one (`transactional_id` given, exactly-once) or the same idempotent one."""

    def __init__(self, endpoints: Endpoints, transactional_id: str | None) -> None:
        self._broken: str | None = None
        self._lock = threading.Lock()
        self._producer = Producer({
            "bootstrap.servers": endpoints.kafka, "enable.idempotence": True,
            "enable.gapless.guarantee": True, "message.timeout.ms": 0,
            # Each push is flushed by the committer at once; the linger only groups a push's
            # messages to the shards into one request.
            "linger.ms": 5, "error_cb": self._on_error,
        })
        self._side: Producer | None = None
        self._side_config: dict[str, object] = {}
        if transactional_id is not None:
            self._side_config = {"bootstrap.servers": endpoints.kafka, "transactional.id": transactional_id,
                                 "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS}
            self._side = self._new_side()
        self._buffer: Messages = []

    # -- the training thread ---------------------------------------------------------------
    def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        """A gradient delta: produced now, after every delta sent before it."""
        self._raise_broken()
        self._produce(topic, value, key)

    def add(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        """A side output of the task being trained: kept for its commit (exactly-once) or
        produced now (at-least-once)."""
        if self._side is None:
            self._raise_broken()
            self._produce(topic, value, key)
        else:
            self._buffer.append((topic, value, key))

    def take(self) -> Messages:
        """The side outputs not yet committed, handed to `commit` (possibly from another thread)."""
        taken, self._buffer = self._buffer, []
        return taken

    def discard(self) -> None:
        """Drop the side outputs of an attempt given up. Its deltas are out already: the
        ledger drops whichever copy of each group arrives second."""
        self._buffer.clear()

    # -- the committer's thread ------------------------------------------------------------
    def commit(self, messages: Messages) -> None:
        """Wait until every delta sent so far is acknowledged, then commit `messages` (taken
        side outputs) in one transaction. Raises DeliveryError, or DeliveryBroken."""
        remaining = self._producer.flush(ACK_TIMEOUT_S)
        self._raise_broken()
        if remaining:
            # They stay queued and arrive in order later; the task is redone meanwhile.
            raise DeliveryError(f"{remaining} messages unacknowledged after {ACK_TIMEOUT_S:.0f} s")
        if not messages:
            return
        assert self._side is not None, "side outputs are only taken under exactly-once"
        try:
            self._side.begin_transaction()
            for topic, value, key in messages:
                self._produce(topic, value, key, self._side)
            self._side.commit_transaction(30)
        except KafkaException as exc:
            self._recover(exc)
            raise DeliveryError(f"transaction failed: {exc.args[0].str()}") from exc
        except DeliveryError:
            self._recover(None)
            raise

    def close(self) -> None:
        self._buffer.clear()
        self._producer.flush(10)
        if self._side is not None:
            self._side.flush(10)

    # -- inside ----------------------------------------------------------------------------
    def _produce(self, topic: str, value: bytes, key: bytes | None, producer: Producer | None = None) -> None:
        producer = producer or self._producer
        deltas = producer is self._producer
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while True:
            try:
                producer.produce(topic, value, key, partition=0, on_delivery=self._on_delivery if deltas else None)
                break
            except BufferError:
                # Local queue full: let it drain, but not forever (a shard's partition may be
                # down, and messages never time out): the task fails and the trainer stays
                # responsive; what is queued still goes out, in order.
                if time.monotonic() > deadline:
                    raise DeliveryError(f"the producer's queue stayed full for {ACK_TIMEOUT_S:.0f} s") from None
                producer.poll(0.05)
            except KafkaException as exc:
                error = exc.args[0]
                if deltas and error.fatal():
                    self._break(f"fatal producer error: {error.str()}")
                    self._raise_broken()
                # Refused before it was queued (too large, say): nothing of it went out, and the
                # attempt stops here, so its groups still reach each shard in order.
                raise DeliveryError(f"a message to {topic} was refused: {error.str()}", refused=True) from exc
        producer.poll(0)

    def _on_delivery(self, err: KafkaError | None, msg) -> None:
        if err is not None:
            self._break(f"a message to {msg.topic()} was refused: {err.str()}")

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._break(f"fatal producer error: {err.str()}")

    def _break(self, why: str) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = why
                log.error("delta producer broken: %s", why)

    def _raise_broken(self) -> None:
        if self._broken is not None:
            raise DeliveryBroken(self._broken)

    def _new_side(self) -> Producer:
        producer = Producer(self._side_config)
        # Fences any earlier producer with this id and aborts its open transaction.
        producer.init_transactions(30)
        return producer

    def _recover(self, exc: KafkaException | None) -> None:
        """Abort the open transaction; a producer that cannot is replaced."""
        assert self._side is not None, "only commit recovers, and side outputs are only taken under exactly-once"
        error = exc.args[0] if exc is not None else None
        if error is None or error.txn_requires_abort():
            try:
                self._side.abort_transaction(30)
                return
            except KafkaException as abort_exc:
                error = abort_exc.args[0]
        log.warning("transactional producer unusable (%s); starting a new one", error.str())
        self._side = self._new_side()

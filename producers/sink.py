"""One Kafka producer per process, with delivery failures turned into our error."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaException, Producer

from streamtrain.producers.errors import DeliveryError


class KafkaSink:
    """Idempotent producer (no duplicates from librdkafka's own retries, order kept per
    partition); `flush` raises if any record since the last flush was not delivered."""

    def __init__(self, bootstrap: str, extra: Mapping[str, object] | None = None) -> None:
        conf = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
        }
        conf.update(extra or {})
        self._producer = Producer(conf)
        self._failures: list[str] = []
        self.sent = 0

    def send(self, topic: str, value: bytes, key: bytes | str | None = None) -> None:
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=self._on_delivery)
                break
            except BufferError:
                # librdkafka's local queue is full: serve deliveries until there is room.
                self._producer.poll(0.05)
            except KafkaException as exc:
                raise DeliveryError(f"producing to {topic!r} failed: {exc.args[0].str()}") from exc
        self.sent += 1
        self._producer.poll(0)
        self._raise_failures()

    def flush(self, timeout: float = 120.0) -> None:
        left = self._producer.flush(timeout)
        self._raise_failures()
        if left:
            raise DeliveryError(f"{left} records still undelivered after {timeout} s")

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self._failures.append(f"{msg.topic()}: {err.str()}")

    def _raise_failures(self) -> None:
        if self._failures:
            first, count = self._failures[0], len(self._failures)
            self._failures.clear()
            raise DeliveryError(f"{count} records not delivered, first: {first}")

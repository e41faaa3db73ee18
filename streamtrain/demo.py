"""`streamtrain demo`, for now: the foundation end to end on real services.

Services up, the demo job's input topic created, an Example record produced in a Kafka
transaction and read back with read_committed, services down. The full demo job (producer,
joiner, master, pservers, trainers, live view) replaces the middle part as those land.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console

from infra import LocalServices
from infra.clients import TopicSpec, ensure_topics
from schemas import Example, Topics

JOB = "demo"


def run_demo(services: LocalServices, console: Console, keep_running: bool = False) -> None:
    console.rule("streamtrain demo")
    try:
        for name, took in services.up().items():
            console.print(f"{name:6} " + ("already running" if took is None else f"ready in {took:.1f} s"))
        endpoints = services.endpoints
        topics = Topics(JOB)
        ensure_topics(endpoints, [TopicSpec(topics.examples, partitions=2)])
        console.print(f"topic  {topics.examples} (2 partitions)")

        sent = Example(sparse={"user": (42,), "ad": (7, 9)}, dense=(0.5, 1.25), label=1.0,
                       event_time_ms=int(time.time() * 1000))
        producer = Producer({"bootstrap.servers": endpoints.kafka,
                             "transactional.id": f"{JOB}.demo-producer"})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topics.examples, value=sent.to_bytes(), partition=0)
        producer.commit_transaction(30)

        consumer = Consumer({"bootstrap.servers": endpoints.kafka, "group.id": f"{JOB}.demo",
                             "isolation.level": "read_committed", "enable.auto.commit": False})
        _, end = consumer.get_watermark_offsets(TopicPartition(topics.examples, 0), timeout=10)
        # The record sits just before its transaction's commit marker, which occupies an offset.
        consumer.assign([TopicPartition(topics.examples, 0, max(0, end - 2))])
        received = None
        deadline = time.monotonic() + 20
        while received is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                received = Example.from_bytes(msg.value())
        consumer.close()
        if received != sent:
            raise SystemExit(f"round trip failed: sent {sent}, got {received}")
        console.print(f"record {received}")
        console.print("[green]round trip through Kafka (transactional, read_committed) ok[/green]")
    finally:
        if not keep_running:
            console.print(f"stopped: {', '.join(services.down()) or 'nothing'}")

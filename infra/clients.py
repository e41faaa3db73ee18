"""Clients of the three services, configured once for every process of a job.

Library choices (see docs/dependencies.md): confluent-kafka (librdkafka: transactions, exact
assign/seek, the fastest Python Kafka client), etcd-sdk-python (`pyetcd`, the maintained fork of
python-etcd3 that imports with protobuf >= 4 and speaks etcd 3.4's v3 API), redis-py with hiredis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streamtrain.infra.endpoints import Endpoints
from streamtrain.infra.errors import InfraError


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    config: Mapping[str, str] = field(default_factory=dict)


def kafka_admin(endpoints: Endpoints):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": endpoints.kafka})


def ensure_topics(endpoints: Endpoints, specs: Iterable[TopicSpec], timeout: float = 30.0) -> None:
    """Create the topics that do not exist yet; existing ones are left as they are."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    admin = kafka_admin(endpoints)
    new = [NewTopic(s.name, num_partitions=s.partitions, replication_factor=1, config=dict(s.config))
           for s in specs]
    if not new:
        return
    for name, future in admin.create_topics(new, operation_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise InfraError(f"creating topic {name!r} failed: {exc.args[0].str()}") from exc


ETCD_RETRY_S = 1.0


def etcd_client(endpoints: Endpoints, timeout: float = 10.0):
    import pyetcd

    host, port = endpoints.etcd_host_port
    client = pyetcd.client(host=host, port=port, timeout=timeout)
    # After any failed call pyetcd refuses every call for `time_retry` (300 s by default):
    # an etcd restarted in seconds stopped the whole job for five minutes. gRPC reconnects on
    # its own; a second is enough not to hammer an etcd that is down.
    for endpoint in client.endpoints.values():
        endpoint.time_retry = ETCD_RETRY_S
    return client


def redis_client(endpoints: Endpoints):
    import redis

    return redis.Redis.from_url(endpoints.redis)

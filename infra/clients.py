"""Clients of the three services, configured once for every process of a job.

Library choices (see docs/dependencies.md): confluent-kafka (librdkafka: transactions, exact
assign/seek, the fastest Python Kafka client), etcd-sdk-python (`pyetcd`, the maintained fork of
python-etcd3 that imports with protobuf >= 4 and speaks etcd 3.4's v3 API), redis-py with hiredis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streamtrain.infra.endpoints import REDIS_CLUSTER_SCHEME, Endpoints
from streamtrain.infra.errors import InfraError


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    config: Mapping[str, str] = field(default_factory=dict)


def kafka_admin(endpoints: Endpoints):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": endpoints.kafka})


def replication(brokers: int, factor: int = 0, min_insync: int = 0) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for a new topic on a cluster of `brokers`:
    `factor` and `min_insync` as given, 0 for the defaults, min(3, brokers) and min(2, factor).
    A factor above the brokers would fail at creation, and a min.insync.replicas above the
    factor would refuse every acks=all write, so neither is allowed to."""
    factor = factor or min(3, brokers)
    if factor > brokers:
        raise InfraError(f"replication factor {factor} needs that many brokers; the cluster has {brokers}")
    min_insync = min_insync or min(2, factor)
    if min_insync > factor:
        raise InfraError(f"min.insync.replicas {min_insync} is above the replication factor {factor}")
    return factor, min_insync


def ensure_topics(endpoints: Endpoints, specs: Iterable[TopicSpec], timeout: float = 30.0,
                  replication_factor: int = 0, min_insync_replicas: int = 0) -> None:
    """Create the topics that do not exist yet, replicated as `replication` says for the
    brokers the cluster has; existing ones are left as they are."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    specs = list(specs)
    if not specs:
        return
    admin = kafka_admin(endpoints)
    try:
        brokers = len(admin.list_topics(timeout=timeout).brokers)
    except KafkaException as exc:
        raise InfraError(f"listing the brokers failed: {exc.args[0].str()}") from exc
    factor, min_insync = replication(brokers, replication_factor, min_insync_replicas)
    new = [NewTopic(s.name, num_partitions=s.partitions, replication_factor=factor,
                    config={"min.insync.replicas": str(min_insync), **s.config}) for s in specs]
    for name, future in admin.create_topics(new, operation_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise InfraError(f"creating topic {name!r} failed: {exc.args[0].str()}") from exc


ETCD_RETRY_S = 1.0


def etcd_client(endpoints: Endpoints, timeout: float = 10.0):
    import pyetcd

    members = endpoints.etcd_members
    if len(members) == 1:
        (host, port), = members
        client = pyetcd.client(host=host, port=port, timeout=timeout)
    else:
        client = _failover_client(members, timeout)
    # After any failed call pyetcd refuses every call to that member for `time_retry` (300 s
    # by default): an etcd restarted in seconds stopped the whole job for five minutes. gRPC
    # reconnects on its own; a second is enough not to hammer a member that is down.
    for endpoint in client.endpoints.values():
        endpoint.time_retry = ETCD_RETRY_S
    return client


def _failover_client(members: list[tuple[str, int]], timeout: float):
    """A client of a cluster's members: a call that fails on one member marks it failed and
    raises; the caller's retry goes to the next member (all of them serve reads and writes)."""
    from pyetcd.client import Endpoint, MultiEndpointEtcd3Client

    class RoundRobin(MultiEndpointEtcd3Client):
        # pyetcd moves off a member only while it is marked failed: a caller retrying after
        # `time_retry` or later (a job monitor polling each second) went back to the dead
        # member every time and never reached the live ones. So the next call goes to the
        # next member at once.
        _current_endpoint_label: str  # pyetcd's: the member calls go to

        def _manage_grpc_errors(self, exc):
            failed = self._current_endpoint_label
            try:
                super()._manage_grpc_errors(exc)
            finally:
                if self.endpoints[failed].is_failed():
                    labels = list(self.endpoints)
                    self._current_endpoint_label = labels[(labels.index(failed) + 1) % len(labels)]

    return RoundRobin(endpoints=[Endpoint(host, port, secure=False) for host, port in members],
                      timeout=timeout, failover=True)


def redis_client(endpoints: Endpoints):
    """A single Redis's client, or a Redis Cluster's (`redis+cluster://host:port,...`: it
    learns the other nodes and the slots from whichever of these answers)."""
    import redis

    if endpoints.redis.startswith(REDIS_CLUSTER_SCHEME):
        from redis.cluster import ClusterNode, RedisCluster

        nodes = []
        for item in endpoints.redis[len(REDIS_CLUSTER_SCHEME):].split(","):
            host, _, port = item.strip().rstrip("/").rpartition(":")
            if not port.isdigit():
                raise ValueError(f"Redis Cluster node {item.strip()!r} in {endpoints.redis!r}: expected host:port")
            nodes.append(ClusterNode(host or "127.0.0.1", int(port)))
        return RedisCluster(startup_nodes=nodes)
    return redis.Redis.from_url(endpoints.redis)

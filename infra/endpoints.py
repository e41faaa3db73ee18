"""Where the services are, for every process of a job.

Resolution order per service: its environment variable (an external cluster), else the local
services recorded by `streamtrain up` in the state dir, else the default local ports.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from streamtrain.schemas import ServicePorts

ENV_KAFKA = "STREAMTRAIN_KAFKA"
ENV_ETCD = "STREAMTRAIN_ETCD"
ENV_REDIS = "STREAMTRAIN_REDIS"
ENV_REGISTRY = "STREAMTRAIN_REGISTRY"
ENV_HOME = "STREAMTRAIN_HOME"
ENV_PORT_BASE = "STREAMTRAIN_PORT_BASE"

REDIS_CLUSTER_SCHEME = "redis+cluster://"

DEFAULT_PORT_BASE = 19092
STATE_FILE = "services.json"  # schemas.ServicePorts


def state_home() -> Path:
    """The state dir of `streamtrain up` (data dirs, logs, pids, chosen ports)."""
    if home := os.environ.get(ENV_HOME):
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "streamtrain"


@dataclass(frozen=True)
class Ports(ServicePorts):
    """Loopback ports of the local services; six consecutive ports from a base by default
    (the schema registry's is used only when one is started). An etcd of several members has
    the others' (client, peer) ports in `etcd_more`; a Kafka of several brokers the others'
    (client, controller) ports in `kafka_more`; a Redis Cluster every node's (client, cluster
    bus) ports in `redis_cluster`, the first's client port `redis` (half of the nodes masters,
    each with a replica). The fields, their checks and their file are `schemas.ServicePorts`'s,
    which every process reads; this class says what they mean."""

    @property
    def etcd_members(self) -> list[tuple[int, int]]:
        """Every etcd member's (client, peer) ports, the first member's first."""
        return [(self.etcd, self.etcd_peer), *self.etcd_more]

    @property
    def kafka_brokers(self) -> list[tuple[int, int]]:
        """Every Kafka broker's (client, controller) ports, the first broker's first."""
        return [(self.kafka, self.kafka_controller), *self.kafka_more]

    @property
    def redis_nodes(self) -> list[int]:
        """Every Redis node's client port, the first node's first: one, or a cluster's."""
        return [client for client, _ in self.redis_cluster] or [self.redis]

    def with_redis_cluster(self, masters: int) -> Ports:
        """These ports with a Redis Cluster of `masters` masters and a replica each (0: a
        single Redis): kept as they are if it has as many nodes, else ten ports apart from
        the first's (BASE+4, BASE+14, ...), each node's cluster bus five above its own."""
        if masters != 0 and not 3 <= masters <= 5:
            raise ValueError(f"a Redis Cluster of {masters} masters: 3 to 5 are supported (0: a single Redis)")
        if len(self.redis_cluster) == 2 * masters:
            return self
        return replace(self, redis_cluster=tuple((self.redis + 10 * i, self.redis + 10 * i + 5)
                                                 for i in range(2 * masters)))

    def with_etcd_members(self, count: int) -> Ports:
        """These ports with `count` etcd members: kept as they are if it has that many, else
        the others ten ports apart above the first's (BASE+12/13, BASE+22/23, ...)."""
        return self._with_more("etcd_more", f"an etcd of {count} members", count)

    def with_kafka_brokers(self, count: int) -> Ports:
        """These ports with `count` Kafka brokers: kept as they are if it has that many, else
        the others ten ports apart above the first's (BASE+10/11, BASE+20/21, ...)."""
        return self._with_more("kafka_more", f"a Kafka of {count} brokers", count)

    def _with_more(self, more: str, what: str, count: int) -> Ports:
        if not 1 <= count <= 9:
            raise ValueError(f"{what}: 1 to 9 are supported")
        if len(getattr(self, more)) == count - 1:
            return self
        client, peer = (self.etcd, self.etcd_peer) if more == "etcd_more" else (self.kafka, self.kafka_controller)
        changes: dict[str, Any] = {more: _ten_apart(client, peer, count)}
        return replace(self, **changes)

    @classmethod
    def from_base(cls, base: int) -> Ports:
        if not 1024 <= base <= 65529:
            raise ValueError(f"port base {base} is outside 1024..65529")
        return cls(base, base + 1, base + 2, base + 3, base + 4, base + 5)

    @classmethod
    def free(cls, etcd_members: int = 1, kafka_brokers: int = 1, redis_masters: int = 0) -> Ports:
        """Currently free ports, for tests that must not collide with anything."""
        socks = [socket.socket() for _ in range(6 + 2 * (etcd_members - 1) + 2 * (kafka_brokers - 1)
                                                + 2 * redis_masters * 2)]
        try:
            for s in socks:
                s.bind(("127.0.0.1", 0))
            found = [s.getsockname()[1] for s in socks]
            pairs = list(zip(found[6::2], found[7::2]))
            more = etcd_members - 1 + kafka_brokers - 1
            redis_cluster = tuple(pairs[more:])
            return cls(found[0], found[1], found[2], found[3], redis_cluster[0][0] if redis_cluster else found[4],
                       found[5],
                       etcd_more=tuple(pairs[:etcd_members - 1]),
                       kafka_more=tuple(pairs[etcd_members - 1:more]), redis_cluster=redis_cluster)
        finally:
            for s in socks:
                s.close()

    @classmethod
    def default(cls) -> Ports:
        return cls.from_base(int(os.environ.get(ENV_PORT_BASE, DEFAULT_PORT_BASE)))


@dataclass(frozen=True)
class Endpoints:
    """Client addresses: Kafka bootstrap servers, etcd host:port (or several, comma-separated:
    the members of a cluster, which clients fail over between), Redis URL, and the URL of
    Confluent's API on a schema registry (used by jobs of Avro records that name none).
    A Redis Cluster is named by `redis+cluster://host:port[,host:port...]`, any of its nodes."""

    kafka: str
    etcd: str
    redis: str
    registry: str = ""
    external: frozenset[str] = frozenset()

    @property
    def etcd_members(self) -> list[tuple[str, int]]:
        """Each etcd endpoint as (host, port), in the order given.

        Raises: ValueError naming the endpoint without a port."""
        members = []
        for item in self.etcd.split(","):
            host, _, port = item.strip().rpartition(":")
            if not port.isdigit():
                raise ValueError(f"etcd endpoint {item.strip()!r} in {self.etcd!r}: expected host:port")
            members.append((host or "127.0.0.1", int(port)))
        return members

    @classmethod
    def local(cls, ports: Ports) -> Endpoints:
        return cls(
            kafka=",".join(f"127.0.0.1:{client}" for client, _ in ports.kafka_brokers),
            etcd=",".join(f"127.0.0.1:{client}" for client, _ in ports.etcd_members),
            redis=(f"redis://127.0.0.1:{ports.redis}/0" if not ports.redis_cluster else
                   REDIS_CLUSTER_SCHEME + ",".join(f"127.0.0.1:{port}" for port in ports.redis_nodes)),
            registry=f"http://127.0.0.1:{ports.registry}/apis/ccompat/v7",
        )

    @classmethod
    def resolve(cls, home: Path | None = None) -> Endpoints:
        """Endpoints for a job process: environment first, then what `streamtrain up` recorded."""
        ports = recorded_ports(home or state_home()) or Ports.default()
        return cls.overlay_env(cls.local(ports))

    @classmethod
    def overlay_env(cls, local: Endpoints) -> Endpoints:
        """`local`, with each service named by its environment variable replaced (external)."""
        env = {
            "kafka": os.environ.get(ENV_KAFKA),
            "etcd": ",".join(_strip_scheme(url) for url in os.environ.get(ENV_ETCD, "").split(",") if url.strip()),
            "redis": os.environ.get(ENV_REDIS),
            "registry": os.environ.get(ENV_REGISTRY),
        }
        return cls(
            kafka=env["kafka"] or local.kafka,
            etcd=env["etcd"] or local.etcd,
            redis=env["redis"] or local.redis,
            registry=env["registry"] or local.registry,
            external=frozenset(name for name, value in env.items() if value),
        )

    def env(self) -> dict[str, str]:
        """The environment that makes a child process resolve these same endpoints."""
        return {ENV_KAFKA: self.kafka, ENV_ETCD: self.etcd, ENV_REDIS: self.redis, ENV_REGISTRY: self.registry}

    def as_dict(self) -> dict[str, str]:
        return {"kafka": self.kafka, "etcd": self.etcd, "redis": self.redis, "registry": self.registry}


def _ten_apart(client: int, other: int, count: int) -> tuple[tuple[int, int], ...]:
    return tuple((client + 10 * i, other + 10 * i) for i in range(1, count))


def _strip_scheme(url: str) -> str:
    # etcd users habitually write http://host:port; the gRPC client wants host:port.
    return url.strip().split("://", 1)[-1].rstrip("/")


def recorded_ports(home: Path) -> Ports | None:
    """The ports `streamtrain up` recorded in state dir `home` (schemas.ServicePorts); None if
    it recorded none.

    Raises:
        SchemaError: the file is malformed or of an unknown version (the message names it).
    """
    return Ports.read(home / STATE_FILE)


def record_ports(home: Path, ports: Ports) -> None:
    home.mkdir(parents=True, exist_ok=True)
    ports.write(home / STATE_FILE)

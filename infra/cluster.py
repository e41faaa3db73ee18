"""The services of a streamtrain installation, managed together: Kafka, etcd and Redis
always, a schema registry when asked (for topics of Avro records).

Layout of the state dir (`STREAMTRAIN_HOME`, or a temp dir in tests):
    services.json   the ports chosen by the last `up` (schemas.ServicePorts)
    kafka/ etcd/ redis/ registry/   each service's data, config, log and pid file
    kafka-1/ kafka-2/ ...           the other brokers of a Kafka of several
    etcd-1/ etcd-2/ ...             the other members of an etcd of several
    redis-1/ redis-2/ ...           the other nodes of a Redis Cluster
A service whose environment variable names an external cluster is not started here; it is
only probed.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from streamtrain.infra.endpoints import Endpoints, Ports, record_ports, recorded_ports
from streamtrain.infra.errors import InfraError
from streamtrain.infra.etcd_server import EtcdServer, health_ok
from streamtrain.infra.kafka_broker import KafkaBroker, ensure_kafka_jars, metadata_ok
from streamtrain.infra.process import ServerProcess
from streamtrain.infra.redis_server import RedisServer, form_cluster, ping_ok
from streamtrain.infra.schema_registry import SchemaRegistryServer, ensure_registry_dist, subjects_ok

SERVICES = ("kafka", "etcd", "redis")
OPTIONAL = ("registry",)


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    address: str
    healthy: bool
    pid: int | None
    external: bool

    def as_dict(self) -> dict[str, object]:
        return {"address": self.address, "healthy": self.healthy, "pid": self.pid,
                "external": self.external}


class LocalServices:
    """Start, probe and stop the services under one state dir. The schema registry is
    started only with `registry=True`; once running it is probed and stopped with the rest."""

    def __init__(self, home: Path, ports: Ports | None = None, registry: bool = False) -> None:
        self.home = home
        self.ports = ports or recorded_ports(home) or Ports.default()
        self.endpoints = Endpoints.overlay_env(Endpoints.local(self.ports))
        self.servers: dict[str, ServerProcess] = {
            **kafka_brokers(home, self.ports),
            **etcd_members(home, self.ports),
            **redis_nodes(home, self.ports),
            "registry": SchemaRegistryServer(home / "registry", self.ports.registry),
        }
        self.with_registry = registry

    def names(self) -> list[str]:
        """The services of this installation: the registry too once asked for, running, or
        named by its environment variable."""
        optional = [n for n in OPTIONAL
                    if self.with_registry or n in self.endpoints.external or self.servers[n].pid() is not None]
        more = {"kafka": len(self.ports.kafka_brokers), "etcd": len(self.ports.etcd_members),
                "redis": len(self.ports.redis_nodes)}
        nodes = [f"{kind}-{i}" for kind, count in more.items() if kind not in self.endpoints.external
                 for i in range(1, count)]
        return [*SERVICES, *nodes, *optional]

    def managed(self) -> dict[str, ServerProcess]:
        """The services started here, by name: those no environment variable names."""
        return {name: self.servers[name] for name in self.names() if _kind(name) not in self.endpoints.external}

    def up(self) -> dict[str, float | None]:
        """Start every managed service not already running. Returns seconds-to-ready per
        service started (None for one that was already up). Idempotent."""
        self._check_nodes()
        record_ports(self.home, self.ports)
        managed = self.managed()
        # Before the clock starts: resolving is not starting.
        if "kafka" in managed:
            ensure_kafka_jars()
        if "registry" in managed:
            ensure_registry_dist()
        # Together: an etcd member is healthy only once a quorum of them is up.
        with ThreadPoolExecutor(max_workers=len(managed) or 1) as pool:
            futures = {name: pool.submit(s.start) for name, s in managed.items()}
            started = {name: f.result() for name, f in futures.items()}
        if self.ports.redis_cluster and "redis" in managed:
            form_cluster([s for name, s in managed.items() if _kind(name) == "redis" and isinstance(s, RedisServer)])
        return started

    def _check_nodes(self) -> None:
        """etcd keeps its members in its data, Kafka's nodes their controller quorum and a Redis
        Cluster's nodes their cluster: data dirs made for another number of them would start as
        the old cluster, which new nodes could never join. The count is read from the disk:
        the nodes whose data is there (a single Redis keeps none)."""
        for kind, wanted, data in (("etcd", len(self.ports.etcd_members), "member-data"),
                                   ("kafka", len(self.ports.kafka_brokers), "logs/meta.properties"),
                                   ("redis", len(self.ports.redis_nodes), "nodes.conf")):
            had = sum(1 for d in self.home.glob(f"{kind}*") if (d / data).exists())
            if had and had != wanted and kind not in self.endpoints.external:
                raise InfraError(f"the local {kind} in {self.home} has data of {had} node(s), not {wanted}: "
                                 f"`streamtrain down`, then remove {self.home}/{kind}* to start it anew")

    def down(self) -> list[str]:
        """Stop every managed service; returns the names of those that were running."""
        servers = list(self.servers.values())
        with ThreadPoolExecutor(max_workers=len(servers)) as pool:
            stopped = dict(zip(self.servers, pool.map(lambda s: s.stop(), servers)))
        return [name for name, was in stopped.items() if was and _kind(name) not in self.endpoints.external]

    def status(self) -> list[ServiceStatus]:
        probes: dict[str, Callable[[str], bool]] = {"kafka": metadata_ok, "etcd": health_ok, "redis": ping_ok,
                                                    "registry": subjects_ok}
        addresses = self.endpoints.as_dict()

        def one(name: str) -> ServiceStatus:
            kind = _kind(name)
            external = kind in self.endpoints.external
            pid = None if external else self.servers[name].pid()
            # A local cluster's nodes each by its own address; an external one as named.
            address = (self.servers[name].address if kind in ("kafka", "etcd", "redis") and not external
                       else addresses[kind])
            healthy = (external or pid is not None) and probes[kind](address)
            return ServiceStatus(name, address, bool(healthy), pid, external)

        names = self.names()
        with ThreadPoolExecutor(max_workers=len(names)) as pool:
            return list(pool.map(one, names))


def _kind(name: str) -> str:
    return name.split("-")[0]  # etcd-1: a member of the local etcd


def kafka_brokers(home: Path, ports: Ports) -> dict[str, KafkaBroker]:
    """The local Kafka: one node as "kafka", or that one and the others as "kafka-1",
    "kafka-2", ..., node ids 1, 2, 3, ..., all voters of one controller quorum."""
    brokers = ports.kafka_brokers
    voters = {i + 1: controller for i, (_, controller) in enumerate(brokers)}
    servers = {}
    for i, (client, controller) in enumerate(brokers):
        key = "kafka" if i == 0 else f"kafka-{i}"
        servers[key] = KafkaBroker(home / key, client, controller, i + 1, voters,
                                   home / "kafka" / "cluster.id")
    return servers


def redis_nodes(home: Path, ports: Ports) -> dict[str, RedisServer]:
    """The local Redis: one as "redis", or the nodes of a Redis Cluster as "redis",
    "redis-1", ... (`form_cluster` makes half of them masters, each with a replica)."""
    if not ports.redis_cluster:
        return {"redis": RedisServer(home / "redis", ports.redis)}
    names = ["redis", *(f"redis-{i}" for i in range(1, len(ports.redis_cluster)))]
    return {name: RedisServer(home / name, client, bus) for name, (client, bus) in zip(names, ports.redis_cluster)}


def etcd_members(home: Path, ports: Ports) -> dict[str, EtcdServer]:
    """The local etcd: one member as "etcd" (named `streamtrain`, as it always was), or that
    one and the others as "etcd-1", "etcd-2", ..., started as one cluster."""
    members = ports.etcd_members
    names = ["streamtrain", *(f"streamtrain-{i}" for i in range(1, len(members)))]
    cluster = {name: peer for name, (_, peer) in zip(names, members)}
    servers = {}
    for i, (client, peer) in enumerate(members):
        key = "etcd" if i == 0 else f"etcd-{i}"
        servers[key] = EtcdServer(home / key, client, peer, names[i], cluster)
    return servers

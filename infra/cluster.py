"""The services of a streamtrain installation, managed together: Kafka, etcd and Redis
always, a schema registry when asked (for topics of Avro records).

Layout of the state dir (`STREAMTRAIN_HOME`, or a temp dir in tests):
    services.json   the ports chosen by the last `up`
    kafka/ etcd/ redis/ registry/   each service's data, config, log and pid file
A service whose environment variable names an external cluster is not started here; it is
only probed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from streamtrain.infra.endpoints import Endpoints, Ports, record_ports, recorded_ports
from streamtrain.infra.etcd_server import EtcdServer, health_ok
from streamtrain.infra.kafka_broker import KafkaBroker, ensure_kafka_jars, metadata_ok
from streamtrain.infra.process import ServerProcess
from streamtrain.infra.redis_server import RedisServer, ping_ok
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
            "kafka": KafkaBroker(home / "kafka", self.ports.kafka, self.ports.kafka_controller),
            "etcd": EtcdServer(home / "etcd", self.ports.etcd, self.ports.etcd_peer),
            "redis": RedisServer(home / "redis", self.ports.redis),
            "registry": SchemaRegistryServer(home / "registry", self.ports.registry),
        }
        self.with_registry = registry

    def names(self) -> list[str]:
        """The services of this installation: the registry too once asked for, running, or
        named by its environment variable."""
        optional = [n for n in OPTIONAL
                    if self.with_registry or n in self.endpoints.external or self.servers[n].pid() is not None]
        return [*SERVICES, *optional]

    def managed(self) -> list[ServerProcess]:
        return [self.servers[name] for name in self.names() if name not in self.endpoints.external]

    def up(self) -> dict[str, float | None]:
        """Start every managed service not already running. Returns seconds-to-ready per
        service started (None for one that was already up). Idempotent."""
        record_ports(self.home, self.ports)
        managed = self.managed()
        # Before the clock starts: resolving is not starting.
        if any(s.name == "kafka" for s in managed):
            ensure_kafka_jars()
        if any(s.name == "registry" for s in managed):
            ensure_registry_dist()
        with ThreadPoolExecutor(max_workers=len(managed) or 1) as pool:
            futures = {s.name: pool.submit(s.start) for s in managed}
            return {name: f.result() for name, f in futures.items()}

    def down(self) -> list[str]:
        """Stop every managed service; returns the names of those that were running."""
        servers = list(self.servers.values())
        with ThreadPoolExecutor(max_workers=len(servers)) as pool:
            stopped = dict(zip(self.servers, pool.map(lambda s: s.stop(), servers)))
        return [name for name, was in stopped.items() if was and name not in self.endpoints.external]

    def status(self) -> list[ServiceStatus]:
        probes = {"kafka": metadata_ok, "etcd": health_ok, "redis": ping_ok, "registry": subjects_ok}
        addresses = self.endpoints.as_dict()

        def one(name: str) -> ServiceStatus:
            external = name in self.endpoints.external
            pid = None if external else self.servers[name].pid()
            healthy = (external or pid is not None) and probes[name](addresses[name])
            return ServiceStatus(name, addresses[name], bool(healthy), pid, external)

        names = self.names()
        with ThreadPoolExecutor(max_workers=len(names)) as pool:
            return list(pool.map(one, names))

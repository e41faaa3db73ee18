"""Redis 7 from Debian's `redis-server`: one, or the nodes of a Redis Cluster (`form_cluster`).
No persistence: Redis is a cache of the pservers' state."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from streamtrain.infra.errors import InfraError
from streamtrain.infra.process import OnePortServer, require

_INSTALL = "apt-get install -y redis-server"
# How long a cluster's node may not answer before its replica takes over: short, so a killed
# master costs seconds, and long enough that a node busy for a moment is not failed over.
NODE_TIMEOUT_MS = 3000


class RedisServer(OnePortServer):
    name = "redis"

    def __init__(self, data_dir: Path, port: int, cluster_port: int | None = None) -> None:
        """`cluster_port`: a node of a Redis Cluster, its nodes talking on this port."""
        super().__init__(data_dir, port)
        self.cluster_port = cluster_port

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port,) if self.cluster_port is None else (self.port, self.cluster_port)

    @property
    def address(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        command = [
            require("redis-server", _INSTALL),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", "",
        ]
        if self.cluster_port is not None:
            # nodes.conf keeps the node's id and its view of the cluster across restarts.
            command += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                        "--cluster-port", str(self.cluster_port), "--cluster-node-timeout", str(NODE_TIMEOUT_MS)]
        return command

    def healthy(self) -> bool:
        return ping_ok(self.address)


def form_cluster(nodes: list[RedisServer], timeout_s: float = 60.0) -> None:
    """Make `nodes` (running, in cluster mode) one cluster, half of them masters and a replica
    each, unless they are one already; then wait until every node sees all slots served and
    every replica has synced with its master."""
    import redis

    first = redis.Redis(port=nodes[0].port)
    try:
        if int(first.cluster("info")["cluster_known_nodes"]) != len(nodes):
            addresses = [f"127.0.0.1:{node.port}" for node in nodes]
            done = subprocess.run([require("redis-cli", _INSTALL), "--cluster", "create", *addresses,
                                   "--cluster-replicas", "1", "--cluster-yes"],
                                  capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0:
                raise InfraError(f"redis-cli --cluster create failed: {done.stdout[-1000:]}{done.stderr[-1000:]}")
    finally:
        first.close()
    deadline = time.monotonic() + timeout_s
    while not all(cluster_ok(node.port) for node in nodes):
        if time.monotonic() > deadline:
            raise InfraError(f"the Redis Cluster on ports {[n.port for n in nodes]} did not settle in "
                             f"{timeout_s:.0f} s")
        time.sleep(0.2)


def cluster_ok(port: int) -> bool:
    """Whether the node at `port` sees every slot served and, a replica, has synced with its
    master: a replica that has not cannot take over when the master dies (CI once killed a
    master 5 s after the cluster formed, before its replica's first sync had gone through)."""
    import redis

    client = redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)
    try:
        if client.cluster("info").get("cluster_state") != "ok":
            return False
        replication = client.info("replication")
        return replication.get("role") != "slave" or replication.get("master_link_status") == "up"
    except redis.RedisError:
        return False
    finally:
        client.close()


def ping_ok(url: str, timeout: float = 2.0) -> bool:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except redis.RedisError:
        return False

"""etcd 3.4 from Debian's `etcd-server` on loopback ports of our choosing: a single member, or
one member of a local cluster (`cluster`: every member's name and peer port)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from streamtrain.infra.process import ServerProcess, require

_INSTALL = "apt-get install -y etcd-server etcd-client"


class EtcdServer(ServerProcess):
    name = "etcd"

    def __init__(self, data_dir: Path, port: int, peer_port: int, member: str = "streamtrain",
                 cluster: dict[str, int] | None = None) -> None:
        super().__init__(data_dir)
        self.port = port
        self.peer_port = peer_port
        self.member = member
        self.cluster = cluster or {member: peer_port}

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port, self.peer_port)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        etcd = require("etcd", _INSTALL)
        client = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            etcd,
            "--name", self.member,
            "--data-dir", str(self.data_dir / "member-data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", ",".join(f"{name}=http://127.0.0.1:{port}" for name, port in self.cluster.items()),
            "--initial-cluster-state", "new",
            # An endless stream rewrites task keys forever; without compaction the revision
            # history (and the database) would grow without bound.
            "--auto-compaction-mode", "revision",
            "--auto-compaction-retention", "10000",
            "--logger", "zap",
        ]

    def healthy(self) -> bool:
        return health_ok(self.address)


def is_leader(address: str, timeout: float = 2.0) -> bool:
    """Whether the member at `address` leads its cluster now (its `etcd_server_is_leader`)."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as resp:
            return b"\netcd_server_is_leader 1" in resp.read()
    except (OSError, urllib.error.URLError):
        return False


def health_ok(address: str, timeout: float = 2.0) -> bool:
    """etcd's own /health endpoint reports a member that can serve linearizable reads."""
    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=timeout) as resp:
            return json.loads(resp.read()).get("health") == "true"
    except (OSError, urllib.error.URLError, ValueError):
        return False

"""etcd 3.4 from Debian's `etcd-server`, a single member on loopback ports of our choosing."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from streamtrain.infra.process import ServerProcess, require

_INSTALL = "apt-get install -y etcd-server etcd-client"


class EtcdServer(ServerProcess):
    name = "etcd"

    def __init__(self, data_dir: Path, port: int, peer_port: int) -> None:
        super().__init__(data_dir)
        self.port = port
        self.peer_port = peer_port

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
            "--name", "streamtrain",
            "--data-dir", str(self.data_dir / "member-data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"streamtrain={peer}",
            "--initial-cluster-state", "new",
            # An endless stream rewrites task keys forever; without compaction the revision
            # history (and the database) would grow without bound.
            "--auto-compaction-mode", "revision",
            "--auto-compaction-retention", "10000",
            "--logger", "zap",
        ]

    def healthy(self) -> bool:
        return health_ok(self.address)


def health_ok(address: str, timeout: float = 2.0) -> bool:
    """etcd's own /health endpoint reports a member that can serve linearizable reads."""
    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=timeout) as resp:
            return json.loads(resp.read()).get("health") == "true"
    except (OSError, urllib.error.URLError, ValueError):
        return False

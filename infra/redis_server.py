"""Redis 7 from Debian's `redis-server`. No persistence: Redis is a cache of the pservers' state."""

from __future__ import annotations

from pathlib import Path

from streamtrain.infra.process import ServerProcess, require

_INSTALL = "apt-get install -y redis-server"


class RedisServer(ServerProcess):
    name = "redis"

    def __init__(self, data_dir: Path, port: int) -> None:
        super().__init__(data_dir)
        self.port = port

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port,)

    @property
    def address(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            require("redis-server", _INSTALL),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", "",
        ]

    def healthy(self) -> bool:
        return ping_ok(self.address)


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

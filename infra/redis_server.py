"""Redis 7 from Debian's `redis-server`. No persistence: Redis is a cache of the pservers' state."""

from __future__ import annotations

from streamtrain.infra.process import OnePortServer, require

_INSTALL = "apt-get install -y redis-server"


class RedisServer(OnePortServer):
    name = "redis"

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

"""The Redis a bench talks to: `STREAMTRAIN_REDIS` if set, else one of its own for the run."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streamtrain.infra.endpoints import Ports
from streamtrain.infra.redis_server import RedisServer


@contextmanager
def redis_url() -> Iterator[str]:
    if url := os.environ.get("STREAMTRAIN_REDIS"):
        yield url
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp), Ports.free().redis)
        server.start()
        try:
            yield server.address
        finally:
            server.stop()

"""`services.json`: the ports of the local services `streamtrain up` chose, in its state dir.

Written by `streamtrain up` (infra/cluster.py); read by every process that resolves endpoints
without the environment naming them: the CLI, the job's master, trainers and pservers
(infra/endpoints.py), which is why it is a format of its own.

    {"v": 1, "ports": {"kafka": 19092, "kafka_controller": 19093, "etcd": 19094, "etcd_peer": 19095,
                       "redis": 19096, "registry": 19097, "etcd_more": [[19104, 19105]]}}

Versions: a file without "v" is version 1. Every file written before the version was added
has that layout (the `ports` object, `registry` and the `*_more` lists possibly absent), so
reading it as version 1 keeps a state dir made by an older `up` working; a file of any other
version is refused with an error naming the file, because an older reader would otherwise
connect to the wrong ports.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from . import _json
from ._check import Check
from .errors import SchemaError

VERSION = 1
_check = Check("ServicePorts", VERSION)
_PORT_MAX = 65535
_SINGLE = ("kafka", "kafka_controller", "etcd", "etcd_peer", "redis", "registry")
_PAIRS = ("etcd_more", "kafka_more", "redis_cluster")

Pairs = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ServicePorts:
    """The loopback ports of one installation's services; infra.endpoints.Ports says what each
    one is. `*_more` and `redis_cluster` are (client, peer) pairs, empty for a single node.

    Raises:
        SchemaError: a port is not an integer in 1..65535, or a pair not two of them
            (names it: `ports.etcd`, `ports.kafka_more[1][0]`).
    """

    kafka: int
    kafka_controller: int
    etcd: int
    etcd_peer: int
    redis: int
    registry: int
    etcd_more: Pairs = ()
    kafka_more: Pairs = ()
    redis_cluster: Pairs = ()

    def __post_init__(self) -> None:
        for name in _SINGLE:
            _check.integer(f"ports.{name}", getattr(self, name), lo=1, hi=_PORT_MAX)
        for name in _PAIRS:
            object.__setattr__(self, name, _pairs(name, getattr(self, name)))

    def to_json(self) -> bytes:
        ports: dict[str, Any] = {name: getattr(self, name) for name in _SINGLE}
        # A single node's empty lists are left out: what older versions wrote, and can read.
        ports.update({name: [list(p) for p in getattr(self, name)] for name in _PAIRS if getattr(self, name)})
        return _json.dumps({"v": VERSION, "ports": ports}, indent=2)

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        """Raises: SchemaError. A document without "v" reads as version 1 (module docstring)."""
        doc = _json.loads(_check, data, unversioned=True)
        ports = _json.obj(_check, _json.field(_check, doc, "ports"), "ports")
        single = [_json.field(_check, ports, name, path=f"ports.{name}") for name in _SINGLE[:-1]]
        # Files from before the schema registry had a port: it is the one after Redis's.
        registry: Any = ports.get("registry", single[-1] + 1 if type(single[-1]) is int else None)
        kafka, kafka_controller, etcd, etcd_peer, redis = single
        pairs: list[Any] = [_json.array(_check, ports.get(name, []), f"ports.{name}") for name in _PAIRS]
        return cls(kafka, kafka_controller, etcd, etcd_peer, redis, registry, *pairs)  # __post_init__ checks them

    @classmethod
    def read(cls, path: Path) -> Self | None:
        """The file at `path`; None if there is none.

        Raises:
            SchemaError: it is malformed or of a version this reader does not know; the
                reason names the file.
            OSError: it exists but cannot be read.
        """
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return cls.from_json(data)
        except SchemaError as exc:
            raise _check.error(exc.field, f"{exc.reason} (in {path})") from None

    def write(self, path: Path) -> None:
        """Replace the file at `path` at once: a reader sees the old ports or the new, never half."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(self.to_json())
        os.replace(tmp, path)


def _pairs(name: str, value: object) -> Pairs:
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise _check.error(f"ports.{name}", f"expected a list of [client, peer] ports, got {type(value).__name__}")
    out: list[tuple[int, int]] = []
    for i, pair in enumerate(value):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise _check.error(f"ports.{name}[{i}]", f"expected [client, peer], got {pair!r}")
        client, peer = (_check.integer(f"ports.{name}[{i}][{j}]", p, lo=1, hi=_PORT_MAX) for j, p in enumerate(pair))
        out.append((client, peer))
    return tuple(out)

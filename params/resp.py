"""Redis MSET and MGET commands for many rows, written by one compiled pass, and `Batch`, which
sends commands in one write and reads back exactly their replies.

redis-py packs a command argument by argument in Python, and the keys and values must exist
as Python bytes first, both a cost per row. Here a whole
MSET or MGET is written into one buffer by a numba pass over the ids, in their order, with no
Python work per row (the bytes are the ones redis-py and `schemas.encode_rows` would produce
for the same keys, which the tests check). A trainer names a few hundred keys a pull, every
mini-batch: numpy passes over them cost it several times as much (bench/RESULTS.md, "Figures
moved from the code and the docs").
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import numpy as np
import redis

_BULK_HEAD = 1 + 20 + 2  # "$", a length, CRLF
_NO_VALUES = np.empty((0, 0), dtype=np.uint8)


def _args(prefix: bytes, ids: np.ndarray, values: np.ndarray) -> bytes:
    per_row = _BULK_HEAD + len(prefix) + 20 + 2 + (_BULK_HEAD + values.shape[1] + 2 if len(values) else 0)
    out = np.empty(len(ids) * per_row, dtype=np.uint8)
    used = _packer()(np.frombuffer(prefix, dtype=np.uint8), ids.astype(np.uint64, copy=False), values, out)
    return out[:used].tobytes()


@functools.cache
def _packer():
    # Imported at the first command: numba's import is about a second of a process's start,
    # which the CLI and the tools that never pull rows need not pay (docs/dependencies.md).
    from streamtrain.params.kernels import pack
    return pack


def mset(prefix: bytes, ids: np.ndarray, values: np.ndarray) -> bytes:
    """``MSET <prefix><id> <value> ...`` in RESP, in the order of `ids`; `values` is (n, size)
    uint8, one row each."""
    values = np.ascontiguousarray(values, dtype=np.uint8)
    return b"*%d\r\n$4\r\nMSET\r\n" % (2 * len(ids) + 1) + _args(prefix, ids, values)


def mget(prefix: bytes, ids: np.ndarray) -> bytes:
    """``MGET <prefix><id> ...`` in RESP (at least one id), in the order of `ids`: the
    order of the replies."""
    return b"*%d\r\n$4\r\nMGET\r\n" % (len(ids) + 1) + _args(prefix, ids, _NO_VALUES)


def command(*args: bytes) -> bytes:
    """Any command in RESP, for the odd one written beside the matrices."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class Connection(Protocol):
    """What `Batch.send` needs of a redis-py connection (`redis.connection.Connection`)."""

    def send_packed_command(self, command: list[bytes], check_health: bool = True) -> None: ...

    def read_response(self) -> Any: ...


class Batch:
    """Commands for one Redis connection, sent in one write, with exactly their replies read.

    Why not redis-py's pipeline: it packs every argument in Python (the MSETs of a shard's
    round are thousands of rows, which `mset` writes in one compiled pass) and its
    `send_packed_command` writes a list of commands item by item, a syscall each, and Redis
    wakes up to read each one. Measured in bench/RESULTS.md: "2026-11 (development sessions): a
    shard's apply rate and memory" (`bench.pserver_apply`: where publish time goes, redis-py's
    packing against RESP built at once) and "2026-11-24 (session 24): a publishing round's CPU"
    (`bench.publish_round`: a round in one write against a write per command).

    Sending raw bytes leaves the replies to read by hand, and one miscount desynchronises the
    connection: every later reply would answer another command. So nothing is counted by
    hand: every command is added here, `add` outside a transaction (one reply each) or `queue`
    between `multi` and `exec` (a ``QUEUED`` each, and one element of EXEC's reply), and `send`
    reads one reply per command added. A reply of the wrong kind where a ``QUEUED``, MULTI's
    ``OK`` or EXEC's array of one result per queued command is due raises
    `redis.InvalidResponse`, so a command that was not one command (`add` takes packed bytes)
    is caught at the first reply out of step, not passed on. An error reply raises as redis-py
    raises it; after any exception the replies left unread make the connection unusable, so the
    caller disconnects it rather than return it to a pool.
    """

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._replies: list[str] = []  # per reply due, in order: "any", "ok", "queued" or "exec"
        self._queued = 0  # commands queued in the batch's transaction
        self._open = False  # between `multi` and `exec`

    def add(self, packed: bytes) -> None:
        """One command outside a transaction, as RESP bytes (`mset`, `command`): one reply."""
        if self._open:
            raise ValueError("Batch.add inside a transaction: use queue")
        self._append(packed, "any")

    def multi(self) -> None:
        """Open the batch's transaction (one at most): the commands queued next run at `exec`,
        at one instant."""
        if self._open or "exec" in self._replies:
            raise ValueError("Batch.multi: one transaction per batch")
        self._append(command(b"MULTI"), "ok")
        self._open, self._queued = True, 0

    def queue(self, packed: bytes) -> None:
        """One command of the open transaction, as RESP bytes: a ``QUEUED`` now, its result
        in EXEC's reply."""
        if not self._open:
            raise ValueError("Batch.queue outside a transaction: call multi first")
        self._append(packed, "queued")
        self._queued += 1

    def exec(self) -> None:
        """Close the transaction: its results are `send`'s."""
        if not self._open:
            raise ValueError("Batch.exec without multi")
        self._append(command(b"EXEC"), "exec")
        self._open = False

    def send(self, conn: Connection) -> list[Any]:
        """Write every command in one write and read one reply per command; returns the
        transaction's results, one per queued command in order ([] without a transaction).

        Raises:
            redis.InvalidResponse: a reply out of step with the commands (see the class).
            redis.ResponseError: an error reply, or the first failed command of the transaction.
            redis.ConnectionError, redis.TimeoutError: as redis-py's connection raises them.
        """
        if self._open:
            raise ValueError("Batch.send with a transaction still open: call exec first")
        conn.send_packed_command([b"".join(self._chunks)])
        results: list[Any] = []
        for due in self._replies:
            reply = conn.read_response()  # an error reply raises here
            if due == "ok" and reply not in (b"OK", "OK"):
                raise redis.InvalidResponse(f"expected MULTI's OK, got {reply!r}: replies out of step")
            if due == "queued" and reply not in (b"QUEUED", "QUEUED"):
                raise redis.InvalidResponse(f"expected QUEUED, got {reply!r}: replies out of step")
            if due == "exec":
                if not isinstance(reply, list) or len(reply) != self._queued:
                    raise redis.InvalidResponse(f"expected EXEC's {self._queued} results, got {reply!r}: "
                                                "replies out of step")
                failed = [r for r in reply if isinstance(r, Exception)]
                if failed:
                    raise failed[0]
                results = reply
        return results

    def _append(self, packed: bytes, due: str) -> None:
        if packed[:1] != b"*":
            raise ValueError(f"not a RESP command: {packed[:20]!r}")
        self._chunks.append(packed)
        self._replies.append(due)

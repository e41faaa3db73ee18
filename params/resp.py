"""Redis MSET and MGET commands for many rows, written by one compiled pass.

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

import numpy as np

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

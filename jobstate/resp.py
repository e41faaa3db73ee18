"""Redis MSET and MGET commands for many rows, built with numpy.

redis-py packs a command argument by argument in Python (about 0.7 µs per key and value) and
the keys and values must exist as Python bytes first (another ~1 µs per row). Here a whole
MSET or MGET is laid out as byte matrices, one per number of digits of the ids, one record per
row: no Python work per row (measured in bench/pserver_apply.py: client CPU 1.8 → 0.4 µs per
row; the bytes are the ones redis-py and `schemas.encode_rows` would produce for the keys in
that order, which the tests check).
"""

from __future__ import annotations

import numpy as np

_POW10 = np.array([10**k for k in range(20)], dtype=np.uint64)
_CRLF = np.frombuffer(b"\r\n", dtype=np.uint8)


def _by_digits(ids: np.ndarray) -> list[tuple[int, np.ndarray | slice]]:
    """The ids grouped by their number of decimal digits: (digits, the group's positions, in
    order; a slice when there is one group). Within a group every key has the same layout,
    so a command's keys are one matrix filled column by column, with no mask to compact."""
    ndigits = np.searchsorted(_POW10[1:], ids, side="right") + 1
    groups = np.flatnonzero(np.bincount(ndigits)).tolist()  # np.unique hashes: 10x slower here
    if len(groups) == 1:
        return [(groups[0], slice(None))]
    return [(d, np.flatnonzero(ndigits == d)) for d in groups]


def _keys(prefix: bytes, ids: np.ndarray, d: int, after: int) -> tuple[np.ndarray, int]:
    """A matrix of one row per id (all of `d` digits): its key as a RESP bulk string, then
    `after` columns for the caller to fill; and the column where those begin."""
    head = np.frombuffer(b"$%d\r\n%s" % (len(prefix) + d, prefix), dtype=np.uint8)
    matrix = np.empty((len(ids), len(head) + d + 2 + after), dtype=np.uint8)
    col = len(head)
    matrix[:, :col] = head
    matrix[:, col:col + d] = ids[:, None] // _POW10[d - 1::-1] % np.uint64(10) + np.uint64(ord("0"))
    col += d
    matrix[:, col:col + 2] = _CRLF
    return matrix, col + 2


def mset(prefix: bytes, ids: np.ndarray, values: np.ndarray) -> bytes:
    """``MSET <prefix><id> <value> ...`` in RESP; `values` is (n, size) uint8, one row each.
    The pairs go grouped by the number of digits of their id (`_by_digits`): the order of an
    MSET's pairs does not matter."""
    n, size = values.shape
    ids = ids.astype(np.uint64, copy=False)
    parts = [b"*%d\r\n$4\r\nMSET\r\n" % (2 * n + 1)]
    head = np.frombuffer(b"$%d\r\n" % size, dtype=np.uint8)
    for d, chosen in _by_digits(ids):
        matrix, col = _keys(prefix, ids[chosen], d, len(head) + size + 2)
        matrix[:, col:col + len(head)] = head
        col += len(head)
        matrix[:, col:col + size] = values[chosen]
        matrix[:, col + size:] = _CRLF
        parts.append(matrix.tobytes())
    return b"".join(parts)


def mget(prefix: bytes, ids: np.ndarray) -> tuple[bytes, np.ndarray | None]:
    """``MGET <prefix><id> ...`` in RESP (at least one id), the keys grouped by the number of
    digits of their id as in `mset`; and the order of the keys sent, as positions in `ids`
    (None: as given), which is the order of the replies. Keys kept in the order given cost
    a mask over the whole matrix: twice the time."""
    ids = ids.astype(np.uint64, copy=False)
    groups = _by_digits(ids)
    parts = [b"*%d\r\n$4\r\nMGET\r\n" % (len(ids) + 1)]
    for d, chosen in groups:
        parts.append(_keys(prefix, ids[chosen], d, 0)[0].tobytes())
    order = None if len(groups) == 1 else np.concatenate([chosen for _, chosen in groups])
    return b"".join(parts), order


def command(*args: bytes) -> bytes:
    """Any command in RESP, for the odd one written beside the matrices."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)

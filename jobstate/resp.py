"""Redis MSET and MGET commands for many rows, built with numpy.

redis-py packs a command argument by argument in Python (about 0.7 µs per key and value) and
the keys and values must exist as Python bytes first (another ~1 µs per row). Here a whole
MSET is laid out as one byte matrix, one record per row, the variable-length decimals
right-aligned and the unused columns dropped by one boolean mask (an MSET: one matrix per
number of digits, no mask): no Python work per row (measured in bench/pserver_apply.py:
client CPU 1.8 → 0.4 µs per row; the bytes are the ones redis-py and `schemas.encode_rows`
would produce, which the tests check).
"""

from __future__ import annotations

import numpy as np

_POW10 = np.array([10**k for k in range(20)], dtype=np.uint64)
_CRLF = np.frombuffer(b"\r\n", dtype=np.uint8)


def _digits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ASCII decimal digits of uint64 `x`, right-aligned in (n, width), and which are real."""
    width = len(str(int(x.max()))) if len(x) else 1
    ndigits = np.searchsorted(_POW10[1:width], x, side="right") + 1
    out = (x[:, None] // _POW10[width - 1::-1] % np.uint64(10)).astype(np.uint8)
    out += ord("0")
    return out, np.arange(width) >= (width - ndigits)[:, None]


def _key_pieces(prefix: bytes, ids: np.ndarray) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Each id's key as a RESP bulk string header and body (``$<len>``, CRLF, ``<prefix><id>``),
    as pieces for `_laid_out`."""
    id_digits, id_mask = _digits(ids.astype(np.uint64, copy=False))
    key_len, len_mask = _digits((id_mask.sum(1) + len(prefix)).astype(np.uint64))
    return [(np.frombuffer(b"$", dtype=np.uint8), None), (key_len, len_mask),
            (np.frombuffer(b"\r\n" + prefix, dtype=np.uint8), None), (id_digits, id_mask)]


def mset(prefix: bytes, ids: np.ndarray, values: np.ndarray) -> bytes:
    """``MSET <prefix><id> <value> ...`` in RESP; `values` is (n, size) uint8, one row each.

    The pairs go grouped by the number of digits of their id, in their order within a group:
    within one, every record has the same layout, so it is one matrix filled column by
    column, with no mask to compact (the order of an MSET's pairs does not matter)."""
    n, size = values.shape
    ids = ids.astype(np.uint64, copy=False)
    ndigits = np.searchsorted(_POW10[1:], ids, side="right") + 1
    parts = [b"*%d\r\n$4\r\nMSET\r\n" % (2 * n + 1)]
    middle = np.frombuffer(b"\r\n$%d\r\n" % size, dtype=np.uint8)
    groups = np.flatnonzero(np.bincount(ndigits)).tolist()  # np.unique hashes: 10x slower here
    for d in groups:
        chosen = np.flatnonzero(ndigits == d) if len(groups) > 1 else slice(None)
        head = np.frombuffer(b"$%d\r\n%s" % (len(prefix) + d, prefix), dtype=np.uint8)
        group = ids[chosen]
        matrix = np.empty((len(group), len(head) + d + len(middle) + size + 2), dtype=np.uint8)
        col = len(head)
        matrix[:, :col] = head
        matrix[:, col:col + d] = group[:, None] // _POW10[d - 1::-1] % np.uint64(10) + np.uint64(ord("0"))
        col += d
        matrix[:, col:col + len(middle)] = middle
        col += len(middle)
        matrix[:, col:col + size] = values[chosen]
        matrix[:, col + size:] = _CRLF
        parts.append(matrix.tobytes())
    return b"".join(parts)


def mget(prefix: bytes, ids: np.ndarray) -> bytes:
    """``MGET <prefix><id> ...`` in RESP (at least one id)."""
    pieces = _key_pieces(prefix, ids) + [(np.frombuffer(b"\r\n", dtype=np.uint8), None)]
    return b"*%d\r\n$4\r\nMGET\r\n" % (len(ids) + 1) + _laid_out(len(ids), pieces)


def command(*args: bytes) -> bytes:
    """Any command in RESP, for the odd one written beside the matrices."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _laid_out(n: int, pieces: list[tuple[np.ndarray, np.ndarray | None]]) -> bytes:
    """The pieces side by side, one record per row, masked-out columns dropped."""
    width = sum(p.shape[-1] for p, _ in pieces)
    matrix = np.empty((n, width), dtype=np.uint8)
    keep = np.ones((n, width), dtype=bool)
    col = 0
    for piece, mask in pieces:
        matrix[:, col:col + piece.shape[-1]] = piece
        if mask is not None:
            keep[:, col:col + piece.shape[-1]] = mask
        col += piece.shape[-1]
    return matrix[keep].tobytes()

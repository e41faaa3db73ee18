"""Compiled passes over rows that are not update rules (those are params/optimizer_kernels.py):
a Redis command's keys and values written as RESP bulk strings (params/resp.py), and rows'
initial values (params/rows.py). Imported at first use: numba's import is about a second
of a process's start (docs/dependencies.md)."""

from __future__ import annotations

import numba
import numpy as np

_TEN = np.uint64(10)
_ZERO = np.uint64(ord("0"))


@numba.njit(cache=True, nogil=True)
def _length(out, at, n):
    """Writes `$<n>\\r\\n` at `at`; returns where it ends."""
    out[at] = 36  # "$"
    digits = 1
    rest = n // 10
    while rest:
        digits += 1
        rest //= 10
    for k in range(digits, 0, -1):
        out[at + k] = 48 + n % 10
        n //= 10
    at += digits + 1
    out[at] = 13
    out[at + 1] = 10
    return at + 2


@numba.njit(cache=True, nogil=True)
def pack(prefix, ids, values, out):
    """For each id, `<prefix><id>` as a RESP bulk string, then (when `values` has rows) its
    value row as another; returns the bytes written to `out`."""
    digits = np.empty(20, dtype=np.uint8)
    with_values = values.shape[0] > 0
    size = values.shape[1]
    at = 0
    for i in range(ids.shape[0]):
        v = ids[i]
        d = 0
        while True:
            digits[d] = v % _TEN + _ZERO
            v //= _TEN
            d += 1
            if v == 0:
                break
        at = _length(out, at, prefix.shape[0] + d)
        out[at:at + prefix.shape[0]] = prefix
        at += prefix.shape[0]
        for k in range(d):
            out[at + k] = digits[d - 1 - k]
        at += d
        out[at] = 13
        out[at + 1] = 10
        at += 2
        if with_values:
            at = _length(out, at, size)
            out[at:at + size] = values[i]
            at += size
            out[at] = 13
            out[at + 1] = 10
            at += 2
    return at


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_UNIT = np.float32(1.0 / (1 << 24))


@numba.njit(cache=True, nogil=True)
def initial_rows(ids, salt, scale, out):
    """`rows.initial_rows` into `out` (n, dim): the same splitmix64 counters and float32
    arithmetic, in one pass (the numpy formula's several passes over a few hundred new rows a
    mini-batch cost a shard's main thread more)."""
    dim = out.shape[1]
    width = np.uint64(dim)
    twice = np.float32(2 * scale)
    low = np.float32(scale)
    for i in range(ids.shape[0]):
        base = (ids[i] ^ salt) * width
        for j in range(dim):
            z = base + np.uint64(j) + _GOLDEN
            z ^= z >> np.uint64(30)
            z *= _M1
            z ^= z >> np.uint64(27)
            z *= _M2
            z ^= z >> np.uint64(31)
            out[i, j] = np.float32(z >> np.uint64(40)) * _UNIT * twice - low

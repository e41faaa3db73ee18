"""A chunk of Example JSON records into the job's columns by one compiled pass over their bytes.

The loader's JSON path tries this first (trainer/decoders.py). It takes only what the schemas'
writer makes, give or take whitespace and key order: one object per record with `v` 1,
`sparse` holding every declared field once and no other, each an array of unsigned integers
below 2^64, `dense` an array of the job's width, a number `label`, an integer `ts`; each key
once, no escapes in keys, JSON's number grammar. Anything else (a key unknown, a field left
out, a string with an escape, NaN) makes the whole chunk go to pyarrow's reader, and from
there record by record: so this decides speed, never a verdict, and every record it takes,
the one-record decoder takes with the same values.

Numbers are checked against JSON's grammar here, but the floats' text is converted by Arrow's
cast, which rounds correctly (as Python's `float` does), so the values are the ones a JSON
parser gives. Alone it decodes a chunk more than twice as fast as pyarrow's reader
(bench/RESULTS.md, "JSON scanned by one compiled pass").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamtrain.trainer.features import Columns

_U64_MAX = np.uint64(2**64 - 1)
_I64_MAX = 2**63 - 1
# Top-level keys, as the bit each sets once seen.
_V, _SPARSE, _DENSE, _LABEL, _TS = 1, 2, 4, 8, 16
_ALL = 31


@numba.njit(cache=True, nogil=True)
def _ws(buf, i, end):
    while i < end and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
        i += 1
    return i


@numba.njit(cache=True, nogil=True)
def _number(buf, i, end):
    """Where JSON's number starting at `i` ends; -1 if none starts there."""
    if i < end and buf[i] == 45:  # -
        i += 1
    if i >= end:
        return -1
    if buf[i] == 48:  # a lone 0: no leading zeros
        i += 1
    elif 49 <= buf[i] <= 57:
        while i < end and 48 <= buf[i] <= 57:
            i += 1
    else:
        return -1
    if i < end and buf[i] == 46:  # .
        i += 1
        if i >= end or not 48 <= buf[i] <= 57:
            return -1
        while i < end and 48 <= buf[i] <= 57:
            i += 1
    if i < end and (buf[i] == 101 or buf[i] == 69):  # e E
        i += 1
        if i < end and (buf[i] == 43 or buf[i] == 45):
            i += 1
        if i >= end or not 48 <= buf[i] <= 57:
            return -1
        while i < end and 48 <= buf[i] <= 57:
            i += 1
    return i


@numba.njit(cache=True, nogil=True)
def _fraction(buf, j, end):
    """Whether the digits ending at `j` go on as a fraction or an exponent: not an integer."""
    return j < end and (buf[j] == 46 or buf[j] == 101 or buf[j] == 69)


@numba.njit(cache=True, nogil=True)
def _key(buf, i, end):
    """The end of the key string opening at `i` (its closing quote); -1 if it holds an
    escape or never closes."""
    if i >= end or buf[i] != 34:
        return -1
    i += 1
    while i < end and buf[i] != 34:
        if buf[i] == 92:  # backslash
            return -1
        i += 1
    return i if i < end else -1


@numba.njit(cache=True, nogil=True)
def _field(buf, a, b, names, name_at):
    """The declared field named by buf[a:b]; -1 if none."""
    for k in range(name_at.shape[0] - 1):
        s, e = name_at[k], name_at[k + 1]
        if e - s != b - a:
            continue
        same = True
        for j in range(e - s):
            if names[s + j] != buf[a + j]:
                same = False
                break
        if same:
            return k
    return -1


@numba.njit(cache=True, nogil=True)
def _is(buf, a, b, text):
    if b - a != len(text):
        return False
    for j in range(b - a):
        if buf[a + j] != text[j]:
            return False
    return True


# The scan repeats its "a comma, or the closing bracket" and digit loops inline: as helpers
# returning (position, state) tuples they make the scan half again to twice as slow.
@numba.njit(cache=True, nogil=True)
def scan(buf, starts, ends, names, name_at, width, ids, seg_at, seg_len, num_at, num_end, times):
    """Parses every record buf[starts[r]:ends[r]]. Writes the ids in text order to `ids`,
    where record r's field k begins at seg_at[r, k] and holds seg_len[r, k]; the text spans of
    the dense values then the label to num_at/num_end[r * (width + 1) + j]; the times to
    `times`. Returns the number of ids, or -1 - r for the first record r it does not take."""
    fields = name_at.shape[0] - 1
    seen = np.zeros(fields, dtype=np.bool_)
    k_v = np.array([118], dtype=np.uint8)
    k_sparse = np.array([115, 112, 97, 114, 115, 101], dtype=np.uint8)
    k_dense = np.array([100, 101, 110, 115, 101], dtype=np.uint8)
    k_label = np.array([108, 97, 98, 101, 108], dtype=np.uint8)
    k_ts = np.array([116, 115], dtype=np.uint8)
    n_ids = 0
    for r in range(starts.shape[0]):
        end = ends[r]
        i = _ws(buf, starts[r], end)
        if i >= end or buf[i] != 123:  # {
            return -1 - r
        i += 1
        top = 0
        while True:
            i = _ws(buf, i, end)
            close = _key(buf, i, end)
            if close < 0:
                return -1 - r
            a, b = i + 1, close
            i = _ws(buf, close + 1, end)
            if i >= end or buf[i] != 58:  # :
                return -1 - r
            i = _ws(buf, i + 1, end)
            if _is(buf, a, b, k_v):
                if top & 1 or i >= end or buf[i] != 49:
                    return -1 - r
                stop = _number(buf, i, end)
                if stop != i + 1:  # exactly 1
                    return -1 - r
                i = stop
                top |= 1
            elif _is(buf, a, b, k_ts):
                if top & 16:
                    return -1 - r
                ms = 0
                j = i
                while j < end and 48 <= buf[j] <= 57:
                    if ms > (9223372036854775807 - (buf[j] - 48)) // 10:
                        return -1 - r
                    ms = ms * 10 + (buf[j] - 48)
                    j += 1
                if j == i or _fraction(buf, j, end) or (buf[i] == 48 and j > i + 1):
                    return -1 - r
                times[r] = ms
                i = j
                top |= 16
            elif _is(buf, a, b, k_label):
                if top & 8:
                    return -1 - r
                stop = _number(buf, i, end)
                if stop < 0:
                    return -1 - r
                num_at[r * (width + 1) + width] = i
                num_end[r * (width + 1) + width] = stop
                i = stop
                top |= 8
            elif _is(buf, a, b, k_dense):
                if top & 4 or i >= end or buf[i] != 91:  # [
                    return -1 - r
                i = _ws(buf, i + 1, end)
                count = 0
                if i < end and buf[i] == 93:  # ]
                    i += 1
                else:
                    while True:
                        stop = _number(buf, i, end)
                        if stop < 0 or count >= width:
                            return -1 - r
                        num_at[r * (width + 1) + count] = i
                        num_end[r * (width + 1) + count] = stop
                        count += 1
                        i = _ws(buf, stop, end)
                        if i < end and buf[i] == 44:  # ,
                            i = _ws(buf, i + 1, end)
                        elif i < end and buf[i] == 93:
                            i += 1
                            break
                        else:
                            return -1 - r
                if count != width:
                    return -1 - r
                top |= 4
            elif _is(buf, a, b, k_sparse):
                if top & 2 or i >= end or buf[i] != 123:
                    return -1 - r
                seen[:] = False
                got = 0
                i = _ws(buf, i + 1, end)
                if i < end and buf[i] == 125:  # }
                    i += 1
                else:
                    while True:
                        close = _key(buf, i, end)
                        if close < 0:
                            return -1 - r
                        k = _field(buf, i + 1, close, names, name_at)
                        if k < 0 or seen[k]:
                            return -1 - r
                        seen[k] = True
                        got += 1
                        i = _ws(buf, close + 1, end)
                        if i >= end or buf[i] != 58:
                            return -1 - r
                        i = _ws(buf, i + 1, end)
                        if i >= end or buf[i] != 91:
                            return -1 - r
                        i = _ws(buf, i + 1, end)
                        seg_at[r, k] = n_ids
                        held = 0
                        if i < end and buf[i] == 93:
                            i += 1
                        else:
                            while True:
                                value = np.uint64(0)
                                j = i
                                while j < end and 48 <= buf[j] <= 57:
                                    digit = np.uint64(buf[j] - 48)
                                    if value > (_U64_MAX - digit) // np.uint64(10):
                                        return -1 - r
                                    value = value * np.uint64(10) + digit
                                    j += 1
                                if j == i or _fraction(buf, j, end) or (buf[i] == 48 and j > i + 1):
                                    return -1 - r
                                if n_ids >= ids.shape[0]:
                                    return -1 - r
                                ids[n_ids] = value
                                n_ids += 1
                                held += 1
                                i = _ws(buf, j, end)
                                if i < end and buf[i] == 44:
                                    i = _ws(buf, i + 1, end)
                                elif i < end and buf[i] == 93:
                                    i += 1
                                    break
                                else:
                                    return -1 - r
                        seg_len[r, k] = held
                        i = _ws(buf, i, end)
                        if i < end and buf[i] == 44:
                            i = _ws(buf, i + 1, end)
                        elif i < end and buf[i] == 125:
                            i += 1
                            break
                        else:
                            return -1 - r
                if got != fields:
                    return -1 - r
                top |= 2
            else:
                return -1 - r
            i = _ws(buf, i, end)
            if i < end and buf[i] == 44:
                i += 1
            elif i < end and buf[i] == 125:
                i += 1
                break
            else:
                return -1 - r
        if top != 31 or _ws(buf, i, end) != end:
            return -1 - r
    return n_ids


@numba.njit(cache=True, nogil=True)
def gather(ids, seg_at, seg_len, out):
    """Each field's ids in record order, field after field, into `out`."""
    at = 0
    for k in range(seg_at.shape[1]):
        for r in range(seg_at.shape[0]):
            s = seg_at[r, k]
            for j in range(seg_len[r, k]):
                out[at] = ids[s + j]
                at += 1


@numba.njit(cache=True, nogil=True)
def compact(buf, num_at, num_end, offsets, out):
    """The numbers' text one after another, with Arrow's string offsets."""
    at = 0
    offsets[0] = 0
    for t in range(num_at.shape[0]):
        for j in range(num_at[t], num_end[t]):
            out[at] = buf[j]
            at += 1
        offsets[t + 1] = at


class JsonScan:
    """`parse(values)`: the chunk's columns, or None for any chunk this does not take whole."""

    def __init__(self, fields: Sequence[str], dense_features: int) -> None:
        self.fields = tuple(fields)
        self.width = dense_features
        encoded = [f.encode("utf-8") for f in self.fields]
        self._names = np.frombuffer(b"".join(encoded) or b"\0", dtype=np.uint8)
        self._name_at = np.zeros(len(encoded) + 1, dtype=np.int64)
        self._name_at[1:] = np.cumsum([len(e) for e in encoded])

    def parse(self, values: Sequence[bytes | None]) -> Columns | None:
        n = len(values)
        if n == 0 or not self.fields:
            return None
        # A record without a value (None) makes the join raise TypeError: not taken here.
        records = cast("Sequence[bytes]", values)
        try:
            joined = b"".join(records)
        except TypeError:
            return None
        buf = np.frombuffer(joined, dtype=np.uint8)
        lengths = np.fromiter(map(len, records), dtype=np.int64, count=n)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        fields, width = len(self.fields), self.width
        ids = np.empty(len(joined) // 2 + 1, dtype=np.uint64)  # an id takes a digit and a comma or bracket
        seg_at = np.zeros((n, fields), dtype=np.int64)
        seg_len = np.zeros((n, fields), dtype=np.int64)
        num_at = np.zeros(n * (width + 1), dtype=np.int64)
        num_end = np.zeros(n * (width + 1), dtype=np.int64)
        times = np.empty(n, dtype=np.int64)
        found = scan(buf, starts, ends, self._names, self._name_at, width, ids, seg_at, seg_len,
                     num_at, num_end, times)
        if found < 0:
            return None
        by_field = np.empty(found, dtype=np.uint64)
        gather(ids, seg_at, seg_len, by_field)
        text = np.empty(int((num_end - num_at).sum()), dtype=np.uint8)
        offsets = np.empty(num_at.shape[0] + 1, dtype=np.int32)
        compact(buf, num_at, num_end, offsets, text)
        strings = pa.StringArray.from_buffers(num_at.shape[0], pa.py_buffer(offsets), pa.py_buffer(text))
        try:
            numbers = pc.cast(strings, pa.float64()).to_numpy(zero_copy_only=False).reshape(n, width + 1)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        wide, labels = numbers[:, :width], numbers[:, width]
        with np.errstate(over="ignore", invalid="ignore"):
            dense32 = wide.astype(np.float32)
            fits = (np.isfinite(dense32).all() and np.isfinite(wide).all()
                    and bool(((labels >= 0.0) & (labels <= 1.0)).all()))
        if not fits:
            return None
        columns, at = [], 0
        for k in range(fields):
            lengths = seg_len[:, k].copy()
            total = int(lengths.sum())
            columns.append((by_field[at:at + total], lengths))
            at += total
        return Columns(tuple(columns), np.ascontiguousarray(dense32), labels.astype(np.float32), times)

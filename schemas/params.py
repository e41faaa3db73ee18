"""Parameters as the pservers publish them to Redis: dense blocks, and sparse rows one per key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._binary import PREAMBLE, BytesLike, Reader, le
from ._check import U16_MAX, U32_MAX, U64_MAX, Check, unchecked

VERSION = 1
MAGIC = b"SB"
_check = Check("ParamBlock", VERSION)
_rows_check = Check("EmbeddingRows", VERSION)

_HEADER = le("BIQI")  # after magic and version: param name length, block, version, value count
_ALIGN = 8

# A row's 4-byte header read as one little-endian u32: magic byte 'R', version, u16 dim.
# Comparing that one word per row checks magic, version and dim in a single array op.
ROW_MAGIC = 0x52
ROW_HEADER_BYTES = 4


@dataclass(frozen=True, eq=False)
class ParamBlock:
    """One dense parameter block at one version.

    ``values`` is kept as C-contiguous float32 and not copied; from_bytes returns a read-only
    view of the input, so copy it before writing into it.

    Raises:
        SchemaError: a value does not fit (names the field).
    """

    param: str
    block: int
    version: int
    values: np.ndarray

    def __post_init__(self) -> None:
        _check.name("param", self.param)
        object.__setattr__(self, "block", _check.integer("block", self.block, hi=U32_MAX))
        object.__setattr__(self, "version", _check.integer("version", self.version, hi=U64_MAX))
        values = _check.float_array("values", self.values, ndim=1)
        if values.size > U32_MAX:
            raise _check.error("values", f"{values.size} values, at most {U32_MAX} per block")
        object.__setattr__(self, "values", values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParamBlock):
            return NotImplemented
        head = (self.param, self.block, self.version) == (other.param, other.block, other.version)
        return head and bool(np.array_equal(self.values, other.values))

    @classmethod
    def of_wire_types(cls, param: str, block: int, version: int, values: np.ndarray) -> ParamBlock:
        """From fields that have the wire's types already (a shard's own blocks: a name of at
        most 255 bytes, integers in range, `values` a 1-D C-contiguous float32 array). Checks
        only that the name is not empty and the values finite: a shard publishes every
        changed block each round, and the full checks would be most of encoding one."""
        _check.named_values("param", param, values)
        return unchecked(cls, param=param, block=block, version=version, values=values)

    def to_bytes(self) -> bytes:
        param = self.param.encode("utf-8")
        head = PREAMBLE.pack(MAGIC, VERSION) + _HEADER.pack(len(param), self.block, self.version,
                                                            self.values.size) + param
        return b"".join((head, bytes(-len(head) % _ALIGN), np.ascontiguousarray(self.values, dtype="<f4").data))

    @classmethod
    def from_bytes(cls, data: BytesLike) -> ParamBlock:
        """Raises: SchemaError."""
        r = Reader(_check, data, MAGIC)
        name_len, block, version, count = r.unpack(_HEADER, "header")
        param = r.text(name_len, "param")
        r.align(_ALIGN, "padding")
        values = r.array("<f4", count, "values")
        r.finish()
        # Widths and ranges hold by the wire format (a u32 block and count, a u64 version,
        # float32 values): only the name and the values' finiteness are left to check. A pull
        # decodes every dense block, so the dataclass's own checks would be half its decoding.
        _check.name("param", param)
        _check.finite("values", values)
        return unchecked(cls, param=param, block=block, version=version, values=values)


def encode_rows(values: np.ndarray) -> list[bytes]:
    """One Redis value per row: the 4-byte row header, then ``dim`` little-endian float32.

    Raises: SchemaError (field ``values``) for a non-2-D, non-float, non-finite array or a
    dim outside [1, 65535].
    """
    matrix = encode_rows_matrix(values)
    buf = matrix.tobytes()
    size = matrix.shape[1]
    return [buf[i : i + size] for i in range(0, len(buf), size)]


def encode_rows_matrix(values: np.ndarray) -> np.ndarray:
    """`encode_rows` as one (n, 4 + 4 dim) uint8 array, row i being the bytes of row i."""
    values = _rows_check.float_array("values", values, ndim=2)
    n, dim = values.shape
    _check_dim("values", dim)
    words = np.empty((n, 1 + dim), dtype="<u4")
    words[:, 0] = _row_word(dim)
    words[:, 1:] = values.astype("<f4", copy=False).view("<u4")
    return words.view(np.uint8)


def decode_rows(raw: Sequence[BytesLike | None], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode an MGET reply: ``(values (n, dim) float32, present (n,) bool)``.

    Missing rows (None) come back as zeros with ``present`` False. ``values`` is a fresh,
    writable, C-contiguous array. The work is a few array ops over one joined buffer; the
    only per-row Python work is C-level (len, join).

    Raises: SchemaError naming ``rows[i]`` for a row of the wrong length, header or content.
    """
    dim = _check_dim("dim", dim)
    size = ROW_HEADER_BYTES + 4 * dim
    rows: list[Any] = raw if isinstance(raw, list) else list(raw)  # len() and join() check the items
    placeholder = None
    lengths: list[int] | None
    try:
        lengths = list(map(len, rows))  # also the cheapest way to learn that nothing is missing
        missing = 0
    except TypeError:
        # A missing row becomes an all-zero placeholder: zero floats, and a zero header that
        # marks it absent (a real row's header never is zero; that is checked below).
        missing = rows.count(None)
        placeholder = bytes(size)
        rows = [placeholder if r is None else r for r in rows]
        lengths = None
    try:
        if lengths is None:
            lengths = list(map(len, rows))
        joined = bytearray().join(rows)
    except TypeError as exc:
        i = next(i for i, r in enumerate(rows) if not isinstance(r, (bytes, bytearray, memoryview)))
        raise _rows_check.error(f"rows[{i}]", f"expected bytes or None, got {type(rows[i]).__name__}") from exc
    if lengths.count(size) != len(rows):
        i = next(i for i, length in enumerate(lengths) if length != size)
        raise _rows_check.error(f"rows[{i}]", f"{lengths[i]} bytes, expected {size} for dim {dim}")
    words = np.frombuffer(joined, dtype="<u4").reshape(len(rows), 1 + dim)
    present = words[:, 0] == _row_word(dim)
    if int(np.count_nonzero(present)) != len(rows) - missing:
        i = next(i for i, ok in enumerate(present.tolist()) if not ok and rows[i] is not placeholder)
        raise _rows_check.error(f"rows[{i}]", _header_problem(words[i, 0], dim))
    floats = words[:, 1:].view("<f4")
    finite = np.isfinite(floats)
    if not finite.all():
        row, col = np.unravel_index(int(np.argmin(finite)), finite.shape)
        word = "NaN" if np.isnan(floats[row, col]) else "inf"
        raise _rows_check.error(f"rows[{row}]", f"{word} not allowed (at [{col}])")
    return np.ascontiguousarray(floats, dtype=np.float32), present


def _row_word(dim: int) -> int:
    return ROW_MAGIC | VERSION << 8 | dim << 16


def _check_dim(field: str, dim: object) -> int:
    return _rows_check.integer(field, dim, lo=1, hi=U16_MAX)


def _header_problem(word: np.uint32 | int, dim: int) -> str:
    word = int(word)
    magic, version, got_dim = word & 0xFF, (word >> 8) & 0xFF, word >> 16
    if magic != ROW_MAGIC:
        return f"bad magic byte 0x{magic:02x}, expected 0x{ROW_MAGIC:02x}"
    if version != VERSION:
        return f"unknown version {version}; this reader understands {VERSION}"
    return f"row has dim {got_dim}, expected {dim}"

"""Little-endian framing shared by the binary formats: magic, version, bounds-checked reads."""

from __future__ import annotations

import struct

import numpy as np

from ._check import Check

# What decoders accept: anything exposing a contiguous buffer (bytes from Kafka and Redis, mostly).
BytesLike = bytes | bytearray | memoryview


def le(fmt: str) -> struct.Struct:
    """A little-endian struct layout, without native alignment padding."""
    return struct.Struct("<" + fmt)


PREAMBLE = le("2sB")  # magic, format version
_U8 = le("B")
# A table's rows (gradient deltas, published rounds): name length, row count, dim; then the
# name, zero padding to 8 bytes, the u64 ids and the values row after row.
_ROWS = le("BIH")


class Reader:
    """A cursor over one encoded value; every read names the field it was reading.

    Arrays come back as np.frombuffer views of the input, so decoding costs no copies.
    """

    __slots__ = ("check", "buf", "pos", "version")

    def __init__(self, check: Check, data: BytesLike, magic: bytes, older: tuple[int, ...] = ()) -> None:
        """`older`: earlier versions the caller still reads (`version` says which one this is)."""
        self.check = check
        try:
            self.buf = memoryview(data).cast("B")
        except TypeError as exc:  # not a buffer, or a non-contiguous one
            raise check.error("$", f"expected contiguous bytes, got {type(data).__name__}") from exc
        self.pos = 0
        got_magic = bytes(self.take(2, "magic"))
        if got_magic != magic:
            raise check.error("magic", f"expected {magic!r}, got {got_magic!r}")
        (version,) = self.unpack(_U8, "version")
        if version != check.version and version not in older:
            known = set(older) if check.version is None else {check.version, *older}
            understood = ", ".join(str(v) for v in sorted(known))
            raise check.error("version", f"unknown version {version}; this reader understands {understood}")
        self.version = version

    def _advance(self, size: int, field: str) -> int:
        """Claim the next ``size`` bytes for ``field``; returns where they start."""
        start = self.pos
        end = start + size
        if end > len(self.buf):
            left = len(self.buf) - start
            raise self.check.error(field, f"truncated: needs {size} bytes at offset {start}, {left} left")
        self.pos = end
        return start

    def take(self, size: int, field: str) -> memoryview:
        start = self._advance(size, field)
        return self.buf[start : self.pos]

    def unpack(self, layout: struct.Struct, field: str) -> tuple:
        return layout.unpack_from(self.buf, self._advance(layout.size, field))

    def text(self, size: int, field: str) -> str:
        raw = self.take(size, field)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise self.check.error(field, f"invalid UTF-8: {exc.reason} at byte {exc.start}") from exc

    def array(self, dtype: str, count: int, field: str) -> np.ndarray:
        start = self._advance(count * np.dtype(dtype).itemsize, field)
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start)

    def scalars(self, code: str, itemsize: int, count: int, field: str) -> tuple:
        """Python numbers straight from the buffer: cheaper than an array for a few values."""
        start = self._advance(count * itemsize, field)
        return struct.unpack_from(f"<{count}{code}", self.buf, start)

    def align(self, to: int, field: str) -> None:
        """Skip zero padding so the next array starts aligned; non-zero padding means corruption."""
        pad = -self.pos % to
        if pad and any(self.take(pad, field)):
            raise self.check.error(field, "padding bytes must be zero")

    def table_rows(self, at: str, dtype: str) -> tuple[str, np.ndarray, np.ndarray]:
        """A table's rows (`Writer.table_rows`): its name, ids (u64) and (n, dim) values."""
        name_len, n, dim = self.unpack(_ROWS, at)
        table = self.text(name_len, f"{at}.table")
        self.align(8, f"{at}.padding")
        ids = self.array("<u8", n, f"{at}.ids")
        return table, ids, self.array(dtype, n * dim, f"{at}.values").reshape(n, dim)

    def finish(self) -> None:
        if self.pos != len(self.buf):
            raise self.check.error("$", f"{len(self.buf) - self.pos} unexpected bytes after the end")


class Writer:
    """Collects parts and joins them once; arrays go in as buffers, copied only by the join."""

    __slots__ = ("parts", "pos")

    def __init__(self, magic: bytes, version: int) -> None:
        self.parts: list[BytesLike] = []
        self.pos = 0
        self.add(PREAMBLE.pack(magic, version))

    def add(self, chunk: BytesLike) -> None:
        chunk = memoryview(chunk).cast("B")
        self.parts.append(chunk)
        self.pos += len(chunk)

    def pack(self, layout: struct.Struct, *values: object) -> None:
        self.add(layout.pack(*values))

    def align(self, to: int) -> None:
        pad = -self.pos % to
        if pad:
            self.add(bytes(pad))

    def array(self, values: np.ndarray, dtype: str) -> None:
        self.add(np.ascontiguousarray(values, dtype=dtype).reshape(-1).data)

    def table_rows(self, table: str, ids: np.ndarray, values: np.ndarray, dtype: str) -> None:
        name = table.encode("utf-8")
        self.pack(_ROWS, len(name), ids.size, values.shape[1])
        self.add(name)
        self.align(8)
        self.array(ids, "<u8")
        self.array(values, dtype)

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


"""GradientDelta: what a trainer publishes to ``<job>.grad.<shard>`` for one push group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ._binary import BytesLike, Reader, Writer, le
from ._check import U32_MAX, U64_MAX, Check, nested, unchecked
from .errors import SchemaError

VERSION = 2  # 2: a dense slice carries the block version it was computed at (`base`)
# Version 1 is still read, so that a shard replaying a log written before it loses nothing: its
# slices get the largest base, which no shard damps.
UNKNOWN_BASE = U64_MAX
MAGIC = b"SG"
_check = Check("GradientDelta", VERSION)
_slice_check = Check("DenseSlice", VERSION)
_rows_check = Check("SparseRows", VERSION)

WireDtype = Literal["float32", "float16"]
_WIRE = {"float32": (1, "<f4"), "float16": (2, "<f2")}
_DTYPE_BY_CODE = {code: name for name, (code, _) in _WIRE.items()}
# float16 rounds anything this large to inf; 65504 is its largest finite value.
_F16_OVERFLOW = 65520.0

# After magic and version: dtype code, shard, seq, step, examples, dense and sparse entry
# counts, task_id and trainer_id byte lengths.
_HEADER = le("BIQQQIIHH")
_DENSE = le("BIQIQ")  # param name length, block, offset, value count, base
_DENSE_V1 = le("BIQI")  # version 1: no base
# Arrays start on 8-byte boundaries so the decoder's frombuffer views are aligned.
_ALIGN = 8


@dataclass(frozen=True, eq=False)
class DenseSlice:
    """Gradient for ``values.size`` consecutive elements of one dense block, from ``offset``.

    ``base`` is the block's version the gradient was computed at: how many steps of the update
    rule the values it trained on include (`ParamBlock.version` as pulled, plus the trainer's
    own steps it added as estimated). A shard damps a gradient by the steps applied since
    (pserver/state.py `staleness_damping`).

    ``values`` is kept as C-contiguous float32 (converted only if it is not already); it is
    not copied, so do not mutate it after construction.
    """

    param: str
    block: int
    offset: int
    values: np.ndarray
    base: int = 0

    def __post_init__(self) -> None:
        _slice_check.name("param", self.param)
        object.__setattr__(self, "block", _slice_check.integer("block", self.block, hi=U32_MAX))
        object.__setattr__(self, "offset", _slice_check.integer("offset", self.offset, hi=U64_MAX))
        values = _slice_check.float_array("values", self.values, ndim=1)
        if values.size > U32_MAX:
            raise _slice_check.error("values", f"{values.size} values, at most {U32_MAX} per slice")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "base", _slice_check.integer("base", self.base, hi=U64_MAX))

    @classmethod
    def of_wire_types(cls, param: str, block: int, offset: int, values: np.ndarray, base: int = 0) -> DenseSlice:
        """From fields that have the wire's types already (`GradientDelta.from_bytes` read
        them, or a trainer made them): a name of at most 255 bytes, integers in range,
        `values` a 1-D C-contiguous float32 array. Checks only that the name is not empty
        and the values finite: a shard decodes, and a trainer builds, several slices a push,
        and the full checks would be half of decoding."""
        _slice_check.named_values("param", param, values)
        return unchecked(cls, param=param, block=block, offset=offset, values=values, base=base)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DenseSlice):
            return NotImplemented
        head = (self.param, self.block, self.offset, self.base) == (other.param, other.block, other.offset, other.base)
        return head and bool(np.array_equal(self.values, other.values))


@dataclass(frozen=True, eq=False)
class SparseRows:
    """Gradient rows for embedding ``table``: ``values[i]`` is the gradient of row ``ids[i]``.

    ``ids`` is kept as uint64 (any non-negative integer array is accepted), ``values`` as
    C-contiguous float32 of shape ``(len(ids), dim)``; neither is copied if already so.
    Ids may repeat; the pserver sums them.
    """

    table: str
    ids: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        _rows_check.name("table", self.table)
        ids, values = _rows_check.rows("", self.ids, self.values, per="entry")
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "values", values)

    @classmethod
    def of_wire_types(cls, table: str, ids: np.ndarray, values: np.ndarray) -> SparseRows:
        """From arrays of the wire's types (1-D uint64 ids; C-contiguous float32 rows, as many
        as ids, of a u16 width), as `DenseSlice.of_wire_types`."""
        _rows_check.decoded_rows("", table, values)
        return unchecked(cls, table=table, ids=ids, values=values)

    @property
    def dim(self) -> int:
        return self.values.shape[1]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SparseRows):
            return NotImplemented
        return (
            self.table == other.table
            and bool(np.array_equal(self.ids, other.ids))
            and bool(np.array_equal(self.values, other.values))
        )


@dataclass(frozen=True)
class GradientDelta:
    """One push group's gradients for one shard.

    ``(task_id, seq)`` identifies the push group across attempts: a re-run of a task produces
    the same keys, and the pserver applies only the first committed delta per key. ``dtype``
    is the wire dtype of the values; float16 halves the bytes, and decoding always gives
    float32 (the float16 rounding of what was sent).

    Raises:
        SchemaError: a value does not fit (names the field, e.g. ``sparse[0].values``).
    """

    task_id: str
    seq: int
    trainer_id: str
    shard: int
    step: int
    examples: int
    dtype: WireDtype = "float32"
    dense: tuple[DenseSlice, ...] = ()
    sparse: tuple[SparseRows, ...] = ()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        _check.text("task_id", self.task_id)
        _check.text("trainer_id", self.trainer_id)
        set_(self, "seq", _check.integer("seq", self.seq, hi=U64_MAX))
        set_(self, "shard", _check.integer("shard", self.shard, hi=U32_MAX))
        set_(self, "step", _check.integer("step", self.step, hi=U64_MAX))
        set_(self, "examples", _check.integer("examples", self.examples, hi=U64_MAX))
        if self.dtype not in _WIRE:
            raise _check.error("dtype", f"{self.dtype!r} is not one of {sorted(_WIRE)}")
        set_(self, "dense", _entries("dense", self.dense, DenseSlice))
        set_(self, "sparse", _entries("sparse", self.sparse, SparseRows))
        if self.dtype == "float16":
            groups: tuple[tuple[str, tuple[DenseSlice | SparseRows, ...]], ...] = (("dense", self.dense),
                                                                                 ("sparse", self.sparse))
            for name, entries in groups:
                for i, entry in enumerate(entries):
                    _fits_float16(f"{name}[{i}].values", entry.values)

    @property
    def dedup_key(self) -> tuple[str, int]:
        return (self.task_id, self.seq)

    def to_bytes(self) -> bytes:
        code, wire = _WIRE[self.dtype]
        task_id = self.task_id.encode("utf-8")
        trainer_id = self.trainer_id.encode("utf-8")
        w = Writer(MAGIC, VERSION)
        w.pack(
            _HEADER, code, self.shard, self.seq, self.step, self.examples,
            len(self.dense), len(self.sparse), len(task_id), len(trainer_id),
        )  # fmt: skip
        w.add(task_id)
        w.add(trainer_id)
        for part in self.dense:
            param = part.param.encode("utf-8")
            w.pack(_DENSE, len(param), part.block, part.offset, part.values.size, part.base)
            w.add(param)
            w.align(_ALIGN)
            w.array(part.values, wire)
        for rows in self.sparse:
            w.table_rows(rows.table, rows.ids, rows.values, wire)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: BytesLike) -> GradientDelta:
        """Decode without copying float32 values: arrays are read-only views of ``data``.

        Raises: SchemaError.
        """
        r = Reader(_check, data, MAGIC, older=(1,))
        code, shard, seq, step, examples, n_dense, n_sparse, task_len, trainer_len = r.unpack(_HEADER, "header")
        dtype = _DTYPE_BY_CODE.get(code)
        if dtype is None:
            raise _check.error("dtype", f"unknown dtype code {code}")
        wire = _WIRE[dtype][1]
        task_id = r.text(task_len, "task_id")
        trainer_id = r.text(trainer_len, "trainer_id")
        dense = []
        for i in range(n_dense):
            at = f"dense[{i}]"
            if r.version == 1:
                name_len, block, offset, count = r.unpack(_DENSE_V1, at)
                base = UNKNOWN_BASE
            else:
                name_len, block, offset, count, base = r.unpack(_DENSE, at)
            param = r.text(name_len, f"{at}.param")
            r.align(_ALIGN, f"{at}.padding")
            values = _widen(r.array(wire, count, f"{at}.values"))
            try:
                dense.append(DenseSlice.of_wire_types(param, block, offset, values, base))
            except SchemaError as err:
                raise nested(err, _check, at) from err
        sparse = []
        for i in range(n_sparse):
            at = f"sparse[{i}]"
            table, ids, values = r.table_rows(at, wire)
            values = _widen(values)
            try:
                sparse.append(SparseRows.of_wire_types(table, ids, values))
            except SchemaError as err:
                raise nested(err, _check, at) from err
        r.finish()
        for field, text in (("task_id", task_id), ("trainer_id", trainer_id)):
            if not text:
                raise _check.error(field, "must not be empty")
        # The rest of __post_init__'s checks hold by the wire format (widths, dtype code).
        return unchecked(cls, task_id=task_id, seq=seq, trainer_id=trainer_id, shard=shard, step=step,
                         examples=examples, dtype=dtype, dense=tuple(dense), sparse=tuple(sparse))


def _entries(field: str, value: object, kind: type) -> tuple:
    if not isinstance(value, (tuple, list)):
        raise _check.error(field, f"expected a tuple of {kind.__name__}, got {type(value).__name__}")
    for i, entry in enumerate(value):
        if not isinstance(entry, kind):
            raise _check.error(f"{field}[{i}]", f"expected {kind.__name__}, got {type(entry).__name__}")
    return tuple(value)


def _fits_float16(field: str, values: np.ndarray) -> None:
    # max and min rather than abs().max(): two passes, no temporary the size of the gradient.
    if values.size and max(float(values.max()), -float(values.min())) >= _F16_OVERFLOW:
        j = int(np.argmax(np.abs(values) >= _F16_OVERFLOW))
        where = "][".join(str(int(i)) for i in np.unravel_index(j, values.shape))
        raise _check.error(field, f"{float(values.flat[j])!r} overflows float16 (at [{where}])")


def _widen(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float32) if values.dtype.itemsize == 2 else values

"""A shard's decode + dedup + apply rate for dim-16 Adagrad, beside a bare numpy Adagrad on the
same rows in the same run (publishing to Redis is not measured here yet).

    python -m bench.pserver_apply [--rows 2000000] [--batch 65536] [--batches 40]

Prints one JSON report: rows/s through `GradientDelta.from_bytes` + `ShardState.apply`, the
bare baseline (deduplicated rows, gather / update / scatter with np.take and np.put on row
views), and their ratio.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from pserver.optimizers import Adagrad
from pserver.rows import row_view
from pserver.state import ShardState
from schemas import GradientDelta, SparseRows, TaskRecord


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="distinct rows in the table")
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()
    dim, rng = 16, np.random.default_rng(0)

    state = ShardState(Adagrad(lr=0.05))
    for start in range(0, args.rows, args.batch):  # every row exists: steady state, not growth
        ids = np.arange(start, min(start + args.batch, args.rows), dtype=np.uint64)
        state._table("user", dim).rows_for(ids)
    payloads, batches = [], []
    for i in range(args.batches):
        ids = np.unique(rng.integers(0, args.rows, args.batch).astype(np.uint64))
        grads = rng.standard_normal((len(ids), dim)).astype(np.float32)
        batches.append((ids, grads))
        payloads.append(GradientDelta(TaskRecord.make_id("in", 0, i), 0, "t", 0, i, 1,
                                      sparse=(SparseRows("user", ids, grads),)).to_bytes())
    total = sum(len(ids) for ids, _ in batches)

    began = time.perf_counter()
    for raw in payloads:
        state.apply(GradientDelta.from_bytes(raw))
    shard = total / (time.perf_counter() - began)

    table = np.zeros((args.rows, dim), dtype=np.float32)
    acc = np.zeros_like(table)
    began = time.perf_counter()
    for ids, grads in batches:
        rows = ids.astype(np.int64)
        p = np.take(row_view(table), rows).view(np.float32).reshape(len(rows), dim)
        a = np.take(row_view(acc), rows).view(np.float32).reshape(len(rows), dim)
        a += grads * grads
        p -= np.float32(0.05) * grads / (np.sqrt(a) + np.float32(1e-10))
        np.put(row_view(table), rows, row_view(p))
        np.put(row_view(acc), rows, row_view(a))
    bare = total / (time.perf_counter() - began)
    print(json.dumps({"rows_in_table": args.rows, "rows_applied": total, "dim": dim,
                      "shard_decode_apply_rows_per_s": round(shard),
                      "bare_numpy_adagrad_rows_per_s": round(bare),
                      "ratio": round(shard / bare, 2)}, indent=2))


if __name__ == "__main__":
    main()

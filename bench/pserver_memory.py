"""Memory of one shard holding 10 million dim-16 Adagrad rows: RSS against the bytes the rows
and their state need in theory.

    python -m bench.pserver_memory [--rows 10000000] [--chunk 500000] [--dim 16]

Builds a `ShardState` with Adagrad (`params.optimizers.make_rule`), applies deltas of
``--chunk`` new distinct ids each (ids spread over the whole uint64 range, as hashed feature
ids are) until ``--rows`` rows exist, and prints one JSON report: VmRSS and VmHWM from
/proc/self/status before and after, the bytes the arrays hold (used and allocated), bytes per
row against the theory (values + accumulator + id + steps + index slots), and the time taken.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import numpy as np

from streamtrain.params.optimizers import make_rule
from streamtrain.pserver.state import ShardState
from streamtrain.schemas import GradientDelta, SparseRows, TaskRecord

MIB = 1 << 20


def proc_status() -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--chunk", type=int, default=500_000, help="new ids per delta")
    parser.add_argument("--dim", type=int, default=16)
    args = parser.parse_args()
    dim = args.dim
    rng = np.random.default_rng(0)
    state = ShardState(make_rule("adagrad", lr=0.05))

    gc.collect()
    before = proc_status()
    seq, done, peak_after_chunk = 0, 0, 0
    began = time.perf_counter()
    apply_seconds = 0.0
    while done < args.rows:
        n = min(args.chunk, args.rows - done)
        # Distinct random 63-bit ids: a random odd multiplier makes consecutive counters look
        # hashed while staying distinct.
        ids = (np.arange(done, done + n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(1)
        grads = rng.standard_normal((n, dim), dtype=np.float32)
        raw = GradientDelta(TaskRecord.make_id("mem", 0, 0), seq, "t", 0, seq, n,
                            sparse=(SparseRows("user", ids, grads),)).to_bytes()
        del ids, grads
        t0 = time.perf_counter()
        state.apply(GradientDelta.from_bytes(raw))
        apply_seconds += time.perf_counter() - t0
        del raw
        seq += 1
        done += n
        peak_after_chunk = max(peak_after_chunk, proc_status()["VmRSS"])
    elapsed = time.perf_counter() - began
    gc.collect()
    after = proc_status()

    table = state.tables["user"]
    arrays = {"values": table.values, "ids": table.ids, "steps": table.steps,
              **{f"state.{k}": v for k, v in table.state.items()},
              "index.keys": table.index._keys, "index.rows": table.index._rows}
    allocated = {k: int(v.nbytes) for k, v in arrays.items()}
    per_row_used = {"values": 4 * dim, "accumulator": 4 * dim, "ids": 8, "steps": 8}
    theory_rows = sum(per_row_used.values())  # 144 B at dim 16
    # The index at its lowest load factor allowed (1/2): two slots of 16 B per row.
    theory_index_min = 16 * 2
    rss_growth = after["VmRSS"] - before["VmRSS"]
    rows = table.size
    print(json.dumps({
        "rows": rows, "dim": dim, "chunk": args.chunk, "deltas": seq,
        "seconds": round(elapsed, 1),
        "apply_seconds": round(apply_seconds, 1),
        "rows_per_s": round(rows / elapsed),
        "vm_rss_before_mib": round(before["VmRSS"] / MIB),
        "vm_rss_after_mib": round(after["VmRSS"] / MIB),
        "vm_hwm_mib": round(after["VmHWM"] / MIB),
        "rss_growth_bytes_per_row": round(rss_growth / rows, 1),
        "peak_bytes_per_row": round((after["VmHWM"] - before["VmRSS"]) / rows, 1),
        "theory_bytes_per_row": {"rows_and_state": theory_rows,
                                 "with_index_at_load_1/2": theory_rows + theory_index_min},
        "allocated_mib": {k: round(v / MIB) for k, v in allocated.items()},
        "allocated_bytes_per_row": round(sum(allocated.values()) / rows, 1),
        "table_capacity": len(table.ids),
        "index_capacity": table.index.capacity,
        "index_load": round(table.index.size / table.index.capacity, 3),
    }, indent=2))


if __name__ == "__main__":
    main()

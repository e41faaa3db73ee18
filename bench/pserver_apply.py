"""Rows a shard applies per second for dim-16 Adagrad through its whole path (decode, apply,
publish to Redis), beside a bare numpy Adagrad on the same rows in the same run.

    python -m bench.pserver_apply [--rows 2000000] [--batch 65536] [--batches 40]
                                  [--window-ms 100] [--skew 0]

Starts its own Redis (or uses STREAMTRAIN_REDIS; the bench writes keys under job
``bench-apply`` and leaves them). Prints one JSON report (docs/pserver-bench.md):

- ``decode_apply``: `GradientDelta.from_bytes` + `ShardState.apply`, nothing published.
- ``decode_apply_publish_sync``: apply every delta polled in one window (``--window-ms`` of
  applying), union the changed ids per table, one `Publisher.publish` on the same thread.
- ``shard``: as the shard process runs: apply on this thread while its `BackgroundPublisher`
  publishes the union of changed ids every ``--window-ms`` from its own thread; reported both
  until every delta is applied and until everything applied is also in Redis.
- ``bare_numpy_adagrad``: deduplicated rows, gather / update / scatter with np.take and np.put
  on row views, no decode, no index, no publish.

``--skew`` > 1 draws ids from a Zipf law of that exponent (hot rows, as real id streams);
the default 0 draws them uniformly, the worst case for coalescing.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
import redis

from bench.redis_for_bench import redis_url
from streamtrain.params.optimizers import Adagrad
from streamtrain.params.rows import row_view
from streamtrain.pserver.dedup import Dedup
from streamtrain.pserver.publish_thread import BackgroundPublisher
from streamtrain.pserver.redis_rounds import Publisher
from streamtrain.pserver.state import Changes, ShardState
from streamtrain.schemas import GradientDelta, SparseRows, TaskRecord

JOB, TABLE, DIM = "bench-apply", "user", 16
TARGET = 2_500_000  # rows/s through the whole shard (issue #4)


# ------------------------------------------------------------------------------- workload


def make_workload(rows: int, batch: int, batches: int, skew: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    payloads, plain = [], []
    for i in range(batches):
        if skew > 1:
            drawn = (rng.zipf(skew, batch) - 1) % rows
            # Scatter the hot ids over the id space (Zipf's are 0, 1, 2, ...).
            drawn = (drawn * 2_654_435_761) % rows
        else:
            drawn = rng.integers(0, rows, batch)
        ids = np.unique(drawn.astype(np.uint64))
        grads = rng.standard_normal((len(ids), DIM)).astype(np.float32)
        plain.append((ids, grads))
        payloads.append(GradientDelta(TaskRecord.make_id("in", 0, i), 0, "t", 0, i, 1,
                                      sparse=(SparseRows(TABLE, ids, grads),)).to_bytes())
    return payloads, plain


def make_state(rows: int) -> ShardState:
    state = ShardState(Adagrad(lr=0.05))
    for start in range(0, rows, 1 << 18):  # every row exists: steady state, not growth
        state._table(TABLE, DIM).rows_for(np.arange(start, min(start + (1 << 18), rows), dtype=np.uint64))
    return state


def fresh_pass(state: ShardState) -> None:
    """Each pass replays the same deltas: forget them so they are applied, not dropped."""
    state.dedup = Dedup()


def union(pending: list[Changes]) -> Changes:
    tables: dict[str, list[np.ndarray]] = {}
    for changes in pending:
        for table, ids in changes.rows.items():
            tables.setdefault(table, []).append(ids)
    return Changes(rows={t: np.unique(np.concatenate(parts)) for t, parts in tables.items()},
                   blocks=set().union(*(c.blocks for c in pending)))


# --------------------------------------------------------------------------------- passes


def decode_apply(state: ShardState, payloads: list[bytes]) -> float:
    fresh_pass(state)
    began = time.perf_counter()
    for raw in payloads:
        state.apply(GradientDelta.from_bytes(raw))
    return time.perf_counter() - began


def windowed(state: ShardState, payloads: list[bytes], publish, window: float):
    """Apply deltas for `window` seconds, publish the union of what changed, repeat.
    Returns (seconds, seconds inside publish, the unions published)."""
    fresh_pass(state)
    unions, in_publish = [], 0.0
    began = time.perf_counter()
    window_start, pending = began, []
    for i, raw in enumerate(payloads):
        changes = state.apply(GradientDelta.from_bytes(raw))
        if changes is not None:
            pending.append(changes)
        now = time.perf_counter()
        if pending and (now - window_start >= window or i == len(payloads) - 1):
            merged = union(pending)
            publish(state, merged)
            unions.append(merged)
            window_start, pending = time.perf_counter(), []
            in_publish += window_start - now
    return time.perf_counter() - began, in_publish, unions


def bare_adagrad(rows: int, plain) -> float:
    table = np.zeros((rows, DIM), dtype=np.float32)
    acc = np.zeros_like(table)
    began = time.perf_counter()
    for ids, grads in plain:
        idx = ids.astype(np.int64)
        p = np.take(row_view(table), idx).view(np.float32).reshape(len(idx), DIM)
        a = np.take(row_view(acc), idx).view(np.float32).reshape(len(idx), DIM)
        a += grads * grads
        p -= np.float32(0.05) * grads / (np.sqrt(a) + np.float32(1e-10))
        np.put(row_view(table), idx, row_view(p))
        np.put(row_view(acc), idx, row_view(a))
    return time.perf_counter() - began


# --------------------------------------------------------------------------- the shard path


def shard_path(state: ShardState, payloads: list[bytes], client: redis.Redis, window: float):
    """Apply here, publish from the shard's BackgroundPublisher. Returns (seconds until all
    applied, seconds until all published, rows published, publishes)."""
    fresh_pass(state)
    lock = threading.Lock()
    publishing = BackgroundPublisher(Publisher(client, JOB, 0), state, lock, window, 1.0)
    publishing.round()  # the start-up publish of everything, not timed
    rows_before, publishes_before = publishing.rows, publishing.publishes
    began = time.perf_counter()
    publishing.start()
    for raw in payloads:
        delta = GradientDelta.from_bytes(raw)
        with lock:
            publishing.add(state.apply(delta), delta.trainer_id, delta.step)
    applied = time.perf_counter() - began
    publishing.stop()
    return (applied, time.perf_counter() - began, publishing.rows - rows_before,
            publishing.publishes - publishes_before)


# ------------------------------------------------------------------------------------ run


def run(url: str, args: argparse.Namespace) -> dict[str, object]:
    client = redis.Redis.from_url(url)
    payloads, plain = make_workload(args.rows, args.batch, args.batches, args.skew)
    total = sum(len(ids) for ids, _ in plain)
    state = make_state(args.rows)
    publisher = Publisher(client, JOB, 0)
    began = time.perf_counter()
    publisher.publish_all(state)  # keys exist, as in a running job: publishes overwrite
    publish_all_s = time.perf_counter() - began
    window = args.window_ms / 1000

    t_apply = decode_apply(state, payloads)
    t_sync, t_in_publish, unions = windowed(state, payloads, publisher.publish, window)
    t_applied, t_published, bg_rows, bg_publishes = shard_path(state, payloads, client, window)
    t_bare = bare_adagrad(args.rows, plain)
    published = sum(len(ids) for u in unions for ids in u.rows.values())

    rate = lambda seconds: round(total / seconds)  # noqa: E731
    bare = rate(t_bare)
    return {
        "rows_in_table": args.rows, "dim": DIM, "deltas": len(payloads), "rows_applied": total,
        "ids": f"zipf({args.skew})" if args.skew > 1 else "uniform",
        "window_ms": args.window_ms, "target_rows_per_s": TARGET,
        "decode_apply_rows_per_s": rate(t_apply),
        "bare_numpy_adagrad_rows_per_s": bare,
        "ratio_decode_apply_vs_bare": round(total / t_apply / bare, 2),
        "decode_apply_publish_sync_rows_per_s": rate(t_sync),
        "sync_share_of_time_in_publish": round(t_in_publish / t_sync, 3),
        "sync_publish_rows_per_s": round(published / t_in_publish),
        "shard_applied_rows_per_s": rate(t_applied),
        "shard_until_published_rows_per_s": rate(t_published),
        "shard_published_per_applied": round(bg_rows / total, 3),
        "shard_publishes": bg_publishes,
        "meets_target": total / t_applied >= TARGET,
        "publish_all_rows_per_s": round(args.rows / publish_all_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="distinct rows in the table")
    parser.add_argument("--batch", type=int, default=65_536, help="ids drawn per delta (deduplicated)")
    parser.add_argument("--batches", type=int, default=40, help="deltas per pass")
    parser.add_argument("--window-ms", type=float, default=100.0,
                        help="apply for this long, then publish the union of changed ids once")
    parser.add_argument("--skew", type=float, default=0.0, help="Zipf exponent (> 1) for ids; 0 = uniform")
    args = parser.parse_args()
    with redis_url() as url:
        print(json.dumps(run(url, args), indent=2))


if __name__ == "__main__":
    main()

"""Rows a shard applies per second for dim-16 Adagrad through its whole path (decode, apply,
publish to Redis), beside a bare numpy Adagrad on the same rows in the same run.

    python -m bench.pserver_apply [--rows 2000000] [--batch 65536] [--batches 40]
                                  [--window-ms 100] [--skew 0] [--no-proposed]

Starts its own Redis (or uses STREAMTRAIN_REDIS; the bench writes keys under job
``bench-apply`` and leaves them). Prints one JSON report (docs/pserver-bench.md):

- ``decode_apply``: `GradientDelta.from_bytes` + `ShardState.apply`, nothing published.
- ``decode_apply_publish``: as a shard would run: apply every delta polled in one window
  (``--window-ms`` of applying), union the changed ids per table, one `Publisher.publish`.
- ``bare_numpy_adagrad``: deduplicated rows, gather / update / scatter with np.take and np.put
  on row views, no decode, no index, no publish.
- ``publish_breakdown``: the publishes of the run above re-timed stage by stage (index lookup,
  value gather, `RedisKeys.rows`, `encode_rows`, the MSET argument dicts, redis-py packing,
  socket + Redis), with Redis's own MSET time from INFO commandstats.
- ``proposed`` (unless ``--no-proposed``): the same loop with a bench-local prototype of a
  faster publisher (np.take gather, the whole MSET built as RESP bytes by numpy, sent on the
  raw connection), synchronously and from a background thread on its own cadence.

``--skew`` > 1 draws ids from a Zipf law of that exponent (hot rows, as real id streams);
the default 0 draws them uniformly, the worst case for coalescing.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import redis

from infra.endpoints import Ports
from infra.redis_server import RedisServer
from pserver.dedup import Dedup
from pserver.optimizers import Adagrad
from pserver.rows import row_view
from pserver.serving import _CHUNK, Publisher
from pserver.state import Changes, ShardState
from schemas import GradientDelta, RedisKeys, SparseRows, TaskRecord, encode_rows

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


# ---------------------------------------------------------------------- publish breakdown


class Stages:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        began = time.perf_counter()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began

    def report(self, rows: int) -> dict[str, object]:
        total = sum(self.seconds.values())
        return {"us_per_row": {k: round(v / rows * 1e6, 3) for k, v in self.seconds.items()},
                "share": {k: round(v / total, 3) for k, v in self.seconds.items()},
                "total_us_per_row": round(total / rows * 1e6, 3),
                "rows_per_s": round(rows / total)}


def mset_usec(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_mset", {}).get("usec", 0))


def publisher_breakdown(client: redis.Redis, state: ShardState, unions: list[Changes]) -> dict:
    """`Publisher.publish` for sparse rows, stage by stage, with the same calls it makes."""
    keys_of, stage, rows = RedisKeys(JOB), Stages(), 0
    conn = client.connection_pool.get_connection()
    redis_before = mset_usec(client)
    try:
        for changes in unions:
            commands = []
            for table, ids in changes.rows.items():
                rows += len(ids)
                t = state.tables[table]
                with stage("index_lookup"):
                    found = t.index.lookup(ids)
                with stage("gather_values"):
                    values = t.values[found]
                with stage("redis_keys_rows"):
                    keys = keys_of.rows(table, ids)
                with stage("encode_rows"):
                    payloads = encode_rows(values)
                with stage("mset_args"):  # Pipeline.mset: dict(zip), then redis-py flattens it
                    for i in range(0, len(keys), _CHUNK):
                        items = []
                        for pair in dict(zip(keys[i:i + _CHUNK], payloads[i:i + _CHUNK])).items():
                            items.extend(pair)
                        commands.append(("MSET", *items))
            commands.append(("INCR", keys_of.version(0)))
            with stage("redis_py_pack"):
                packed = conn.pack_commands(commands)
            with stage("socket_and_redis"):
                conn.send_packed_command(packed)
                for _ in commands:
                    conn.read_response()
    finally:
        client.connection_pool.release(conn)
    report = stage.report(rows)
    report["redis_server_mset_us_per_row"] = round((mset_usec(client) - redis_before) / rows, 3)
    return report


# ------------------------------------------------------- prototype: vectorised RESP publish

_POW10 = np.array([10**k for k in range(20)], dtype=np.uint64)


def _digits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ASCII decimal digits of uint64 `x`, right-aligned in (n, width), and which are real."""
    width = len(str(int(x.max()))) if len(x) else 1
    ndigits = np.ones(len(x), dtype=np.int64)
    for k in range(1, width):
        ndigits += x >= _POW10[k]
    out = np.empty((len(x), width), dtype=np.uint8)
    rest = x.copy()
    for c in range(width - 1, -1, -1):
        out[:, c] = rest % np.uint64(10)
        rest //= np.uint64(10)
    out += ord("0")
    return out, np.arange(width) >= (width - ndigits)[:, None]


def mset_resp(prefix: bytes, ids: np.ndarray, rows: np.ndarray) -> bytes:
    """One ``MSET <prefix><id> <row> ...`` as RESP bytes: each record is laid out in a fixed-width
    byte matrix, variable-length decimals right-aligned, and the unused columns dropped by
    one boolean mask (no Python work per row). Rows are (n, size) uint8, already encoded."""
    n, size = rows.shape
    id_digits, id_mask = _digits(ids.astype(np.uint64, copy=False))
    key_len, len_mask = _digits((id_mask.sum(1) + len(prefix)).astype(np.uint64))
    const = lambda b: (np.frombuffer(b, dtype=np.uint8), None)  # noqa: E731
    pieces = [const(b"$"), (key_len, len_mask), const(b"\r\n" + prefix), (id_digits, id_mask),
              const(b"\r\n$%d\r\n" % size), (rows, None), const(b"\r\n")]
    width = sum(p.shape[-1] for p, _ in pieces)
    matrix = np.empty((n, width), dtype=np.uint8)
    keep = np.ones((n, width), dtype=bool)
    col = 0
    for piece, mask in pieces:
        matrix[:, col:col + piece.shape[-1]] = piece
        if mask is not None:
            keep[:, col:col + piece.shape[-1]] = mask
        col += piece.shape[-1]
    return b"*%d\r\n$4\r\nMSET\r\n" % (2 * n + 1) + matrix[keep].tobytes()


def encode_rows_u8(values: np.ndarray) -> np.ndarray:
    """`encode_rows` as one (n, 4 + 4 dim) uint8 array instead of n bytes objects."""
    if not np.isfinite(values).all():
        raise ValueError("non-finite row")
    words = np.empty((len(values), 1 + values.shape[1]), dtype="<u4")
    words[:, 0] = np.frombuffer(encode_rows(values[:1])[0][:4], dtype="<u4")[0]
    words[:, 1:] = values.view("<u4")
    return words.view(np.uint8)


class VectorPublisher:
    """Prototype of a faster `Publisher.publish` for sparse rows (same keys, same bytes)."""

    def __init__(self, client: redis.Redis, shard: int = 0) -> None:
        self._redis = client
        self._keys = RedisKeys(JOB)
        self.shard = shard
        self.stage = Stages()

    def snapshot(self, state: ShardState, changes: Changes) -> list[tuple[str, np.ndarray, np.ndarray]]:
        out = []
        for table, ids in changes.rows.items():
            t = state.tables[table]
            with self.stage("index_lookup"):
                found = t.index.lookup(ids)
            with self.stage("gather_values"):
                values = np.take(row_view(t.values), found).view(np.float32).reshape(len(ids), t.dim)
            out.append((table, ids, values))
        return out

    def send(self, snapshot: list[tuple[str, np.ndarray, np.ndarray]]) -> int:
        buffers = []
        with self.stage("build_resp"):
            for table, ids, values in snapshot:
                prefix = self._keys._row_prefix(table).encode()
                encoded = encode_rows_u8(values)
                for i in range(0, len(ids), _CHUNK):
                    buffers.append(mset_resp(prefix, ids[i:i + _CHUNK], encoded[i:i + _CHUNK]))
        conn = self._redis.connection_pool.get_connection()
        try:
            with self.stage("socket_and_redis"):
                conn.send_packed_command(buffers + conn.pack_command("INCR", self._keys.version(self.shard)))
                for _ in buffers:
                    conn.read_response()
                return int(conn.read_response())
        finally:
            self._redis.connection_pool.release(conn)

    def publish(self, state: ShardState, changes: Changes) -> int:
        return self.send(self.snapshot(state, changes))


def background(state: ShardState, payloads: list[bytes], pub: VectorPublisher, cadence: float):
    """Apply on this thread; a publisher thread wakes every `cadence` s, takes the ids changed
    since its last round and copies their values under the lock, then encodes and sends
    outside it. Returns (seconds until every delta is applied, seconds until everything
    applied is also published, rows published, publishes)."""
    fresh_pass(state)
    lock, done = threading.Lock(), threading.Event()
    pending: list[Changes] = []
    counts = {"rows": 0, "publishes": 0}

    def one_round() -> None:
        with lock:
            taken = pending[:]
            pending.clear()
            if not taken:
                return
            merged = union(taken)
            snapshot = pub.snapshot(state, merged)
        pub.send(snapshot)
        counts["rows"] += sum(len(ids) for ids in merged.rows.values())
        counts["publishes"] += 1

    def loop() -> None:
        while not done.wait(cadence):
            one_round()

    thread = threading.Thread(target=loop, daemon=True)
    began = time.perf_counter()
    thread.start()
    for raw in payloads:
        delta = GradientDelta.from_bytes(raw)
        with lock:
            changes = state.apply(delta)
            if changes is not None:
                pending.append(changes)
    applied = time.perf_counter() - began
    done.set()
    thread.join()
    one_round()
    return applied, time.perf_counter() - began, counts["rows"], counts["publishes"]


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
    t_shard, t_in_publish, unions = windowed(state, payloads, publisher.publish, window)
    t_bare = bare_adagrad(args.rows, plain)
    published = sum(len(ids) for u in unions for ids in u.rows.values())

    rate = lambda seconds: round(total / seconds)  # noqa: E731
    bare = rate(t_bare)
    result: dict[str, object] = {
        "rows_in_table": args.rows, "dim": DIM, "deltas": len(payloads), "rows_applied": total,
        "ids": f"zipf({args.skew})" if args.skew > 1 else "uniform",
        "window_ms": args.window_ms, "target_rows_per_s": TARGET,
        "decode_apply_rows_per_s": rate(t_apply),
        "decode_apply_publish_rows_per_s": rate(t_shard),
        "bare_numpy_adagrad_rows_per_s": bare,
        "ratio_decode_apply_vs_bare": round(total / t_apply / bare, 2),
        "ratio_decode_apply_publish_vs_bare": round(total / t_shard / bare, 2),
        "meets_target": total / t_shard >= TARGET,
        "publishes": len(unions),
        "rows_published": published,
        "published_per_applied": round(published / total, 3),
        "share_of_time_in_publish": round(t_in_publish / t_shard, 3),
        "publish_rows_per_s": round(published / t_in_publish),
        "publish_all_rows_per_s": round(args.rows / publish_all_s),
        "publish_breakdown": publisher_breakdown(client, state, unions),
    }
    if args.proposed:
        fast = VectorPublisher(client)
        t_fast, t_fast_publish, fast_unions = windowed(state, payloads, fast.publish, window)
        fast_published = sum(len(ids) for u in fast_unions for ids in u.rows.values())
        check = Publisher(client, JOB, 0)._keys.rows(TABLE, unions[-1].rows[TABLE][:1000])
        t = state.tables[TABLE]
        expected = encode_rows(t.values[t.index.lookup(unions[-1].rows[TABLE][:1000])])
        assert client.mget(check) == expected, "prototype wrote different bytes than encode_rows"
        sync_stages = fast.stage.report(fast_published)
        fast.stage = Stages()
        t_bg_apply, t_bg, bg_rows, bg_publishes = background(state, payloads, fast, window)
        result["proposed"] = {
            "sync_decode_apply_publish_rows_per_s": rate(t_fast),
            "sync_publish_rows_per_s": round(fast_published / t_fast_publish),
            "sync_share_of_time_in_publish": round(t_fast_publish / t_fast, 3),
            "sync_publish_breakdown": sync_stages,
            "background_decode_apply_rows_per_s": rate(t_bg_apply),
            "background_until_published_rows_per_s": rate(t_bg),
            "background_drain_s": round(t_bg - t_bg_apply, 2),
            "background_publishes": bg_publishes,
            "background_published_per_applied": round(bg_rows / total, 3),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="distinct rows in the table")
    parser.add_argument("--batch", type=int, default=65_536, help="ids drawn per delta (deduplicated)")
    parser.add_argument("--batches", type=int, default=40, help="deltas per pass")
    parser.add_argument("--window-ms", type=float, default=100.0,
                        help="apply for this long, then publish the union of changed ids once")
    parser.add_argument("--skew", type=float, default=0.0, help="Zipf exponent (> 1) for ids; 0 = uniform")
    parser.add_argument("--no-proposed", dest="proposed", action="store_false",
                        help="skip the prototype publisher passes")
    args = parser.parse_args()
    if url := os.environ.get("STREAMTRAIN_REDIS"):
        print(json.dumps(run(url, args), indent=2))
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp), Ports.free().redis)
        server.start()
        try:
            print(json.dumps(run(server.address, args), indent=2))
        finally:
            server.stop()


if __name__ == "__main__":
    main()

"""CPU of one publishing round of a shard (`Publisher.send`), in the client and in Redis.

    python -m bench.publish_round [--rounds 3000] [--rows 450] [--flush-every 25]

Rounds shaped like the end-to-end job's (bench/e2e.py defaults: WideDeep, dim 8, 2 trainers):
`--rows` changed ids in two tables (dim 8 and the wide dim 1), 7 dense blocks, an `applied`
of two trainers, and every `--flush-every`-th round also writes the rows to their keys (a
flush). Starts its own Redis (or uses STREAMTRAIN_REDIS; keys under job `bench-publish`).
Prints one JSON report: per round, best of 3 passes, the client's CPU (`time.process_time`),
Redis's (`INFO cpu`, user + sys) and the wall time, in µs.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import redis

from bench.redis_for_bench import redis_url
from streamtrain.pserver.redis_rounds import Publisher, Snapshot

SHAPES = 50  # distinct rounds, cycled


def _redis_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def rounds(rows: int, flush_every: int, seed: int = 0) -> list[Snapshot]:
    rng = np.random.default_rng(seed)
    made = []
    for r in range(SHAPES):
        ids = np.unique(rng.integers(0, 4_194_304, rows)).astype(np.int64)
        changed = [("emb", ids, rng.random((len(ids), 8), dtype=np.float32)),
                   ("wide", ids, rng.random((len(ids), 1), dtype=np.float32))]
        blocks = [(f"p{b}", 0, rng.random(4096 if b == 0 else 400, dtype=np.float32), 1) for b in range(7)]
        flush = r % flush_every == 0
        made.append(Snapshot(changed, blocks, changed if flush else [], flush))
    return made


def run(address: str, args: argparse.Namespace) -> dict:
    client = redis.Redis.from_url(address)
    publisher = Publisher(client, "bench-publish", 0)
    shapes = rounds(args.rows, args.flush_every)
    for snapshot in shapes[:20]:
        publisher.send(snapshot, {"t0": 0, "t1": 0})
    passes = []
    for _ in range(3):
        redis0, cpu0, wall0 = _redis_cpu_s(client), time.process_time(), time.perf_counter()
        for i in range(args.rounds):
            publisher.send(shapes[i % SHAPES], {"t0": i, "t1": i})
        n = args.rounds
        passes.append({"client_us": (time.process_time() - cpu0) / n * 1e6,
                       "redis_us": (_redis_cpu_s(client) - redis0) / n * 1e6,
                       "wall_us": (time.perf_counter() - wall0) / n * 1e6})
    best = {k: round(min(p[k] for p in passes), 1) for k in passes[0]}
    return {"rounds": args.rounds, "rows_per_round": args.rows, "flush_every": args.flush_every,
            "per_round": best, "passes": [{k: round(v, 1) for k, v in p.items()} for p in passes]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3000, help="rounds per pass (3 passes)")
    parser.add_argument("--rows", type=int, default=450, help="ids drawn per round (deduplicated)")
    parser.add_argument("--flush-every", type=int, default=25, help="every Nth round is a flush")
    args = parser.parse_args()
    with redis_url() as url:
        print(json.dumps(run(url, args), indent=2))


if __name__ == "__main__":
    main()

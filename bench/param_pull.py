"""Pull latency and throughput of `ParamClient.pull_rows` for 4,096 rows of dim 16, beside a
bare redis-py MGET of the same keys and bytes in the same run.

    python -m bench.param_pull [--rows 4096] [--rounds 300]

Starts its own Redis (or uses STREAMTRAIN_REDIS) and prints one JSON report.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import redis

from bench.redis_for_bench import redis_url
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.params.optimizers import SGD
from streamtrain.params.paramstore import ParamClient
from streamtrain.pserver.redis_rounds import Publisher
from streamtrain.pserver.state import Changes, ShardState
from streamtrain.schemas import RedisKeys


def timed(fn, rounds: int) -> np.ndarray:
    out = np.empty(rounds)
    for i in range(rounds):
        began = time.perf_counter()
        fn()
        out[i] = time.perf_counter() - began
    return out


def report(name: str, times: np.ndarray, rows: int) -> dict[str, float]:
    return {f"{name}_rows_per_s": round(rows / times.mean()),
            f"{name}_p50_ms": round(float(np.percentile(times, 50)) * 1000, 3),
            f"{name}_p99_ms": round(float(np.percentile(times, 99)) * 1000, 3)}


def run(url: str, rows: int, rounds: int) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    job, dim = "bench-pull", 16
    slot_map = SlotMap.uniform(128, 1)
    state = ShardState(SGD(lr=0.1))
    ids = np.arange(200_000, dtype=np.uint64)
    state._table("user", dim).rows_for(ids)
    Publisher(client, job, 0).publish(state, Changes(rows={"user": ids}))
    rng = np.random.default_rng(0)
    batch = np.unique(rng.integers(0, len(ids), rows * 2).astype(np.uint64))[:rows]
    keys = RedisKeys(job).rows(0, "user", batch)
    params = ParamClient(client, job, slot_map)
    result = {"rows": len(batch), "dim": dim}
    result |= report("pull", timed(lambda: params.pull_rows("user", batch, dim), rounds), len(batch))
    result |= report("bare_mget", timed(lambda: client.mget(keys), rounds), len(batch))
    result["ratio"] = round(result["pull_rows_per_s"] / result["bare_mget_rows_per_s"], 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    with redis_url() as url:
        print(json.dumps(run(url, args.rows, args.rounds), indent=2))


if __name__ == "__main__":
    main()

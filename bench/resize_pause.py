"""The pause a resize causes: a job training bench.e2e's workload is resized once its shards
hold `--rows` rows, and the time in which no task finished is measured.

    python -m bench.resize_pause [--records 12000000] [--rows 1000000] [--to 3]
                                 [--model widedeep] [--out report.json]

The workload is `bench.e2e`'s (production-like CTR records as CSV on a 2-partition topic; Adam;
`[train]` and `[tasks]` at their defaults). A master, 2 shards and 2 trainers run as processes
under `LocalJob` on local services of their own. Once the shards hold `--rows` rows in all (from
their stats), `LocalJob.resize(--to)` runs while the trainers train (LocalJob starts the shards
that join). Reported: the resize's own time (pause, checkpoint, regroup, rollback), the rows
and slots it moved, and from the trainers' metrics, the longest time between two tasks
finishing around the resize, against the longest such time in the minute before it (what a
task takes anyway). Prints the JSON report (also to `--out`).

One module on purpose: a bench is read top to bottom as the record of what it measures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from bench.e2e import MODELS, job_toml, write_log
from streamtrain.infra import Endpoints, LocalServices, Ports
from streamtrain.infra.clients import redis_client
from streamtrain.local import LocalJob
from streamtrain.schemas import RedisKeys, SchemaError, ShardStats, TaskReport, Topics
from streamtrain.schemas.config import JobConfig

BEFORE_S = 60.0  # the window before the resize that gives a task's usual gap
AFTER_S = 20.0  # how long the job trains on after the resize


def shard_rows(redis_conn, job: str, shards: int) -> int:
    """Rows the shards hold in all, by their stats (0 for a shard that wrote none yet)."""
    total = 0
    for shard in range(shards):
        raw = redis_conn.get(RedisKeys(job).stats(shard))
        total += sum(ShardStats.from_json(raw).table_rows.values()) if raw else 0
    return total


def finish_times(endpoints: Endpoints, job: str) -> list[float]:
    """When each task the trainers reported finished, sorted (a redone task counts once)."""
    consumer = Consumer({"bootstrap.servers": endpoints.kafka, "group.id": f"{job}.resize-bench",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(Topics(job).metrics, 0, OFFSET_BEGINNING)])
    finished: dict[str, float] = {}
    try:
        while True:
            msg = consumer.poll(5.0)
            if msg is None or (msg.error() and msg.error().code() == KafkaError._PARTITION_EOF):
                break
            if msg.error():
                continue
            try:
                report = TaskReport.from_json(msg.value())
            except SchemaError:
                continue
            finished.setdefault(report.task_id, report.finished_at)
    finally:
        consumer.close()
    return sorted(finished.values())


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest time between consecutive `times` that overlaps [start, end]."""
    gaps = [b - a for a, b in zip(times, times[1:]) if b >= start and a <= end]
    return max(gaps, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=12_000_000)
    parser.add_argument("--rows", type=int, default=1_000_000, help="resize once the shards hold this many rows")
    parser.add_argument("--to", type=int, default=3, help="the shard count to resize to (from 2)")
    parser.add_argument("--model", choices=sorted(MODELS), default="widedeep")
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        local = LocalServices(home / "services", Ports.free())
        local.up()
        try:
            topic = f"resize-{time.time_ns() % 10**9}"
            work = write_log(local.endpoints, topic, args.records, 1)  # 1M rows take some 12M records
            name = f"resize-bench-{time.time_ns() % 10**9}"
            job_file = home / "job.toml"
            job_file.write_text(job_toml(name, topic, "csv", work, MODELS[args.model], home / "ckpt", {}))
            config = JobConfig.load(job_file)
            redis_conn = redis_client(local.endpoints)
            with LocalJob(config, trainers=2, endpoints=local.endpoints, log_dir=home / "logs",
                          job_file=job_file) as job:
                deadline = time.monotonic() + args.timeout_s
                while (rows := shard_rows(redis_conn, name, 2)) < args.rows:
                    if time.monotonic() > deadline or job.state() == "finished":
                        raise SystemExit(f"the shards hold {rows:,} rows: fewer than --rows {args.rows:,} "
                                         f"by the end (more --records?)")
                    time.sleep(0.5)
                by_shard = {s: json.loads(redis_conn.get(RedisKeys(name).stats(s))).get("table_rows") for s in range(2)}
                began = time.time()
                done = job.resize(args.to)
                ended = time.time()
                print(f"resized: {done}", file=sys.stderr)
                time.sleep(AFTER_S)
                after = {s: json.loads(redis_conn.get(RedisKeys(name).stats(s)) or b"{}").get("table_rows")
                         for s in range(args.to)}
            redis_conn.close()
            times = finish_times(local.endpoints, name)
        finally:
            local.down()
    report = {
        "records": args.records, "model": args.model, "shards": [2, args.to],
        "rows_before": {str(s): sum(r.values()) for s, r in by_shard.items()},
        "rows_after": {str(s): sum((r or {}).values()) for s, r in after.items()},
        "moved_slots": done.moved_slots, "resize_s": round(done.took_s, 2),
        "no_task_finished_s": round(longest_gap(times, began, ended), 2),
        "usual_longest_gap_s": round(longest_gap(times, began - BEFORE_S, began - 1.0), 2),
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

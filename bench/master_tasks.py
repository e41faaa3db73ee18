"""Task queue throughput against a real etcd, beside etcd's own plain txn/s in the same run.

    python -m bench.master_tasks [--tasks 5000] [--trainers 1,4]

Starts its own Kafka and etcd (or uses STREAMTRAIN_KAFKA / STREAMTRAIN_ETCD) and prints one
JSON report:
  etcd_txn_per_s            single-client put-if-absent transactions (the yardstick)
  etcd_txn_per_s_4_clients  the same from 4 threads (etcd batches concurrent proposals)
  slice_tasks_per_s         tasks the master cuts and stores (batched, fenced transactions)
  cycles_per_s[n]           claim + complete cycles with n trainer processes
  txn_per_cycle_equiv       etcd_txn_per_s / cycles_per_s[1]: what one cycle costs in txns
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer

from streamtrain.infra import Endpoints, LocalServices, Ports
from streamtrain.infra.clients import TopicSpec, ensure_topics
from streamtrain.jobstate.etcd import Etcd, absent, put_op
from streamtrain.jobstate.offsets import InputOffsets
from streamtrain.jobstate.tasks import TaskClient
from streamtrain.master.service import Master
from streamtrain.schemas import EtcdKeys
from streamtrain.schemas.config import JobConfig


def plain_txn_rate(endpoints: Endpoints, n: int, threads: int) -> float:
    prefix = f"/bench/{uuid.uuid4().hex}/"
    clients = [Etcd.connect(endpoints) for _ in range(threads)]

    def work(i: int) -> None:
        c = clients[i]
        for j in range(n // threads):
            key = f"{prefix}{i}/{j}"
            c.txn([absent(key)], [put_op(key, b"x" * 200)])

    began = time.perf_counter()
    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    rate = (n // threads * threads) / (time.perf_counter() - began)
    clients[0].delete_prefix(prefix)
    for c in clients:
        c.close()
    return rate


def make_job(endpoints: Endpoints, records: int) -> JobConfig:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    topic = f"{name}.in"
    ensure_topics(endpoints, [TopicSpec(topic, 1)])
    producer = Producer({"bootstrap.servers": endpoints.kafka, "linger.ms": 20})
    for i in range(records):
        producer.produce(topic, value=b"r", partition=0)
        if i % 10000 == 0:
            producer.poll(0)
    producer.flush(60)
    return JobConfig.from_toml(f"""
[job]
name = "{name}"
[input]
topics = ["{topic}"]
[tasks]
max_records = 1
linger_ms = 0
max_todo = {records}
[master]
lock_ttl_s = 5
""")


def slice_rate(endpoints: Endpoints, config: JobConfig, tasks: int) -> float:
    etcd = Etcd.connect(endpoints)
    master = Master(etcd, InputOffsets(endpoints), config, identity="bench")
    assert master.lock.acquire(threading.Event())
    master._publish_config()
    began = time.perf_counter()
    while etcd.count(EtcdKeys(config.name).tasks("todo")) < tasks:
        master.step()
    rate = tasks / (time.perf_counter() - began + 1e-9)
    master.lock.release()
    etcd.close()
    return rate


def _trainer_process(endpoints: Endpoints, job: str, index: int, quota: int, go, out) -> None:
    etcd = Etcd.connect(endpoints)
    client = TaskClient(etcd, job, f"t{index}", 30, 3)
    go.wait()
    done = 0
    task = client.claim()
    while task is not None:
        done += 1
        task = client.complete(task, claim_next=done < quota)
    out.put(done)
    etcd.close()


def cycle_rate(endpoints: Endpoints, config: JobConfig, trainers: int, cycles: int) -> float:
    """Claim + complete cycles per second, each trainer a process of its own (as in a job)."""
    ctx = multiprocessing.get_context("spawn")  # gRPC channels do not survive fork
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_trainer_process,
                         args=(endpoints, config.name, i, cycles // trainers, go, out))
             for i in range(trainers)]
    for p in procs:
        p.start()
    time.sleep(3)  # let every process import and connect before the clock starts
    began = time.perf_counter()
    go.set()
    total = sum(out.get() for _ in procs)
    rate = total / (time.perf_counter() - began)
    for p in procs:
        p.join()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--trainers", default="1,4")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        local = LocalServices(Path(tmp), Ports.free())
        local.up()
        try:
            endpoints = local.endpoints
            report: dict[str, object] = {"tasks": args.tasks}
            report["etcd_txn_per_s"] = round(plain_txn_rate(endpoints, 3000, 1))
            report["etcd_txn_per_s_4_clients"] = round(plain_txn_rate(endpoints, 6000, 4))
            cycles: dict[str, float] = {}
            for n in (int(x) for x in args.trainers.split(",")):
                config = make_job(endpoints, args.tasks)
                if "slice_tasks_per_s" not in report:
                    report["slice_tasks_per_s"] = round(slice_rate(endpoints, config, args.tasks))
                else:
                    slice_rate(endpoints, config, args.tasks)
                cycles[str(n)] = round(cycle_rate(endpoints, config, n, args.tasks))
            report["cycles_per_s"] = cycles
            first = next(iter(cycles.values()))
            report["txn_per_cycle_equiv"] = round(report["etcd_txn_per_s"] / first, 2)
            print(json.dumps(report, indent=2))
        finally:
            local.down()


if __name__ == "__main__":
    main()

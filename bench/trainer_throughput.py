"""Trainer examples/s through the whole system (exact reads from Kafka, decode, row pulls
from Redis, forward/backward, deltas committed to the gradient topics in Kafka transactions),
beside a bare PyTorch loop over the same examples and model in the same run (in memory, and
decoding the same JSON records first).

    python -m bench.trainer_throughput [--examples 60000] [--model trainer.models:LogisticRegression]
                                       [--batch-size 256] [--commit-every 0]

Starts its own Kafka, etcd and Redis (or uses STREAMTRAIN_KAFKA/ETCD/REDIS), a master and two
pserver shards in threads, then times one trainer over a bounded single pass. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from infra import Endpoints, LocalServices, Ports
from infra.clients import TopicSpec, ensure_topics
from master.config import JobConfig
from master.etcd import Etcd
from master.service import Master
from producers.clickmodel import ClickModel
from pserver.shard import PserverShard, ShardOptions
from schemas import EtcdKeys, Example
from trainer.local import LocalTrainer
from trainer.worker import Trainer


def job(name: str, topic: str, ckpt: Path, args: argparse.Namespace, model: ClickModel) -> JobConfig:
    fields = ", ".join(f'"{f}"' for f in model.fields)
    return JobConfig.from_toml(f"""
[job]
name = "{name}"
[input]
topics = ["{topic}"]
passes = 1
[tasks]
max_records = 2000
[model]
factory = "{args.model}"
sparse_fields = [{fields}]
dense_features = {model.dense_features}
batch_size = {args.batch_size}
[train]
commit_every = {args.commit_every}
learning_rate = 0.1
[pservers]
count = 2
checkpoint_uri = "{ckpt.as_uri()}"
[master]
poll_ms = 50
""")


def run(endpoints: Endpoints, args: argparse.Namespace, home: Path) -> dict:
    model = ClickModel()
    examples = model.examples(args.examples)
    name = f"bench-trainer-{time.time_ns()}"
    topic = f"{name}.input"
    ensure_topics(endpoints, [TopicSpec(topic, 2)])
    producer = Producer({"bootstrap.servers": endpoints.kafka, "linger.ms": 20})
    for i, e in enumerate(examples):
        producer.produce(topic, e.to_json(), partition=i % 2)
    producer.flush(60)
    config = job(name, topic, home / "ckpt", args, model)

    stop = threading.Event()
    threads = [threading.Thread(target=Master(Etcd.connect(endpoints), endpoints, config).run, args=(stop,), daemon=True)]
    threads += [threading.Thread(target=PserverShard(endpoints, ShardOptions(name, i)).run, args=(stop,), daemon=True)
                for i in range(2)]
    for t in threads:
        t.start()
    etcd = Etcd.connect(endpoints)
    while etcd.count(EtcdKeys(name).tasks("todo")) == 0:  # the master has sliced
        time.sleep(0.1)
    trainer = Trainer(endpoints, name, "bench")
    trainer_stop = threading.Event()
    began = time.perf_counter()
    worker = threading.Thread(target=trainer.run, args=(trainer_stop,), daemon=True)
    worker.start()
    while trainer.stats.examples < len(examples):
        time.sleep(0.05)
    system_s = time.perf_counter() - began
    trainer_stop.set()
    worker.join(30)
    stop.set()
    for t in threads:
        t.join(30)
    etcd.close()

    local = LocalTrainer(config)
    began = time.perf_counter()
    local.train(examples)
    bare_s = time.perf_counter() - began
    values = [e.to_json() for e in examples]
    local = LocalTrainer(config)
    began = time.perf_counter()
    local.train([Example.from_json(v) for v in values])
    bare_decode_s = time.perf_counter() - began
    return {
        "examples": len(examples), "model": args.model, "batch_size": args.batch_size,
        "commit_every": args.commit_every,
        "trainer_examples_per_s": round(len(examples) / system_s),
        "bare_torch_examples_per_s": round(len(examples) / bare_s),
        "ratio": round(bare_s / system_s, 3),
        "bare_torch_with_json_decode_examples_per_s": round(len(examples) / bare_decode_s),
        "ratio_vs_bare_with_decode": round(bare_decode_s / system_s, 3),
        "note": "trainer time includes its start-up (model build, producer init) and etcd claims",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=60_000)
    parser.add_argument("--model", default="trainer.models:LogisticRegression")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--commit-every", type=int, default=0)
    args = parser.parse_args()
    endpoints = Endpoints.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        local = None
        if not endpoints.external:
            local = LocalServices(home / "services", Ports.free())
            local.up()
            endpoints = local.endpoints
        try:
            print(json.dumps(run(endpoints, args, home), indent=2))
        finally:
            if local is not None:
                local.down()


if __name__ == "__main__":
    main()

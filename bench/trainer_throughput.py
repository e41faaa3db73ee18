"""Trainer examples/s through the whole system (exact reads from Kafka, decode, row pulls
from Redis, forward/backward, deltas committed to the gradient topics in Kafka transactions),
beside a bare PyTorch loop over the same data and model in the same run.

    python -m bench.trainer_throughput [--examples 60000] [--model trainer.models:LogisticRegression]
                                       [--batch-size 256] [--commit-every 0]

Starts its own Kafka, etcd and Redis (or uses STREAMTRAIN_KAFKA/ETCD/REDIS), a master and two
pserver shards as their own processes (as deployed: a shard's threads do not share the
trainer's interpreter lock), then times one trainer over a bounded single pass. Two bare loops
run the same model with the same featurizer and optimizer in one process: over the records'
bytes, decoded by the trainer's own decoder (the like-for-like baseline: same data, same input
pipeline, no Kafka, Redis or etcd), and over examples already in memory. The trainer's rate is
its steady state, from its first trained example to its last; its start-up (model build,
transactional producer init) is reported beside it. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from infra import Endpoints, LocalServices, Ports
from infra.clients import TopicSpec, ensure_topics
from master.config import JobConfig
from master.etcd import Etcd
from producers.clickmodel import ClickModel
from schemas import EtcdKeys
from trainer.local import LocalTrainer
from trainer.worker import Trainer


def job(name: str, topic: str, ckpt: Path, args: argparse.Namespace, model: ClickModel) -> JobConfig:
    return JobConfig.from_toml(config_toml(name, topic, ckpt, args, model))


def config_toml(name: str, topic: str, ckpt: Path, args: argparse.Namespace, model: ClickModel) -> str:
    fields = ", ".join(f'"{f}"' for f in model.fields)
    return f"""
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
"""


def run(endpoints: Endpoints, args: argparse.Namespace, home: Path) -> dict:
    model = ClickModel()
    examples = model.examples(args.examples)
    values = [e.to_json() for e in examples]
    name = f"bench-trainer-{time.time_ns()}"
    topic = f"{name}.input"
    ensure_topics(endpoints, [TopicSpec(topic, 2)])
    producer = Producer({"bootstrap.servers": endpoints.kafka, "linger.ms": 20})
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % 2)
    producer.flush(60)
    config = job(name, topic, home / "ckpt", args, model)
    job_file = home / "job.toml"
    job_file.write_text(config_toml(name, topic, home / "ckpt", args, model))

    env = dict(os.environ, STREAMTRAIN_KAFKA=endpoints.kafka, STREAMTRAIN_ETCD=endpoints.etcd,
               STREAMTRAIN_REDIS=endpoints.redis)
    log = open(home / "services.log", "ab")
    procs = [subprocess.Popen([sys.executable, "-m", "streamtrain", "master", "--job", str(job_file)],
                              env=env, stdout=log, stderr=subprocess.STDOUT)]
    procs += [subprocess.Popen([sys.executable, "-m", "streamtrain", "pserver", "--job", name, "--index", str(i)],
                               env=env, stdout=log, stderr=subprocess.STDOUT) for i in range(2)]
    try:
        etcd = Etcd.connect(endpoints)
        deadline = time.monotonic() + 120
        while etcd.count(EtcdKeys(name).tasks("todo")) == 0 or etcd.count(EtcdKeys(name).ps_prefix) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"master or shards did not come up; see {home / 'services.log'}")
            time.sleep(0.1)
        etcd.close()
        trainer = Trainer(endpoints, name, "bench")
        stop = threading.Event()
        began = time.perf_counter()
        worker = threading.Thread(target=trainer.run, args=(stop,), daemon=True)
        worker.start()
        while trainer.stats.examples == 0:
            time.sleep(0.002)
        first = time.perf_counter()
        while trainer.stats.examples < len(examples):
            time.sleep(0.002)
        system_s = time.perf_counter() - first
        startup_s = first - began
        stop.set()
        worker.join(30)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        log.close()

    local = LocalTrainer(config)
    began = time.perf_counter()
    local.train(examples)
    bare_s = time.perf_counter() - began
    local = LocalTrainer(config)
    began = time.perf_counter()
    local.train_records(values)
    bare_records_s = time.perf_counter() - began
    # The first mini-batch is timed in neither: the trainer's clock starts once it has trained.
    steady = len(examples) - args.batch_size
    return {
        "examples": len(examples), "model": args.model, "batch_size": args.batch_size,
        "commit_every": args.commit_every,
        "trainer_examples_per_s": round(steady / system_s),
        "trainer_startup_s": round(startup_s, 2),
        "bare_torch_from_records_examples_per_s": round(len(examples) / bare_records_s),
        "ratio": round(steady / system_s / (len(examples) / bare_records_s), 3),
        "bare_torch_in_memory_examples_per_s": round(len(examples) / bare_s),
        "ratio_vs_in_memory": round(steady / system_s / (len(examples) / bare_s), 3),
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

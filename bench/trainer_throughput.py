"""Trainer examples/s through the whole system (exact reads from Kafka, decode, row pulls
from Redis, forward/backward, deltas produced to the gradient topics and acknowledged),
beside a bare PyTorch loop over the same data and model in the same run.

    python -m bench.trainer_throughput [--examples 600000] [--warmup 120000] [--batch-size 256]
                                       [--model streamtrain.trainer.models:LogisticRegression]
                                       [--task-records N] [--bare-runs 3]

Starts its own Kafka, etcd and Redis (or uses STREAMTRAIN_KAFKA/ETCD/REDIS), a master and two
pserver shards as their own processes (as deployed: a shard's threads do not share the
trainer's interpreter lock), then times one trainer over a bounded single pass. Two bare loops
run the same model with the same featurizer and optimizer in one process: over the records'
bytes, decoded by the trainer's own decoder (the like-for-like baseline: same data, same input
pipeline, no Kafka, Redis or etcd; run `--bare-runs` times before and after the trainer, the
ratio taken against the median), and over examples already in memory. The trainer's rate is
its steady state: the first `--warmup` examples are not timed, because a freshly started
broker runs its transaction paths interpreted until its JIT compiles them (about 30 ms of
broker CPU per commit at first, 8 ms after a few hundred), and here the broker shares the
trainer's cores. The trainer's start-up (model build, transactional producer init) and the
cores each process kept busy are reported beside it. Prints JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from streamtrain.infra import Endpoints, LocalServices, Ports
from streamtrain.infra.clients import TopicSpec, ensure_topics
from streamtrain.jobstate.etcd import Etcd
from streamtrain.producers.clickmodel import ClickModel
from streamtrain.schemas import EtcdKeys, Example
from streamtrain.schemas.config import JobConfig, TasksSection
from streamtrain.trainer.local import LocalTrainer
from streamtrain.trainer.worker import Trainer


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
max_records = {args.task_records or TasksSection.max_records}
[model]
factory = "{args.model}"
sparse_fields = [{fields}]
dense_features = {model.dense_features}
batch_size = {args.batch_size}
[train]
learning_rate = 0.1
[pservers]
count = 2
checkpoint_uri = "{ckpt.as_uri()}"
[master]
poll_ms = 50
"""


def write_topic(endpoints: Endpoints, topic: str, values: list[bytes]) -> None:
    """`values` on a new 2-partition topic, alternately; idempotent, so each partition holds
    its values in the order given."""
    ensure_topics(endpoints, [TopicSpec(topic, 2)])
    producer = Producer({"bootstrap.servers": endpoints.kafka, "linger.ms": 20, "enable.idempotence": True,
                         "compression.type": "lz4"})
    for i, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value, partition=i % 2)
                break
            except BufferError:
                producer.poll(0.05)  # local queue full: let it drain
    producer.flush(120)


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU each process has used so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return used


def bare_from_records(config: JobConfig, values: list[bytes], warmup: int) -> tuple[float, float]:
    """Seconds and CPU seconds a bare loop takes over `values[warmup:]`, after training on the
    first `warmup`, with the long-lived objects frozen as the trainer has them."""
    gc.freeze()
    try:
        local = LocalTrainer(config)
        local.train_records(values[:warmup])
        began, cpu = time.perf_counter(), time.process_time()
        local.train_records(values[warmup:])
        return time.perf_counter() - began, time.process_time() - cpu
    finally:
        gc.unfreeze()


def run(endpoints: Endpoints, args: argparse.Namespace, home: Path, service_pids: dict[str, int]) -> dict:
    model = ClickModel()
    # Only the records' bytes stay alive while the trainer runs: bytes are not tracked by the
    # cyclic collector, while 180k Example objects would make every collection in this process
    # (the trainer's too) walk them. The in-memory loop decodes its examples afterwards.
    values = [e.to_json() for e in model.examples(args.warmup + args.examples)]
    name = f"bench-trainer-{time.time_ns()}"
    topic = f"{name}.input"
    config = job(name, topic, home / "ckpt", args, model)
    # The bare loop runs several times before the trainer and after it: on this box five runs
    # in a row of the same loop in one process ranged 62k-120k ex/s, so the ratio is taken
    # against the median.
    bare = [bare_from_records(config, values, args.warmup) for _ in range(args.bare_runs)]
    write_topic(endpoints, topic, values)
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

        def trained(examples: int) -> None:
            while trainer.stats.examples < examples:
                if not worker.is_alive():
                    raise RuntimeError("the trainer stopped (its traceback is above)")
                time.sleep(0.01)

        trained(1)
        startup_s = time.perf_counter() - began
        trained(args.warmup)
        timed = trainer.stats.examples  # the clock starts on a mini-batch boundary
        pids = {"trainer": os.getpid(), "trainer's loader": trainer.parts.loader.pid, "master": procs[0].pid,
                "shard 0": procs[1].pid, "shard 1": procs[2].pid, **service_pids}
        first, cpu_before = time.perf_counter(), cpu_seconds(pids)
        trained(len(values))
        system_s = time.perf_counter() - first
        cpu = {name: used - cpu_before[name] for name, used in cpu_seconds(pids).items() if name in cpu_before}
        stop.set()
        worker.join(30)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        log.close()

    # The bare loops train the examples the trainer was timed on, after the warm-up ones.
    bare += [bare_from_records(config, values, args.warmup) for _ in range(args.bare_runs)]
    bare_rates = [args.examples / wall for wall, _ in bare]
    examples = [Example.from_json(v) for v in values]
    gc.freeze()
    local = LocalTrainer(config)
    local.train(examples[:args.warmup])
    began = time.perf_counter()
    local.train(examples[args.warmup:])
    bare_s = time.perf_counter() - began
    steady = len(values) - timed
    examples = examples[args.warmup:]
    bare_records = statistics.median(bare_rates)
    # CPU per example: what the machine's cores, if the trainer had them to itself, would see.
    trainer_cpu_us = (cpu["trainer"] + cpu.get("trainer's loader", 0.0)) / steady * 1e6
    bare_cpu_us = statistics.median(used for _, used in bare) / args.examples * 1e6
    return {
        "examples": len(examples), "warmup_examples": args.warmup, "model": args.model,
        "batch_size": args.batch_size,
        "task_records": args.task_records or TasksSection.max_records,
        "trainer_examples_per_s": round(steady / system_s),
        "trainer_startup_s": round(startup_s, 2),
        # Cores each process kept busy meanwhile (the machine's cores are shared by all).
        "cores_busy": {name: round(used / system_s, 2) for name, used in cpu.items()},
        "bare_torch_from_records_examples_per_s": round(bare_records),
        "bare_from_records_runs": [round(r) for r in bare_rates],
        "ratio": round(steady / system_s / bare_records, 3),
        # The trainer's process and its loader against the bare loop, in CPU per example.
        "trainer_cpu_us_per_example": round(trainer_cpu_us, 2),
        "bare_cpu_us_per_example": round(bare_cpu_us, 2),
        "cpu_ratio": round(bare_cpu_us / trainer_cpu_us, 3),
        "bare_torch_in_memory_examples_per_s": round(len(examples) / bare_s),
        "ratio_vs_in_memory": round(steady / system_s / (len(examples) / bare_s), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Long enough for dozens of tasks at the default size: over 120,000 examples (15 tasks of
    # 8192) two runs of the same build differed by a factor of two.
    parser.add_argument("--examples", type=int, default=600_000, help="examples timed")
    parser.add_argument("--warmup", type=int, default=120_000,
                        help="examples trained first, untimed: the broker's JVM compiles its hot paths")
    parser.add_argument("--model", default="streamtrain.trainer.models:LogisticRegression")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--bare-runs", type=int, default=3, choices=range(1, 11), metavar="1..10",
                        help="bare loops before and after the trainer")
    parser.add_argument("--task-records", type=int, help="the job's tasks.max_records (default: the job default)")
    args = parser.parse_args()
    endpoints = Endpoints.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        local = None
        service_pids: dict[str, int] = {}
        if not endpoints.external:
            local = LocalServices(home / "services", Ports.free())
            local.up()
            endpoints = local.endpoints
            service_pids = {name: server.pid() for name, server in local.servers.items() if server.pid()}
        try:
            print(json.dumps(run(endpoints, args, home, service_pids), indent=2))
        finally:
            if local is not None:
                local.down()


if __name__ == "__main__":
    main()

"""The Python API (streamtrain.local): a job defined and run from a script or notebook."""

from __future__ import annotations

from conftest import wait_for
from streamtrain import JobConfig, LocalJob
from streamtrain.runtime.supervisor import pid_alive
from test_trainer import MODEL, applied_exactly, make_job, write_examples


def test_a_local_job_trains_its_pass_checkpoints_and_leaves_no_process(services, redis_conn, topic_factory,
                                                                       unique, tmp_path) -> None:
    topic = topic_factory("localjob", partitions=2)
    written = write_examples(services, topic, [e.to_json() for e in MODEL.examples(3_000)], 2)
    config = JobConfig.from_json(make_job(unique("localjob"), topic, tmp_path, max_records=500).to_json())

    with LocalJob(config, trainers=2, endpoints=services, log_dir=tmp_path / "logs") as job:
        assert job.wait_finished(timeout_s=120), job.events()
        wait_for(lambda: applied_exactly(redis_conn, config.name, written, topic), 30, "every example applied once")
        wait_for(lambda: job.status().examples == sum(written.values()), 30, "every task's metrics read")
        status = job.status()
        assert status.trainers == 2 and status.pservers == 2, status
        checkpoint = job.checkpoint(wait_s=30)
        assert checkpoint.shards == 2
        pids = job.supervisor.all_pids()
        assert len(pids) == 5 and all(pid_alive(p) for p in pids)  # master, 2 shards, 2 trainers

    result = job.result
    assert result is not None and result.state == "finished" and not result.stray, result
    assert result.tasks.get("todo") == 0 and result.tasks.get("pending") == 0, result.tasks
    assert not any(pid_alive(p) for p in result.pids)
    # The master read the config as this process defined it (written as JSON, no TOML file).
    assert (tmp_path / "logs" / f"{config.name}.job.json").exists()

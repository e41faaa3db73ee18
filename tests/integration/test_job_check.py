"""`streamtrain job check` as a user runs it: a real topic, the newest records, a report."""

from __future__ import annotations

import json

import pytest

from conftest import job_config, write_job_file
from test_cli_jobs import streamtrain
from test_trainer import write_examples

pytestmark = [pytest.mark.services]


def test_job_check_reports_how_the_newest_records_of_a_csv_topic_decode(services, topic_factory, unique,
                                                                         tmp_path) -> None:
    topic = topic_factory("check", partitions=2)
    lines = [f"row-{i},{i % 4 == 0:d},{i % 7},ios,{i / 10}".encode() for i in range(200)]
    lines[-1] = b"row-199,maybe,1,ios,0.5"  # the newest record is bad: no label
    write_examples(services, topic, lines, 2)
    config = job_config(unique("check"), topic, input={
        "format": "csv", "csv_columns": ["id:ignore", "clicked:label", "user:sparse", "os:sparse", "x:dense"]},
        model={"sparse_fields": ["user"]})
    path = write_job_file(tmp_path / "job.toml", config)

    done = streamtrain(services, "job", "check", "--job", str(path), "--sample", "40", "--json")
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert (report["records"], report["good"]) == (40, 39)
    [(where, reason)] = report["bad"]
    assert where == f"{topic}:1@99" and "clicked" in reason
    user, os_ = report["fields"]
    assert user["name"] == "user" and user["used"] and user["distinct_ids"] == 7
    assert os_["name"] == "os" and not os_["used"]
    assert 0.2 < report["label_rate"] < 0.3

    table = streamtrain(services, "job", "check", "--job", str(path), "--sample", "40")
    assert table.returncode == 0 and b"bad " + f"{topic}:1@99".encode() in table.stdout, table.stdout.decode()

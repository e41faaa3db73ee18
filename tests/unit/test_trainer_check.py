"""`streamtrain job check`'s decisions, without services: which records to sample, and what a
sample decodes to."""

from __future__ import annotations

import json
import math

from streamtrain.jobstate.offsets import Bounds
from streamtrain.schemas import Example
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.check import check_records, sample_ranges


def test_the_newest_records_are_shared_out_and_a_short_partition_gives_up_its_share() -> None:
    bounds = {("t", 0): Bounds(0, 100), ("t", 1): Bounds(40, 43), ("t", 2): Bounds(7, 7)}
    assert sample_ranges(bounds, 10) == {("t", 0): (93, 100), ("t", 1): (40, 43)}
    assert sample_ranges(bounds, 1000) == {("t", 0): (0, 100), ("t", 1): (40, 43)}
    assert sample_ranges(bounds, 1) == {("t", 0): (99, 100)}
    assert sample_ranges({}, 10) == {}


def job(input_section: str, model: str = "") -> JobConfig:
    return JobConfig.from_toml(f'[job]\nname = "j"\n[input]\ntopics = ["t"]\n{input_section}\n[model]\n{model}')


def test_a_json_sample_reports_fields_labels_and_bad_records_where_they_are() -> None:
    config = job("", 'sparse_fields = ["user", "ad"]\ndense_features = 1')
    good = [Example({"user": (i,), "ad": (1, 2), "extra": (5,)}, (float(i),), float(i % 2), 1000 + i)
            for i in range(4)]
    sample = [(f"t:0@{i}", e.to_json()) for i, e in enumerate(good)]
    sample.append(("t:0@4", b'{"v": 1, "sparse": {}'))
    sample.append(("t:0@5", Example({"user": (1,)}, (1.0, 2.0), 1.0, 0).to_json()))
    report = check_records(config, sample)
    assert (report.records, report.good) == (6, 4)
    assert [where for where, _ in report.bad] == ["t:0@4", "t:0@5"] and "dense" in report.bad[1][1]
    user, ad, extra = report.fields
    assert (user.name, user.used, user.present, user.ids_per_record, user.distinct_ids) == ("user", True, 1.0, 1.0, 4)
    assert (ad.ids_per_record, ad.distinct_ids) == (2.0, 2)
    assert (extra.name, extra.used, extra.present) == ("extra", False, 1.0)
    assert report.label_rate == 0.5 and report.event_time_ms == (1000, 1003)
    assert report.dense_mean == (1.5,)
    json.dumps(report.as_dict())  # --json


def test_a_csv_sample_lists_declared_columns_the_model_does_not_read() -> None:
    config = job('format = "csv"\ncsv_columns = ["id:ignore", "y:label", "user:sparse", "os:sparse", "x:dense"]',
                 'sparse_fields = ["user"]')
    report = check_records(config, [("t:0@0", b"a,1,5,ios,0.5"), ("t:0@1", b"b,0,,ios,1.5"), ("t:0@2", b"c,x,1,2,3")])
    assert report.good == 2 and report.bad[0][0] == "t:0@2"
    user, os_ = report.fields
    assert (user.present, user.distinct_ids) == (0.5, 1)
    assert os_.name == "os" and not os_.used and math.isnan(os_.present)

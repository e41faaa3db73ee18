import json
import pickle
import re
from dataclasses import FrozenInstanceError, fields, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.schemas.config import (
                                         CsvColumn,
                                         InputSection,
                                         JobConfig,
                                         JobConfigError,
                                         JobSection,
                                         MasterSection,
                                         ModelSection,
                                         PserversSection,
                                         SgdMode,
                                         TasksSection,
                                         TrainSection,
                                         )

FAST = settings(max_examples=50, deadline=None)

# The example job file from DESIGN.md, verbatim: the user's contract.
DESIGN_EXAMPLE = """\
[job]
name = "ctr"                      # etcd prefix, topic prefix, Redis prefix
[input]
topics = ["clicks"]               # any existing topic(s): "point a Kafka topic at a job"
format = "json"                   # json | binary | csv | "module:callable"
[tasks]
max_records = 2000                # a task never spans more records than this
linger_ms = 500                   # cut a partial task at the head of a live stream after this
timeout_s = 30
max_attempts = 3
[model]
factory = "streamtrain.trainer.models:WideDeep"
[train]
sgd = "async"                     # async | sync | bounded
delivery = "exactly_once"         # exactly_once | at_least_once
push_every = 1                    # n mini-batches
pull_every = 1                    # m mini-batches
[pservers]
count = 2
optimizer = "adagrad"             # sgd | adagrad | adam | ftrl | "module:callable"
checkpoint_every_s = 60
checkpoint_uri = "file:///var/lib/streamtrain/ckpt"   # any pyarrow filesystem URI
"""

MINIMAL = {"job": {"name": "ctr"}, "input": {"topics": ["clicks"]}}


def toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # Python's float repr (1e-05, inf, nan) is valid TOML
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def to_toml(doc):
    lines = []
    for section, keys in doc.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def with_keys(**sections):
    """MINIMAL with extra keys merged in, e.g. with_keys(tasks={"max_records": 5})."""
    doc = {name: dict(keys) for name, keys in MINIMAL.items()}
    for name, keys in sections.items():
        doc.setdefault(name, {}).update(keys)
    return doc


def rejected(doc, source="job.toml"):
    with pytest.raises(JobConfigError) as info:
        JobConfig.from_toml(to_toml(doc), source)
    return info.value


# ---------------------------------------------------------------------- loading and defaults


def test_design_example_job_file_loads_with_its_values():
    config = JobConfig.from_toml(DESIGN_EXAMPLE, "job.toml")
    assert config.name == "ctr"
    assert config.input.topics == ("clicks",)
    assert config.model.factory == "streamtrain.trainer.models:WideDeep"
    assert config.tasks.timeout_s == 30.0 and isinstance(config.tasks.timeout_s, float)
    assert config.pservers.checkpoint_uri == "file:///var/lib/streamtrain/ckpt"
    assert config.pservers.checkpoint_every_s == 60.0


def test_every_toml_example_in_the_docs_loads():
    text = (Path(__file__).parents[2] / "docs" / "job-config.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    complete = JobConfig.from_toml(blocks[0], "docs/job-config.md")
    assert complete.input.csv_columns[0] == CsvColumn("clicked", "label")
    assert JobConfig.from_toml(blocks[1]) == JobConfig.from_toml(to_toml(MINIMAL))


def test_minimal_job_file_takes_every_documented_default():
    config = JobConfig.from_toml(to_toml(MINIMAL))
    assert config.to_dict() == {
        "job": {"name": "ctr"},
        "input": {
            "topics": ["clicks"],
            "format": "json",
            "csv_columns": [],
            "registry": "",
            "passes": 0,
            "start_from": "earliest",
        },
        "tasks": {
            "max_records": 8192,
            "linger_ms": 500,
            "timeout_s": 30.0,
            "max_attempts": 3,
            "max_todo": 1000,
            "max_failed_kept": 1000,
        },
        "model": {
            "factory": "streamtrain.trainer.models:LogisticRegression",
            "embedding_dim": 16,
            "hash_buckets": 2**20,
            "batch_size": 256,
            "sparse_fields": [],
            "dense_features": 0,
        },
        "train": {
            "sgd": "async",
            "staleness": 0,
            "delivery": "exactly_once",
            "push_every": "auto",
            "pull_every": 1,
            "max_in_flight": 0,
            "damp_stale": True,
            "average_steps": 50,
            "learning_rate": 0.05,
            "torch_threads": 1,
        },
        "pservers": {
            "count": 2,
            "slots": 256,
            "optimizer": "adagrad",
            "checkpoint_every_s": 60.0,
            "checkpoint_uri": "file:///var/lib/streamtrain/ctr/ckpt",
            "keep_checkpoints": 3,
        },
        "master": {"lock_ttl_s": 10, "poll_ms": 200, "compact_history_s": 10},
        "kafka": {"replication_factor": 0, "min_insync_replicas": 0},
    }


def test_default_checkpoint_uri_contains_the_job_name():
    config = JobConfig.from_toml(to_toml(with_keys(job={"name": "other.job"})))
    assert config.pservers.checkpoint_uri == "file:///var/lib/streamtrain/other.job/ckpt"


def test_online_input_is_not_bounded_and_passes_make_it_bounded():
    assert not JobConfig.from_toml(to_toml(MINIMAL)).bounded
    assert JobConfig.from_toml(to_toml(with_keys(input={"passes": 2}))).bounded


def test_ints_are_accepted_where_floats_are_and_stored_as_floats():
    config = JobConfig.from_toml(to_toml(with_keys(tasks={"timeout_s": 5}, train={"learning_rate": 1})))
    assert config.tasks.timeout_s == 5.0 and isinstance(config.tasks.timeout_s, float)
    assert config.train.learning_rate == 1.0 and isinstance(config.train.learning_rate, float)


def test_csv_columns_are_parsed_into_typed_columns_in_file_order():
    doc = with_keys(input={"format": "csv", "csv_columns": ["clicked:label", "user:sparse", "price:dense", "ts:time"]})
    config = JobConfig.from_toml(to_toml(doc))
    assert config.input.csv_columns == (
        CsvColumn("clicked", "label"),
        CsvColumn("user", "sparse"),
        CsvColumn("price", "dense"),
        CsvColumn("ts", "time"),
    )


def test_module_callable_references_are_accepted_for_format_and_optimizer():
    doc = with_keys(input={"format": "my_pkg.decode:parse_line"}, pservers={"optimizer": "opt.rules:Lamb.build"})
    config = JobConfig.from_toml(to_toml(doc))
    assert config.input.format == "my_pkg.decode:parse_line"
    assert config.pservers.optimizer == "opt.rules:Lamb.build"


def test_bounded_sgd_with_staleness_loads():
    doc = with_keys(train={"sgd": "bounded", "staleness": 4})
    assert JobConfig.from_toml(to_toml(doc)).train.staleness == 4


def test_config_and_sections_are_frozen_and_hashable():
    config = JobConfig.from_toml(to_toml(MINIMAL))
    with pytest.raises(FrozenInstanceError):
        config.tasks.max_records = 1  # type: ignore[misc]
    assert hash(config) == hash(JobConfig.from_toml(to_toml(MINIMAL)))


def test_sections_constructed_directly_are_validated_and_composed():
    config = JobConfig(JobSection("ctr"), InputSection(["clicks"]), tasks=TasksSection(max_records=10))
    assert config.input.topics == ("clicks",)
    assert config.tasks.max_records == 10
    with pytest.raises(JobConfigError, match=r"^tasks\.max_records: must be an integer >= 1, got 0$"):
        TasksSection(max_records=0)
    with pytest.raises(JobConfigError, match="csv_columns"):
        InputSection(("a",), format="csv", csv_columns=(CsvColumn("y", "bogus"),))


# --------------------------------------------------------------------------- validation


def test_negative_max_records_is_rejected_naming_the_file_and_key():
    err = rejected(with_keys(tasks={"max_records": -3}))
    assert str(err) == "job.toml: tasks.max_records: must be an integer >= 1, got -3"
    assert (err.source, err.key) == ("job.toml", "tasks.max_records")


def test_unknown_sgd_mode_is_rejected_listing_the_choices():
    err = rejected(with_keys(train={"sgd": "fast"}))
    assert str(err) == "job.toml: train.sgd: must be one of async, sync, bounded, got 'fast'"


def test_missing_job_name_is_rejected_as_required():
    err = rejected({"job": {}, "input": {"topics": ["clicks"]}})
    assert str(err) == "job.toml: job.name: is required"


def test_missing_input_section_is_rejected_naming_input_topics():
    assert rejected({"job": {"name": "ctr"}}).key == "input.topics"


def test_a_section_that_is_not_a_table_is_rejected():
    text = 'tasks = 3\n[job]\nname = "ctr"\n[input]\ntopics = ["a"]\n'
    with pytest.raises(JobConfigError, match=r"^<job>: tasks: must be a table \(\[tasks\]\), got 3$"):
        JobConfig.from_toml(text)


BAD_VALUES = [
    # (section, key, value, the key the error names, a fragment of the reason)
    ("job", "name", "", "job.name", "1..100"),
    ("job", "name", "a" * 101, "job.name", "1..100"),
    ("job", "name", "has space", "job.name", "1..100"),
    ("job", "name", "st:ctr", "job.name", "1..100"),
    ("job", "name", "..", "job.name", "'..'"),
    ("job", "name", 7, "job.name", "got 7"),
    ("input", "topics", [], "input.topics", "non-empty list"),
    ("input", "topics", "clicks", "input.topics", 'write ["clicks"]'),
    ("input", "topics", ["ok", "bad/topic"], "input.topics[1]", "Kafka topic name"),
    ("input", "topics", ["a" * 250], "input.topics[0]", "Kafka topic name"),
    ("input", "topics", ["."], "input.topics[0]", "Kafka topic name"),
    ("input", "topics", ["a", 3], "input.topics[1]", "got 3"),
    ("input", "topics", ["a", "b", "a"], "input.topics[2]", "listed twice (also input.topics[0])"),
    ("input", "topics", ["ctr.grad.0"], "input.topics[0]", "the job's own topics"),
    ("input", "topics", ["ctr.dlq"], "input.topics[0]", "the job's own topics"),
    ("input", "topics", ["ctr.metrics"], "input.topics[0]", "the job's own topics"),
    ("input", "format", "xml", "input.format", "json, binary, csv, avro, protobuf or a 'module.path:callable'"),
    ("input", "format", "module:", "input.format", "got 'module:'"),
    ("input", "format", "a b:c", "input.format", "got 'a b:c'"),
    ("input", "csv_columns", ["y:label"], "input.csv_columns", "only applies when input.format = 'csv'"),
    ("input", "passes", -1, "input.passes", "integer >= 0"),
    ("input", "passes", 1.5, "input.passes", "integer >= 0, got 1.5"),
    ("input", "start_from", "beginning", "input.start_from", "one of earliest, latest"),
    ("tasks", "max_records", 0, "tasks.max_records", "integer >= 1, got 0"),
    ("tasks", "max_records", True, "tasks.max_records", "integer >= 1, got true"),
    ("tasks", "max_records", "2000", "tasks.max_records", "integer >= 1, got '2000'"),
    ("tasks", "max_records", 2000.0, "tasks.max_records", "got 2000.0"),
    ("tasks", "linger_ms", -1, "tasks.linger_ms", "integer >= 0"),
    ("tasks", "timeout_s", 0, "tasks.timeout_s", "number > 0, got 0"),
    ("tasks", "timeout_s", -0.5, "tasks.timeout_s", "number > 0"),
    ("tasks", "timeout_s", float("inf"), "tasks.timeout_s", "got inf"),
    ("tasks", "timeout_s", float("nan"), "tasks.timeout_s", "got nan"),
    ("tasks", "timeout_s", False, "tasks.timeout_s", "got false"),
    ("tasks", "timeout_s", "30", "tasks.timeout_s", "got '30'"),
    ("tasks", "max_attempts", 0, "tasks.max_attempts", "integer >= 1"),
    ("tasks", "max_todo", 0, "tasks.max_todo", "integer >= 1"),
    ("tasks", "max_failed_kept", -1, "tasks.max_failed_kept", "integer >= 0"),
    ("model", "factory", "trainer.models.WideDeep", "model.factory", "'module.path:callable'"),
    ("model", "factory", "", "model.factory", "'module.path:callable'"),
    ("model", "embedding_dim", 0, "model.embedding_dim", "integer >= 1"),
    ("model", "hash_buckets", 0, "model.hash_buckets", "integer >= 1"),
    ("model", "batch_size", 0, "model.batch_size", "integer >= 1"),
    ("train", "staleness", -1, "train.staleness", "integer >= 0"),
    ("train", "staleness", 2, "train.staleness", "only applies when train.sgd = 'bounded'"),
    ("train", "delivery", "exactly-once", "train.delivery", "one of exactly_once, at_least_once"),
    ("train", "push_every", 0, "train.push_every", '"auto" or an integer >= 1'),
    ("train", "push_every", "Auto", "train.push_every", '"auto" or an integer >= 1'),
    ("train", "push_every", True, "train.push_every", '"auto" or an integer >= 1'),
    ("train", "pull_every", 0, "train.pull_every", "integer >= 1"),
    ("train", "max_in_flight", -1, "train.max_in_flight", "integer in 0..255"),
    ("train", "max_in_flight", 256, "train.max_in_flight", "integer in 0..255"),
    ("train", "damp_stale", 1, "train.damp_stale", "true or false"),
    ("train", "learning_rate", 0, "train.learning_rate", "number > 0"),
    ("train", "learning_rate", -0.1, "train.learning_rate", "number > 0"),
    ("pservers", "count", 0, "pservers.count", "integer in 1..1024, got 0"),
    ("pservers", "count", 1025, "pservers.count", "integer in 1..1024"),
    ("pservers", "slots", 127, "pservers.slots", "integer in 128..1024, got 127"),
    ("pservers", "slots", 1025, "pservers.slots", "integer in 128..1024"),
    ("pservers", "optimizer", "rmsprop", "pservers.optimizer", "sgd, adagrad, adam, ftrl or a"),
    ("pservers", "checkpoint_every_s", 0, "pservers.checkpoint_every_s", "number > 0"),
    ("pservers", "checkpoint_uri", "/var/lib/ckpt", "pservers.checkpoint_uri", "filesystem URI"),
    ("pservers", "checkpoint_uri", "", "pservers.checkpoint_uri", "filesystem URI"),
    ("pservers", "checkpoint_uri", "s3://", "pservers.checkpoint_uri", "filesystem URI"),
    ("pservers", "checkpoint_uri", 3, "pservers.checkpoint_uri", "filesystem URI"),
    ("pservers", "keep_checkpoints", 0, "pservers.keep_checkpoints", "integer >= 1"),
    ("master", "lock_ttl_s", 0, "master.lock_ttl_s", "integer >= 1"),
    ("master", "lock_ttl_s", 2.5, "master.lock_ttl_s", "integer >= 1, got 2.5"),
    ("master", "poll_ms", 9, "master.poll_ms", "integer >= 10, got 9"),
    ("tasks", "max_records", {"a": 1}, "tasks.max_records", "got a table"),
]


@pytest.mark.parametrize(
    "section, key, value, named, reason",
    BAD_VALUES,
    ids=[f"{s}.{k}={v!r}"[:60] for s, k, v, _, _ in BAD_VALUES],
)
def test_invalid_value_is_rejected_naming_file_key_and_why(section, key, value, named, reason):
    err = rejected(with_keys(**{section: {key: value}}))
    assert err.key == named
    assert err.source == "job.toml"
    assert reason in err.reason
    assert str(err) == f"job.toml: {named}: {err.reason}"


def test_bounded_sgd_without_staleness_is_rejected():
    err = rejected(with_keys(train={"sgd": "bounded"}))
    assert (err.key, err.reason) == ("train.staleness", "must be an integer >= 1 when train.sgd = 'bounded', got 0")


def test_max_in_flight_is_for_async_only():
    assert JobConfig.from_toml(to_toml(with_keys(train={"sgd": "sync"}))).train.max_in_flight == 0
    assert JobConfig.from_toml(to_toml(with_keys(train={"max_in_flight": 3}))).train.max_in_flight == 3
    err = rejected(with_keys(train={"sgd": "bounded", "staleness": 2, "max_in_flight": 2}))
    assert err.key == "train.max_in_flight" and "async" in err.reason


@pytest.mark.parametrize("name, barrier, steps, in_flight, staleness", [
    ("async", False, False, True, False),
    ("sync", True, True, False, False),
    ("bounded", False, True, False, True),
])
def test_the_sgd_mode_is_read_as_an_enum_and_stored_as_its_string(name, barrier, steps, in_flight, staleness):
    train = {"sgd": name, "staleness": 2} if name == "bounded" else {"sgd": name}
    config = JobConfig.from_toml(to_toml(with_keys(train=train)))
    mode = config.train.sgd
    assert mode is SgdMode(name) and mode == name
    assert (mode.holds_at_barrier, mode.waits_on_steps, mode.limits_in_flight, mode.bounds_staleness) == (
        barrier, steps, in_flight, staleness)
    assert config.to_dict()["train"]["sgd"] == name and type(config.to_dict()["train"]["sgd"]) is str
    assert json.loads(config.to_json())["train"]["sgd"] == name
    assert TrainSection(**train).sgd is mode

def test_a_removed_key_is_refused_with_what_became_of_it():
    err = rejected(with_keys(train={"commit_every": 1}))
    assert err.key == "train.commit_every" and err.reason.startswith("removed:") and "ledger" in err.reason


def test_fewer_slots_than_pservers_is_rejected():
    err = rejected(with_keys(pservers={"count": 200, "slots": 128}))
    assert err.key == "pservers.slots" and "pservers.count (200)" in err.reason


def test_bounded_input_starting_at_latest_is_rejected():
    err = rejected(with_keys(input={"passes": 1, "start_from": "latest"}))
    assert err.key == "input.start_from" and "holds no records" in err.reason


def test_online_input_may_start_at_latest():
    assert JobConfig.from_toml(to_toml(with_keys(input={"start_from": "latest"}))).input.start_from == "latest"


def test_integer_beyond_64_bits_is_rejected_from_json():
    doc = {"version": 1, **JobConfig.from_toml(to_toml(MINIMAL)).to_dict()}
    doc["tasks"]["max_records"] = 2**64
    with pytest.raises(JobConfigError, match="beyond a 64-bit integer"):
        JobConfig.from_json(json.dumps(doc))


BAD_CSV = [
    ([], "input.csv_columns", "is required when input.format = 'csv'"),
    ("y:label", "input.csv_columns", "list of 'name:kind' strings"),
    (["y:label", "price"], "input.csv_columns[1]", "'name:kind' string"),
    (["y:label", "a:b:dense"], "input.csv_columns[1]", "'name:kind' string"),
    (["y:label", ":dense"], "input.csv_columns[1]", "column name"),
    (["y:label", "my price:dense"], "input.csv_columns[1]", "column name"),
    (["y:label", "price:float"], "input.csv_columns[1]",
     "kind must be one of label, dense, sparse, time, ignore, got 'float'"),
    (["y:label", "x:dense", "x:sparse"], "input.csv_columns[2]", "listed twice (also input.csv_columns[1])"),
    (["x:dense"], "input.csv_columns", "exactly one 'label' column, got 0"),
    (["y:label", "z:label", "x:dense"], "input.csv_columns", "exactly one 'label' column, got 2"),
    (["y:label", "x:dense", "t:time", "u:time"], "input.csv_columns", "at most one 'time' column"),
    (["y:label", "t:time"], "input.csv_columns", "at least one 'dense' or 'sparse' column"),
]


@pytest.mark.parametrize("columns, named, reason", BAD_CSV, ids=[repr(c)[:50] for c, _, _ in BAD_CSV])
def test_invalid_csv_columns_are_rejected_naming_the_column(columns, named, reason):
    doc = with_keys(input={"format": "csv", "csv_columns": columns})
    err = rejected(doc)
    assert err.key == named
    assert reason in err.reason


def test_csv_format_without_columns_is_rejected():
    assert rejected(with_keys(input={"format": "csv"})).key == "input.csv_columns"


# ------------------------------------------------------------------------- unknown keys


def test_misspelt_key_is_rejected_suggesting_the_closest_known_key():
    err = rejected(with_keys(tasks={"max_record": 5}))
    assert str(err) == "job.toml: tasks.max_record: unknown key, did you mean 'tasks.max_records'?"


def test_misspelt_section_is_rejected_suggesting_the_closest_section():
    err = rejected(with_keys(pserver={"count": 3}))
    assert (err.key, err.reason) == ("pserver", "unknown section, did you mean 'pservers'?")


def test_key_in_the_wrong_section_suggests_the_section_it_belongs_to():
    err = rejected(with_keys(train={"optimizer": "adam"}))
    assert err.reason == "unknown key, did you mean 'pservers.optimizer'?"


def test_key_above_every_section_header_is_rejected_suggesting_where_it_belongs():
    with pytest.raises(JobConfigError) as info:
        JobConfig.from_toml('name = "ctr"\n' + to_toml(MINIMAL))
    err = info.value
    assert err.key == "name"
    assert "outside any [section]" in err.reason and "'job.name'" in err.reason


def test_unknown_key_without_a_close_match_lists_the_known_keys():
    err = rejected(with_keys(master={"zzzzzz": 1}))
    assert err.reason == "unknown key (known keys in [master]: lock_ttl_s, poll_ms, compact_history_s)"


def test_every_unknown_key_is_named_in_one_error():
    err = rejected(with_keys(tasks={"max_record": 5}, train={"sdg": "sync"}, extra={}))
    assert err.key == "tasks.max_record"
    for name in ("tasks.max_record", "train.sdg", "extra"):
        assert name in str(err)


def test_unknown_keys_are_reported_before_missing_required_ones():
    # `nme` instead of `name`: the typo is the problem, not a missing name.
    err = rejected({"job": {"nme": "ctr"}, "input": {"topics": ["a"]}})
    assert (err.key, err.reason) == ("job.nme", "unknown key, did you mean 'job.name'?")


def test_nested_table_inside_a_section_is_an_unknown_key():
    text = to_toml(MINIMAL) + "[tasks.retry]\nmax = 3\n"
    with pytest.raises(JobConfigError, match=r"tasks\.retry: unknown key"):
        JobConfig.from_toml(text)


# ------------------------------------------------------------------ files and syntax errors


def test_missing_file_is_rejected_naming_the_path(tmp_path):
    path = tmp_path / "absent.toml"
    with pytest.raises(JobConfigError) as info:
        JobConfig.load(path)
    assert info.value.source == str(path)
    assert str(info.value).startswith(f"{path}: cannot read the job file: ")
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_directory_instead_of_file_is_rejected_naming_the_path(tmp_path):
    with pytest.raises(JobConfigError, match="cannot read the job file"):
        JobConfig.load(tmp_path)


def test_non_utf8_file_is_rejected_naming_the_path(tmp_path):
    path = tmp_path / "job.toml"
    path.write_bytes(b'[job]\nname = "\xff"\n')
    with pytest.raises(JobConfigError, match=rf"^{path}: not UTF-8 text \(bad byte at offset 14\)$"):
        JobConfig.load(path)


def test_toml_syntax_error_is_rejected_with_line_and_column(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[job]\nname = "ctr"\n[input]\ntopics = [clicks]\n')
    with pytest.raises(JobConfigError) as info:
        JobConfig.load(path)
    assert str(info.value).startswith(f"{path}: invalid TOML: ")
    assert "line 4, column 11" in str(info.value)


def test_duplicate_toml_key_is_a_syntax_error():
    with pytest.raises(JobConfigError, match="invalid TOML"):
        JobConfig.from_toml(to_toml(MINIMAL) + "[tasks]\nmax_records = 1\nmax_records = 2\n")


def test_load_reads_a_file_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "job.toml"
    path.write_bytes(b"\xef\xbb\xbf" + DESIGN_EXAMPLE.encode())
    assert JobConfig.load(str(path)) == JobConfig.from_toml(DESIGN_EXAMPLE)


def test_errors_survive_pickling_with_their_fields():
    err = rejected(with_keys(tasks={"max_records": -3}))
    copy = pickle.loads(pickle.dumps(err))
    assert (str(copy), copy.key, copy.reason, copy.source) == (str(err), err.key, err.reason, err.source)


# ------------------------------------------------------------------------------------ JSON


def test_json_is_canonical_ascii_with_a_version():
    data = JobConfig.from_toml(DESIGN_EXAMPLE).to_json()
    doc = json.loads(data)
    assert doc["version"] == 1
    assert data == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("ascii")


def test_json_round_trip_of_the_design_example_is_exact():
    config = JobConfig.from_toml(DESIGN_EXAMPLE)
    assert JobConfig.from_json(config.to_json()) == config
    assert JobConfig.from_json(config.to_json()).to_json() == config.to_json()


def test_json_is_validated_like_toml():
    doc = json.loads(JobConfig.from_toml(to_toml(MINIMAL)).to_json())
    doc["train"]["sgd"] = "fast"
    with pytest.raises(JobConfigError) as info:
        JobConfig.from_json(json.dumps(doc).encode(), "etcd:/streamtrain/ctr/config")
    assert str(info.value) == "etcd:/streamtrain/ctr/config: train.sgd: must be one of async, sync, bounded, got 'fast'"


def test_json_with_an_unknown_key_is_rejected():
    doc = json.loads(JobConfig.from_toml(to_toml(MINIMAL)).to_json())
    doc["tasks"]["max_record"] = 1
    with pytest.raises(JobConfigError, match="did you mean 'tasks.max_records'"):
        JobConfig.from_json(json.dumps(doc))


def test_json_null_is_rejected_even_where_a_default_exists():
    doc = json.loads(JobConfig.from_toml(to_toml(MINIMAL)).to_json())
    doc["pservers"]["checkpoint_uri"] = None
    with pytest.raises(JobConfigError, match=r"pservers\.checkpoint_uri: must not be null"):
        JobConfig.from_json(json.dumps(doc))


@pytest.mark.parametrize(
    "data, fragment",
    [
        (b"{", "invalid JSON"),
        (b"\xff", "invalid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"job": {"name": "a"}, "input": {"topics": ["t"]}}', "version: must be 1"),
        (b'{"version": 2, "job": {"name": "a"}, "input": {"topics": ["t"]}}', "version: must be 1"),
        (b'{"version": true, "job": {"name": "a"}, "input": {"topics": ["t"]}}', "got true"),
        (b'{"version": 1, "job": {"name": "a"}, "job": {"name": "b"}, "input": {"topics": ["t"]}}',
         "job: duplicate key"),
    ],
    ids=["truncated", "not-utf8", "array", "no-version", "version-2", "version-true", "duplicate-key"],
)
def test_malformed_json_is_rejected_naming_the_source(data, fragment):
    with pytest.raises(JobConfigError) as info:
        JobConfig.from_json(data, "etcd")
    assert str(info.value).startswith("etcd: ")
    assert fragment in str(info.value)


# ------------------------------------------------------------------- property: round trips

names = st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,15}", fullmatch=True)
refs = st.from_regex(r"[a-z_][a-z0-9_]{0,5}(\.[a-z_][a-z0-9_]{0,5}){0,2}:[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
positive = st.one_of(
    st.integers(1, 10**6),
    st.floats(min_value=1e-9, max_value=1e12, allow_nan=False, allow_infinity=False, exclude_min=False),
)


@st.composite
def job_files(draw):
    """Valid job files as TOML-shaped dicts, each optional key present or absent."""

    def maybe(section, key, strategy):
        if draw(st.booleans()):
            section[key] = draw(strategy)

    name = draw(names)
    topics = draw(
        st.lists(names.filter(lambda t: not t.startswith(f"{name}.")), min_size=1, max_size=3, unique=True)
    )
    doc = {"job": {"name": name}, "input": {"topics": topics}}

    inp = doc["input"]
    fmt = draw(st.sampled_from(["json", "binary", "csv", None]) | refs)
    if fmt is not None:
        inp["format"] = fmt
    if fmt == "csv":
        kinds = st.sampled_from(["dense", "sparse"])
        features = draw(st.lists(st.tuples(names, kinds), min_size=1, max_size=4))
        columns = [f"c{i}_{n}:{kind}" for i, (n, kind) in enumerate(features)] + ["label_col:label"]
        if draw(st.booleans()):
            columns.append("event_ts:time")
        inp["csv_columns"] = draw(st.permutations(columns))
    maybe(inp, "passes", st.integers(0, 5))
    inp_bounded = inp.get("passes", 0) >= 1
    maybe(inp, "start_from", st.just("earliest") if inp_bounded else st.sampled_from(["earliest", "latest"]))

    tasks = {}
    maybe(tasks, "max_records", st.integers(1, 2**63 - 1))
    maybe(tasks, "linger_ms", st.integers(0, 10**6))
    maybe(tasks, "timeout_s", positive)
    maybe(tasks, "max_attempts", st.integers(1, 100))
    maybe(tasks, "max_todo", st.integers(1, 10**6))
    maybe(tasks, "max_failed_kept", st.integers(0, 10**6))

    model = {}
    maybe(model, "factory", refs)
    maybe(model, "embedding_dim", st.integers(1, 1024))
    maybe(model, "hash_buckets", st.integers(1, 2**40))
    maybe(model, "batch_size", st.integers(1, 1 << 16))

    train = {}
    sgd = draw(st.sampled_from(["async", "sync", "bounded", None]))
    if sgd is not None:
        train["sgd"] = sgd
    if sgd == "bounded":
        train["staleness"] = draw(st.integers(1, 1000))
    else:
        maybe(train, "staleness", st.just(0))
    delivery = draw(st.sampled_from(["exactly_once", "at_least_once", None]))
    if delivery is not None:
        train["delivery"] = delivery
    maybe(train, "max_in_flight", st.integers(0, 100) if sgd in ("async", None) else st.just(0))
    maybe(train, "damp_stale", st.booleans())
    maybe(train, "push_every", st.one_of(st.integers(1, 100), st.just("auto")))
    maybe(train, "pull_every", st.integers(1, 100))
    maybe(train, "learning_rate", positive)

    pservers = {}
    count = draw(st.integers(1, 1024))
    if draw(st.booleans()):
        pservers["count"] = count
        pservers["slots"] = draw(st.integers(max(128, count), 1024))
    else:
        maybe(pservers, "slots", st.integers(128, 1024))
    maybe(pservers, "optimizer", st.sampled_from(["sgd", "adagrad", "adam", "ftrl"]) | refs)
    maybe(pservers, "checkpoint_every_s", positive)
    maybe(pservers, "checkpoint_uri", names.map(lambda n: f"s3://bucket/{n}/ckpt"))
    maybe(pservers, "keep_checkpoints", st.integers(1, 50))

    master = {}
    maybe(master, "lock_ttl_s", st.integers(1, 3600))
    maybe(master, "poll_ms", st.integers(10, 60_000))

    optional = {"tasks": tasks, "model": model, "train": train, "pservers": pservers, "master": master}
    for section, keys in optional.items():
        if keys or draw(st.booleans()):
            doc[section] = keys
    return doc


@FAST
@given(job_files())
def test_valid_job_files_keep_their_values_and_round_trip_exactly_through_json(doc):
    config = JobConfig.from_toml(to_toml(doc))
    resolved = config.to_dict()
    for section, keys in doc.items():
        for key, value in keys.items():
            assert resolved[section][key] == value

    data = config.to_json()
    again = JobConfig.from_json(data)
    assert again == config
    assert again.to_json() == data
    # to_dict is a complete job file: written back as TOML it gives the same config.
    assert JobConfig.from_toml(to_toml(resolved)) == config


KNOWN_KEYS = {
    "tasks": {f.name for f in fields(TasksSection)},
    "model": {f.name for f in fields(ModelSection)},
    "train": {f.name for f in fields(TrainSection)},
    "pservers": {f.name for f in fields(PserversSection)},
    "master": {f.name for f in fields(MasterSection)},
}


@settings(max_examples=25, deadline=None)
@given(job_files(), st.sampled_from(sorted(KNOWN_KEYS)), st.text(min_size=1, max_size=8))
def test_any_extra_key_in_a_valid_job_file_is_rejected_naming_it(doc, section, key):
    if key in KNOWN_KEYS[section]:
        return
    doc.setdefault(section, {})
    doc[section][key] = 1
    data = json.dumps({"version": 1, **doc})
    with pytest.raises(JobConfigError) as info:
        JobConfig.from_json(data)
    assert info.value.key == f"{section}.{key}"
    assert info.value.reason.startswith("unknown key")


def test_replacing_a_section_revalidates_it():
    config = JobConfig.from_toml(to_toml(MINIMAL))
    with pytest.raises(JobConfigError, match="train.staleness"):
        replace(config, train=replace(config.train, sgd="bounded"))
    assert replace(config, pservers=PserversSection(count=4)).pservers.checkpoint_uri.endswith("/ctr/ckpt")
    assert replace(config, train=TrainSection(sgd="sync")).train.sgd == "sync"

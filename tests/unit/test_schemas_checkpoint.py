import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.schemas import CheckpointManifest, FileEntry, SchemaError

FAST = settings(max_examples=60, deadline=None)

segment = st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,15}", fullmatch=True)
topics = st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,20}", fullmatch=True)
files = st.builds(
    FileEntry,
    path=st.lists(segment, min_size=1, max_size=3).map("/".join),
    size=st.integers(0, 2**40),
    sha256=st.binary(max_size=8).map(lambda b: hashlib.sha256(b).hexdigest()),
)
manifests = st.builds(
    CheckpointManifest,
    checkpoint_id=segment.filter(lambda s: s != "latest"),
    job=segment,
    shard=st.integers(0, 1023),
    created_at=st.floats(0, 4e9),
    optimizer=st.sampled_from(["sgd", "adagrad", "adam", "ftrl", "my.module:Optimizer"]),
    files=st.lists(files, max_size=4, unique_by=lambda f: f.path).map(tuple),
    grad_offsets=st.dictionaries(topics, st.integers(0, 2**62), max_size=2),
    input_watermarks=st.dictionaries(
        st.tuples(topics, st.integers(0, 2**31 - 1)).map(lambda tp: f"{tp[0]}:{tp[1]}"), st.integers(0, 2**62),
        max_size=4
    ),
    slots=st.lists(st.integers(0, 1023), unique=True, max_size=20).map(tuple),
)
SHA = hashlib.sha256(b"params").hexdigest()


def small_doc() -> dict:
    return {
        "v": 1,
        "checkpoint_id": "20250101T000000Z",
        "job": "ctr",
        "shard": 1,
        "created_at": 1735689600.0,
        "optimizer": "adagrad",
        "files": [{"path": "shard-1/params.npz", "size": 1024, "sha256": SHA}],
        "grad_offsets": {"ctr.grad.1": 5000},
        "input_watermarks": {"clicks:0": 120000, "clicks:1": 98000},
        "slots": [1, 3, 5],
        "epoch": 2,
        "published_epoch": 2**64 - 1,
        "published_round": 1500,
    }


def raises_naming(field, fn, *args, format="CheckpointManifest"):
    with pytest.raises(SchemaError) as info:
        fn(*args)
    err = info.value
    assert (err.format, err.field) == (format, field)
    assert f"'{field}'" in str(err)
    return err


@FAST
@given(manifests)
def test_manifest_round_trips_through_json(manifest):
    assert CheckpointManifest.from_json(manifest.to_json()) == manifest


def test_json_form_has_the_documented_keys():
    manifest = CheckpointManifest.from_json(json.dumps(small_doc()))
    assert json.loads(manifest.to_json()) == small_doc()
    assert manifest.files == (FileEntry("shard-1/params.npz", 1024, SHA),)
    assert manifest.grad_offsets["ctr.grad.1"] == 5000


def test_a_manifest_written_before_epochs_reads_as_epoch_0():
    doc = small_doc()
    del doc["epoch"]
    assert CheckpointManifest.from_json(json.dumps(doc)).epoch == 0


def test_a_manifest_written_before_publishing_positions_reads_as_none_known():
    doc = small_doc()
    del doc["published_epoch"], doc["published_round"]
    manifest = CheckpointManifest.from_json(json.dumps(doc))
    assert (manifest.published_epoch, manifest.published_round) == (0, 0)


def test_offset_mappings_are_read_only():
    manifest = CheckpointManifest.from_json(json.dumps(small_doc()))
    with pytest.raises(TypeError):
        manifest.grad_offsets["ctr.grad.1"] = 0


@pytest.mark.parametrize(
    "path, value, field",
    [
        (("v",), 0, "v"),
        (("checkpoint_id",), "latest", "checkpoint_id"),
        (("checkpoint_id",), "a/b", "checkpoint_id"),
        (("job",), "c t r", "job"),
        (("shard",), -1, "shard"),
        (("created_at",), "yesterday", "created_at"),
        (("optimizer",), "", "optimizer"),
        (("files",), {}, "files"),
        (("files", 0), "params.npz", "files[0]"),
        (("files", 0, "sha256"), "ABC", "files[0].sha256"),
        (("files", 0, "sha256"), SHA.upper(), "files[0].sha256"),
        (("files", 0, "size"), -1, "files[0].size"),
        (("files", 0, "path"), "/abs/params.npz", "files[0].path"),
        (("files", 0, "path"), "../params.npz", "files[0].path"),
        (("files", 0, "path"), "a//b", "files[0].path"),
        (("epoch",), -1, "epoch"),
        (("grad_offsets",), [], "grad_offsets"),
        (("grad_offsets", "ctr.grad.1"), -1, "grad_offsets.ctr.grad.1"),
        (("grad_offsets", "ctr.grad.1"), 1.5, "grad_offsets.ctr.grad.1"),
        (("input_watermarks", "clicks:0"), None, "input_watermarks.clicks:0"),
        (("slots",), [1, 1], "slots"),
        (("slots",), [1, -1], "slots[1]"),
        (("slots",), "135", "slots"),
    ],
)
def test_invalid_manifest_values_raise_schema_error(path, value, field):
    doc = small_doc()
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    raises_naming(field, CheckpointManifest.from_json, json.dumps(doc))


@pytest.mark.parametrize(
    "key, field",
    [("clicks", "input_watermarks"), ("clicks:01", "input_watermarks"), ("cl icks:0", "input_watermarks"),
     (":0", "input_watermarks")],
)
def test_watermark_keys_must_be_topic_colon_partition(key, field):
    doc = small_doc()
    doc["input_watermarks"] = {key: 1}
    raises_naming(field, CheckpointManifest.from_json, json.dumps(doc))


def test_grad_offset_keys_must_be_topic_names():
    doc = small_doc()
    doc["grad_offsets"] = {"ctr/grad": 1}
    raises_naming("grad_offsets", CheckpointManifest.from_json, json.dumps(doc))


def test_duplicate_file_paths_raise_schema_error():
    doc = small_doc()
    doc["files"] = doc["files"] * 2
    raises_naming("files[1].path", CheckpointManifest.from_json, json.dumps(doc))


# epoch and the publishing position: 0 if missing
@pytest.mark.parametrize("key", [k for k in small_doc() if k not in ("epoch", "published_epoch", "published_round")])
def test_missing_json_key_raises_schema_error(key):
    doc = small_doc()
    del doc[key]
    raises_naming(key, CheckpointManifest.from_json, json.dumps(doc))


@pytest.mark.parametrize("key", ["path", "size", "sha256"])
def test_missing_file_entry_key_raises_schema_error(key):
    doc = small_doc()
    del doc["files"][0][key]
    raises_naming(f"files[0].{key}", CheckpointManifest.from_json, json.dumps(doc))


def test_file_entry_validates_on_its_own():
    raises_naming("sha256", FileEntry, "params.npz", 1, "nope", format="FileEntry")


def test_nan_creation_time_raises_schema_error():
    text = json.dumps(small_doc()).replace("1735689600.0", "NaN")
    raises_naming("created_at", CheckpointManifest.from_json, text)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60) | st.binary(max_size=60))
def test_arbitrary_input_decodes_or_raises_only_schema_error(data):
    try:
        CheckpointManifest.from_json(data)
    except SchemaError:
        pass

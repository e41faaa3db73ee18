"""Trainer pieces without services: decoders, features, AUC, gradient split, models."""

from __future__ import annotations

import copy
import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.jobstate.sharding import SlotMap
from streamtrain.schemas import Example
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.decoders import ChunkDecoder, DecodeError, make_decoder
from streamtrain.trainer.features import Batch, Columns, Featurizer, MiniBatches, pool
from streamtrain.trainer.metrics import auc
from streamtrain.trainer.models import DeepFM, LogisticRegression, ModelSpec, WideDeep
from streamtrain.trainer.params import BLOCK, DenseLayout, GradientBuffer, RowLayout


def config(**input_section) -> JobConfig:
    lines = ['[job]\nname = "j"\n[input]\ntopics = ["t"]']
    for k, v in input_section.items():
        lines.append(f"{k} = {v}")
    return JobConfig.from_toml("\n".join(lines))


EXAMPLE = Example({"user": (3,), "ad": (7, 8)}, (0.5, -1.0), 1.0, 123)


def test_json_and_binary_decoders_round_trip_and_name_what_is_wrong() -> None:
    assert make_decoder(config().input)(EXAMPLE.to_json()) == EXAMPLE
    assert make_decoder(config(format='"binary"').input)(EXAMPLE.to_bytes()) == EXAMPLE
    with pytest.raises(DecodeError, match="JSON|json"):
        make_decoder(config().input)(b'{"v":1,')
    with pytest.raises(DecodeError, match="tombstone"):
        make_decoder(config().input)(None)


def test_csv_decoder_follows_the_declared_columns() -> None:
    decode = make_decoder(config(format='"csv"',
                                 csv_columns='["y:label", "user:sparse", "os:sparse", "price:dense", "ts:time"]').input)
    example = decode(b"1,42|43,ios,2.5,99\n")
    assert example.label == 1.0 and example.dense == (2.5,) and example.event_time_ms == 99
    assert example.sparse["user"] == (42, 43) and len(example.sparse["os"]) == 1
    with pytest.raises(DecodeError, match="5"):
        decode(b"1,2,3")
    with pytest.raises(DecodeError, match="price"):
        decode(b"1,2,ios,cheap,5")


def test_a_user_decoder_decodes_and_whatever_it_raises_makes_only_that_record_bad(tmp_path, monkeypatch) -> None:
    (tmp_path / "fixed_width.py").write_text(
        "import struct\n"
        "from streamtrain.schemas import Example\n"
        "def decode(value):\n"
        "    user, price, label = struct.unpack('<qdd', value)\n"
        "    return Example({'user': (user,)}, (price,), label, 0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    section = config(format='"fixed_width:decode"').input
    decode = make_decoder(section)
    assert decode(struct.pack("<qdd", 7, 2.5, 1.0)) == Example({"user": (7,)}, (2.5,), 1.0, 0)
    with pytest.raises(DecodeError, match=r"^struct\.error: unpack requires"):
        decode(b"short")  # not one of the exceptions the built-ins expect: still a bad record
    decoded = ChunkDecoder(section, ("user",), 1).decode(
        [struct.pack("<qdd", 1, 0.5, 0.0), b"\x00" * 3, struct.pack("<qdd", 2, 1.5, 1.0)])
    assert [i for i, _ in decoded.bad] == [1] and "struct.error" in decoded.bad[0][1]
    assert len(decoded.columns) == 2


def test_featurizer_hashes_per_field_and_bags_per_example_and_field() -> None:
    f = Featurizer(("user", "ad"), 2, 1 << 20)
    batch = f.batch([EXAMPLE, Example({"ad": (3,)}, (0.0, 0.0), 0.0, 0)])
    assert batch.ids.shape == (4,) and batch.bags.tolist() == [0, 1, 1, 3]
    assert batch.ids[0] != batch.ids[3]  # id 3 in "user" and in "ad" are different features
    assert (batch.ids < (1 << 20)).all()
    rows = torch.arange(8, dtype=torch.float32).view(4, 2)
    pooled = pool(rows, torch.tensor([0, 1, 2, 3]), torch.from_numpy(batch.bags), 2, 2)
    assert pooled.shape == (2, 2, 2) and pooled[0, 1].tolist() == [6.0, 8.0]
    assert not batch.one_id_per_bag()  # two ids in one bag, none in another


def test_bags_of_one_id_pool_as_a_plain_lookup() -> None:
    f = Featurizer(("user", "ad"), 2, 1 << 20)
    batch = f.batch([Example({"user": (4,), "ad": (9,)}, (0.0, 0.0), 1.0, 0),
                     Example({"user": (4,), "ad": (2,)}, (0.0, 0.0), 0.0, 0)])
    assert batch.one_id_per_bag()
    unique, inverse = np.unique(batch.ids, return_inverse=True)
    rows = torch.randn(len(unique), 3, requires_grad=True)
    inverse_t = torch.from_numpy(inverse.astype(np.int64))
    summed = pool(rows, inverse_t, torch.from_numpy(batch.bags), 2, 2)
    looked_up = pool(rows, inverse_t, None, 2, 2)
    assert torch.equal(summed, looked_up)
    (grad_summed,) = torch.autograd.grad(summed.square().sum(), rows)
    (grad_looked_up,) = torch.autograd.grad(looked_up.square().sum(), rows)
    assert torch.equal(grad_summed, grad_looked_up)


def test_mini_batches_inherit_one_id_per_bag_from_their_chunk_only_when_it_holds() -> None:
    f = Featurizer(("user", "ad"), 2, 1 << 20)
    single = [Example({"user": (i,), "ad": (i + 1,)}, (0.0, 0.0), 1.0, 0) for i in range(5)]
    cut = MiniBatches(2)
    batches = list(cut.feed(f.batch(single))) + list(cut.feed(f.batch(single)))
    assert all(b.single and b.one_id_per_bag() for b in batches)
    multi = single[:2] + [Example({"user": (1, 2)}, (0.0, 0.0), 0.0, 0)] + single[:1]
    first, second = MiniBatches(2).feed(f.batch(multi))
    assert first.single is None and first.one_id_per_bag()  # looked at for itself
    assert not second.one_id_per_bag()


def test_chunk_decoder_takes_what_one_by_one_takes_and_gives_the_same_reasons() -> None:
    good = [Example({"user": (i,), "ad": (i, i + 1), "other": (5,)}, (0.5, float(i)), float(i % 2), i)
            for i in range(5)]
    bad = [b'{"v":1,', None, b"\xff\xfe", b'{"v":2,"sparse":{},"dense":[0,0],"label":0,"ts":0}',
           b'{"v":1,"sparse":{"user":[-1]},"dense":[0,0],"label":0,"ts":0}',
           b'{"v":1,"sparse":{"user":[18446744073709551616]},"dense":[0,0],"label":0,"ts":0}',
           b'{"v":1,"sparse":{"":[1]},"dense":[0,0],"label":0,"ts":0}',
           b'{"v":1,"sparse":{"user":[true]},"dense":[0,0],"label":0,"ts":0}',
           b'{"v":1,"sparse":{},"dense":[0],"label":0,"ts":0}',
           b'{"v":1,"sparse":{},"dense":[0,1e39],"label":0,"ts":0}',
           b'{"v":1,"sparse":{},"dense":[0,NaN],"label":0,"ts":0}',
           b'{"v":1,"sparse":{},"dense":[0,0],"label":1.5,"ts":0}',
           b'{"v":1,"sparse":{},"dense":[0,0],"label":0,"ts":-4}']
    values = [e.to_json() for e in good[:2]] + bad + [e.to_json() for e in good[2:]]
    section = config().input
    decoder = ChunkDecoder(section, ("user", "ad"), 2)
    decoded = decoder.decode(values)
    assert [i for i, _ in decoded.bad] == list(range(2, 2 + len(bad)))
    one = make_decoder(section)
    for i, reason in decoded.bad:
        with pytest.raises(DecodeError) as info:
            decoder.fit(one(values[i]))
        assert str(info.value) == reason, i
    want = Columns.gather(good, ("user", "ad"), 2)
    f = Featurizer(("user", "ad"), 2, 1 << 20)
    got, expected = f.featurize(decoded.columns), f.featurize(want)
    for name in ("ids", "bags", "dense", "labels", "offsets", "event_time_ms"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name), err_msg=name)


def test_batches_cut_from_a_featurized_chunk_equal_batches_featurized_alone() -> None:
    rng = np.random.default_rng(1)
    examples = [Example({"a": tuple(rng.integers(0, 99, rng.integers(0, 4)).tolist()), "b": (int(i),)},
                        (float(i),), 0.0, int(i)) for i in range(50)]
    f = Featurizer(("a", "b"), 1, 1 << 16)
    whole = f.batch(examples)
    halves = Batch.concat(f.batch(examples[:17]), f.batch(examples[17:]))
    for start, stop in [(0, 17), (17, 50), (5, 6), (0, 50)]:
        for got in (whole.slice(start, stop), halves.slice(start, stop)):
            alone = f.batch(examples[start:stop])
            for name in ("ids", "bags", "dense", "labels", "offsets", "event_time_ms"):
                np.testing.assert_array_equal(getattr(got, name), getattr(alone, name), err_msg=name)


def test_mini_batches_do_not_depend_on_where_chunks_begin() -> None:
    examples = [Example({"a": (i, i + 1), "b": (i,)}, (float(i),), float(i % 2), i) for i in range(103)]
    f = Featurizer(("a", "b"), 1, 1 << 16)
    for chunk in (1, 7, 10, 64, 103):
        batcher = MiniBatches(10)
        got = [b for i in range(0, 103, chunk) for b in batcher.feed(f.batch(examples[i:i + chunk]))]
        got.append(batcher.rest())
        assert [b.size for b in got] == [10] * 10 + [3]
        for k, batch in enumerate(got):
            np.testing.assert_array_equal(batch.ids, f.batch(examples[10 * k:10 * k + 10]).ids)
        assert batcher.rest() is None


def test_auc_matches_the_pairwise_definition_with_ties() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    scores = rng.integers(0, 10, 300).astype(float)  # many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairwise = (((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum())
                / (len(pos) * len(neg)))
    assert auc(labels, scores) == pytest.approx(pairwise)
    assert auc(np.ones(3), np.arange(3)) is None


def test_gradient_buffer_keeps_each_step_apart_and_sends_one_delta_per_shard() -> None:
    slot_map = SlotMap.uniform(128, 3)
    model = LogisticRegression(ModelSpec(("a",), 2, 4))
    layout = DenseLayout(model)
    layout.load({})
    model.bias.grad = torch.ones(1)
    buffer = GradientBuffer(slot_map, 3)
    buffer.add_step("lr", np.array([1, 2], dtype=np.uint64), np.ones((2, 1), dtype=np.float32), None,
                    layout.gradients())
    buffer.add_step("lr", np.array([2, 9], dtype=np.uint64), np.full((2, 1), 2, dtype=np.float32), None,
                    layout.gradients(), {(layout.name, 0): 5})
    deltas = buffer.deltas("t:0:00000000000000000000", 4, "tr", 7, 32)
    assert [piece.base for d in deltas for piece in d.dense] == [0, 5]  # each step at the version it saw
    assert [d.shard for d in deltas] == [0, 1, 2] and all(d.examples == 32 and d.seq == 4 for d in deltas)
    steps = sorted((int(i), float(g[0])) for d in deltas for part in d.sparse for i, g in zip(part.ids, part.values))
    assert steps == [(1, 1.0), (2, 1.0), (2, 2.0), (9, 2.0)]  # id 2 in both steps, not summed
    assert sum(len(d.dense) for d in deltas) == 2  # the bias once a step
    assert buffer.deltas("t:0:00000000000000000000", 5, "tr", 8, 0)[0].sparse == ()


@pytest.mark.parametrize("cls", [LogisticRegression, WideDeep, DeepFM])
def test_built_in_models_give_one_logit_per_example(cls) -> None:
    spec = ModelSpec(("a", "b", "c"), 2, 4)
    model = cls(spec)
    pooled = {name: torch.randn(5, 3, dim) for name, dim in model.tables.items()}
    assert model(pooled, torch.randn(5, 2)).shape == (5,)


def _mostly(valid, invalid):
    """Valid four times in five: a document is refused for one reason at a time."""
    return st.one_of(valid, valid, valid, valid, invalid)


_ids = _mostly(st.lists(st.integers(0, 2**64 - 1), max_size=3),
               st.lists(st.one_of(st.integers(-5, 2**65), st.booleans(), st.floats()), min_size=1, max_size=3))
_docs = st.fixed_dictionaries({
    "v": _mostly(st.just(1), st.sampled_from([2, 1.0, True, "1"])),
    "sparse": _mostly(st.dictionaries(st.sampled_from(["user", "ad", "other"]), _ids, max_size=3),
                      st.one_of(st.dictionaries(st.sampled_from(["", "x" * 256, "é" * 130]), _ids, min_size=1),
                                st.just([]))),
    "dense": _mostly(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=2),
                     st.lists(st.one_of(st.floats(width=64), st.integers(-2**70, 2**70), st.just(3.5e38)),
                              max_size=3)),
    "label": _mostly(st.floats(0, 1), st.sampled_from([-0.5, 1.5, True, None, float("nan"), 2**1100])),
    "ts": _mostly(st.integers(0, 2**63 - 1), st.sampled_from([-3, 2**63, 1.5])),
    "extra": st.integers(),
}).flatmap(lambda d: _mostly(st.just(set()), st.sets(st.sampled_from(sorted(d)), min_size=1, max_size=1)).map(
    lambda drop: {k: v for k, v in d.items() if k not in drop}))


@settings(max_examples=300, deadline=None)
@given(st.lists(_docs, min_size=1, max_size=8))
def test_chunk_decoder_verdicts_equal_one_by_one_verdicts(docs) -> None:
    assert_chunk_decodes_as_one_by_one(config().input, ("user", "ad"), [json.dumps(d).encode() for d in docs])


# Documents of the shape pyarrow's reader takes whole (every declared field, no other key),
# mostly: chunks of them go through the columnar reader, and any one record that does not fit
# sends its chunk back to the record-by-record path.
def _rarely(valid, invalid):
    """Valid 19 times in 20: a chunk of several documents still often fits as a whole."""
    return st.integers(0, 19).flatmap(lambda k: invalid if k == 7 else valid)


_whole_ids = _rarely(st.lists(st.integers(0, 2**64 - 1), max_size=3),
                     st.lists(st.one_of(st.integers(-5, 2**65), st.booleans(), st.floats()), min_size=1, max_size=3))
_whole_doc = st.fixed_dictionaries({
    "v": _rarely(st.just(1), st.sampled_from([2, 1.0, True])),
    "sparse": _rarely(st.fixed_dictionaries({"user": _whole_ids, "ad": _whole_ids}),
                      st.fixed_dictionaries({"user": _whole_ids}, optional={"ad": st.none(), "other": _whole_ids})),
    "dense": _rarely(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=2),
                     st.lists(st.one_of(st.floats(width=64), st.just(3.5e38)), max_size=3)),
    "label": _rarely(st.floats(0, 1), st.sampled_from([-0.5, 1.5, True, None])),
    "ts": _rarely(st.integers(0, 2**63 - 1), st.sampled_from([-3, 2**63, 1.5])),
})
_whole_docs = _rarely(_whole_doc, _whole_doc.map(lambda d: {**d, "extra": 1}))


@settings(max_examples=300, deadline=None)
@given(st.lists(_whole_docs, min_size=1, max_size=6), _rarely(st.just(b""), st.sampled_from([b" ", b"\n"])))
def test_whole_json_chunks_decode_as_one_by_one_does(docs, padding) -> None:
    """pyarrow's JSON reader decides speed only."""
    values = [json.dumps(d).encode() for d in docs]
    values[-1] += padding  # a trailing space, or a line break pyarrow would read as a row
    assert_chunk_decodes_as_one_by_one(config().input, ("user", "ad"), values)


def test_a_whole_json_chunk_is_decoded_by_columns(monkeypatch) -> None:
    decoder = ChunkDecoder(config().input, ("user", "ad"), 2)
    monkeypatch.setattr(decoder, "_fast", None)
    monkeypatch.setattr(decoder, "_one", lambda value: pytest.fail(f"{value!r} went one by one"))
    docs = [{"v": 1, "sparse": {"user": [i], "ad": [i, 2**64 - 1]}, "dense": [0.5, -i], "label": i % 2, "ts": i}
            for i in range(300)]
    decoded = decoder.decode([json.dumps(d).encode() for d in docs])
    assert len(decoded.columns) == 300 and not decoded.bad
    ids, counts = decoded.columns.sparse[1]
    assert ids[:4].tolist() == [0, 2**64 - 1, 1, 2**64 - 1] and counts[:2].tolist() == [2, 2]
    assert decoded.columns.dense[3].tolist() == [0.5, -3.0] and decoded.columns.event_time_ms[-1] == 299


def assert_chunk_decodes_as_one_by_one(section, fields: tuple[str, ...], values: list, dense: int = 2,
                                       registry=None) -> None:
    """The same records accepted, into the same columns, and the same refused for the same reasons."""
    decoder, one = ChunkDecoder(section, fields, dense, registry), make_decoder(section, registry)
    accepted, reasons = [], {}
    for i, value in enumerate(values):
        try:
            accepted.append(decoder.fit(one(value)))
        except DecodeError as exc:
            reasons[i] = str(exc)
    decoded = decoder.decode(values)
    assert dict(decoded.bad) == reasons
    want = Columns.gather(accepted, fields, dense)
    for (ids, counts), (want_ids, want_counts) in zip(decoded.columns.sparse, want.sparse):
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(counts, want_counts)
    for name in ("dense", "labels", "event_time_ms"):
        np.testing.assert_array_equal(getattr(decoded.columns, name), getattr(want, name), err_msg=name)


_CSV_SECTION = config(format='"csv"', csv_columns='["y:label", "user:sparse", "price:dense", "os:sparse", '
                                                    '"rate:dense", "ts:time"]').input
_numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                     st.integers(-10, 10**40).map(str),
                     st.sampled_from(["1_000", " 2.5", "2.5 ", "1e400", ".5", "5.", "+3", "0x10", "٣", "", "1e-50"]))
_sparse_cells = st.one_of(st.integers(0, 2**64 + 5).map(str),
                          st.lists(st.integers(0, 99).map(str) | st.sampled_from(["ios", "", " 7", "²", "٣"]),
                                   max_size=3).map("|".join))
_csv_lines = st.one_of(
    st.tuples(_numbers | st.sampled_from(["0", "1", "0.25"]), _sparse_cells, _numbers, _sparse_cells, _numbers,
              st.integers(-5, 2**64).map(str) | st.sampled_from(["1_0", " 9", "0x10", "+4"])).map(",".join),
    st.sampled_from(["", "1,2", "1,2,3,4,5,6,7", '1,"2,3",4,5,6,7', "1,2,\n3,4,5,6", "\r\n", "0,1,2,3,4,5\r\n"]),
).flatmap(lambda line: st.sampled_from([line.encode() + b"\n", line.encode()])) \
    | st.sampled_from([None, b"\xff\xfe,1,2,3,4,5", b"1,2,3,4,5,6\xff"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_csv_lines, min_size=1, max_size=12))
def test_csv_chunks_decode_as_one_by_one_does(values) -> None:
    """pyarrow's reader and casts decide speed only."""
    assert_chunk_decodes_as_one_by_one(_CSV_SECTION, ("user", "os", "absent"), values)


def test_a_clean_csv_chunk_is_decoded_without_the_one_record_decoder(monkeypatch) -> None:
    decoder = ChunkDecoder(_CSV_SECTION, ("user", "os"), 2)
    monkeypatch.setattr(decoder, "_one", lambda value: pytest.fail(f"{value!r} went one by one"))
    lines = [f"{i % 2},{i},0.5,{i * 7},-{i}.25,{1000 + i}".encode() for i in range(300)]
    decoded = decoder.decode([line + b"\n" if i % 2 else line for i, line in enumerate(lines)])
    assert len(decoded.columns) == 300 and not decoded.bad
    assert decoded.columns.sparse[1][0][:3].tolist() == [0, 7, 14]
    assert decoded.columns.dense[3].tolist() == [0.5, -3.25] and decoded.columns.event_time_ms[-1] == 1299


@pytest.mark.parametrize("first", [b"null", b"1", b"[]", b'"s"', b" {}"])
def test_a_json_chunk_that_starts_with_a_record_not_an_object_is_decoded_not_a_crash(first) -> None:
    """pyarrow 26's JSON reader kills the process on a block whose first record is `null`."""
    good = EXAMPLE.to_json()
    decoded = ChunkDecoder(config().input, ("user", "ad"), 2).decode([first, good, good])
    assert [i for i, _ in decoded.bad] == [0] and len(decoded.columns) == 2


def test_ignored_csv_columns_are_never_read_whatever_they_hold() -> None:
    section = config(format='"csv"', csv_columns='["id:ignore", "y:label", "user:sparse", "leak:ignore", '
                                                 '"price:dense"]').input
    example = make_decoder(section)(b'r-17,1,42,"x, y",2.5')
    assert example == Example({"user": (42,)}, (2.5,), 1.0, 0)
    lines = [b"r-1,0,5,,0.5", b'r-2,1,6,"not, a number",1.5\n', b"r-3,1,7,9e999,2.5", b"r-4,1,8,NaN,3.5"]
    decoded = ChunkDecoder(section, ("user",), 1).decode(lines)
    assert not decoded.bad and decoded.columns.labels.tolist() == [0, 1, 1, 1]
    assert_chunk_decodes_as_one_by_one(section, ("user",), lines, dense=1)


def test_quoted_csv_fields_may_hold_commas_and_decode_in_a_chunk_as_one_by_one() -> None:
    section = config(format='"csv"', csv_columns='["y:label", "user:sparse", "city:sparse", "price:dense"]').input
    example = make_decoder(section)(b'1,"42|43","New York, NY","2.5"')
    assert example.sparse["user"] == (42, 43) and example.dense == (2.5,)
    assert example.sparse["city"] == make_decoder(section)(b'1,1,"New York, NY",0').sparse["city"]
    lines = [b'1,"42|43","New York, NY","2.5"', b"0,7,Paris,1.5", b'1,8,"Rome",-1']
    assert_chunk_decodes_as_one_by_one(section, ("user", "city"), lines, dense=1)


def test_every_process_builds_the_same_initial_dense_values_without_touching_the_global_rng() -> None:
    from streamtrain.trainer.models import build_model

    job = JobConfig.from_toml('[job]\nname = "j"\n[input]\ntopics = ["t"]\n[model]\n'
                              'factory = "streamtrain.trainer.models:WideDeep"\nsparse_fields = ["a", "b"]\n'
                              'dense_features = 2')
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first, second = build_model(job), build_model(job)
    assert torch.rand(1) == before
    for (name, a), (_, b) in zip(first.named_parameters(), second.named_parameters()):
        assert torch.equal(a, b), name
    weight = first.deep[0].weight  # PyTorch's own initialisation, not a tiny constant scale
    assert 0.1 < weight.abs().max() <= 1 / weight.shape[1] ** 0.5


def test_dense_blocks_load_as_the_initial_value_plus_what_the_shards_trained() -> None:
    model = WideDeep(ModelSpec(("a",), 2, 4))
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    layout = DenseLayout(model)
    first = layout.blocks[0]
    assert (first.param, first.block, first.start) == (layout.name, 0, 0)
    trained = np.full(first.stop - first.start, 0.5, dtype=np.float32)
    layout.load({(layout.name, 0): trained})
    assert torch.allclose(model.deep[0].weight, initial["deep.0.weight"] + 0.5)  # the block's first values
    layout.load({})
    assert all(torch.equal(p, initial[name]) for name, p in model.named_parameters())


def test_an_estimate_of_a_group_given_up_leaves_the_model_at_the_next_load() -> None:
    """The same pulled bytes are not loaded twice, but an estimate added since (`add`) must
    not stay: a group given up (a task dropped) pushes none of it, so the next load writes the
    block again. Each estimated step counts in the block's base until then."""
    model = WideDeep(ModelSpec(("a",), 2, 4))
    layout = DenseLayout(model)
    key = (layout.name, 0)
    pulled = np.zeros(layout.blocks[0].stop, dtype=np.float32)
    layout.load({key: pulled}, {key: 7})
    before = model.deep[0].weight.detach().clone()
    layout.add({key: np.full_like(pulled, 0.25)})  # the estimate of a step never pushed
    assert torch.allclose(model.deep[0].weight, before + 0.25)
    assert layout.bases[key] == 8
    layout.load({key: pulled}, {key: 7})
    assert torch.equal(model.deep[0].weight, before)
    assert layout.bases[key] == 7


def test_cpu_parameters_are_the_layouts_values_and_still_train() -> None:
    """On the CPU the parameters are views of the layout's vector: what `load` and `add` write
    is in the model with no copy, and gradients reach each parameter as before."""
    model = WideDeep(ModelSpec(("a",), 2, 4))
    reference = copy.deepcopy(model)
    layout = DenseLayout(model)
    key = (layout.name, 0)
    change = np.linspace(-1, 1, layout.blocks[0].stop, dtype=np.float32)
    layout.add({key: change})
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(reference.parameters())
                                            + torch.from_numpy(change), reference.parameters())
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters()))
    pooled, dense = {"deep": torch.randn(3, 1, 4), "wide": torch.randn(3, 1, 1)}, torch.randn(3, 2)
    for m in (model, reference):
        m(pooled, dense).sum().backward()
    assert all(torch.allclose(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))


def test_dense_blocks_span_parameters_end_to_end() -> None:
    model = WideDeep(ModelSpec(tuple("abcdefgh"), 4, 8))  # 68 -> 64 -> 32 -> 1: 6,529 values
    names = [name for name, _ in model.named_parameters()]
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    layout = DenseLayout(model)
    assert [(b.block, b.start, b.stop) for b in layout.blocks] == [(0, 0, BLOCK), (1, BLOCK, 6529)]
    assert layout.name == DenseLayout(WideDeep(ModelSpec(tuple("abcdefgh"), 4, 8))).name  # in every process
    assert layout.name != DenseLayout(WideDeep(ModelSpec(tuple("abcdefgh"), 4, 16))).name  # other shapes
    # The second block holds the end of the first layer's weights and every parameter after them.
    layout.load({(layout.name, 1): np.ones(6529 - BLOCK, dtype=np.float32)})
    weight = model.deep[0].weight.detach().reshape(-1)
    assert torch.equal(weight[:BLOCK], initial["deep.0.weight"].reshape(-1)[:BLOCK])
    assert torch.allclose(weight[BLOCK:], initial["deep.0.weight"].reshape(-1)[BLOCK:] + 1)
    assert all(torch.allclose(p, initial[n] + 1) for n, p in model.named_parameters() if n != "deep.0.weight")
    layout.add({(layout.name, 0): np.full(BLOCK, 2, dtype=np.float32)})
    assert torch.allclose(model.deep[0].weight.detach().reshape(-1)[:BLOCK],
                          initial["deep.0.weight"].reshape(-1)[:BLOCK] + 2)
    for name, p in model.named_parameters():
        p.grad = torch.full_like(p, float(names.index(name)))
    grads = layout.gradients()
    assert [(param, block, len(values)) for param, block, values in grads] == [(layout.name, 0, BLOCK),
                                                                               (layout.name, 1, 6529 - BLOCK)]
    together = np.concatenate([values for _, _, values in grads])
    assert np.array_equal(together, np.concatenate([np.full(p.numel(), names.index(n), np.float32)
                                                    for n, p in model.named_parameters()]))


def test_a_dense_block_without_any_gradient_is_not_sent_and_a_missing_one_beside_others_is_zeros() -> None:
    model = WideDeep(ModelSpec(tuple("abcdefgh"), 4, 8))
    layout = DenseLayout(model)
    assert layout.gradients() == []
    model.deep[4].bias.grad = torch.ones(1)  # the last value of the second block only
    grads = layout.gradients()
    assert [(block, int(np.count_nonzero(values)), float(values[-1])) for _, block, values in grads] == [(1, 1, 1.0)]


def test_a_models_tables_are_stored_as_one_row_per_id_and_split_back() -> None:
    layout = RowLayout.of({"wide": 1, "deep": 3})
    assert (layout.name, layout.width, layout.columns) == ("deep+wide", 4, (("deep", 0, 3), ("wide", 3, 1)))
    assert RowLayout.of({"lr": 1}).name == "lr"  # one table keeps its name (and its keys in Redis)
    assert RowLayout.of({}).width == 0
    long = RowLayout.of({"t" * 200: 1, "u" * 200: 2})
    assert long.name.startswith("rows-") and long.width == 3
    rows = torch.arange(8.0).reshape(2, 4)
    parts = layout.split(rows)
    assert parts["deep"].tolist() == [[0, 1, 2], [4, 5, 6]] and parts["wide"].tolist() == [[3], [7]]
    # Pooling then splitting is splitting then pooling: sum pooling is per column.
    inverse, bags = torch.tensor([0, 1, 1]), torch.tensor([0, 1, 3])
    whole = layout.split(pool(rows, inverse, bags, 2, 2))
    assert torch.equal(whole["wide"], pool(rows[:, 3:], inverse, bags, 2, 2))

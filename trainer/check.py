"""What a job would make of a sample of its input: `streamtrain job check`.

A user points a job at a topic written for something else; before training, they want to see
the records decode as they expect. `check_records` decodes a sample exactly as a trainer would
(the same `ChunkDecoder`, the same checks) and summarises it: how many records are good, why
the others are bad and where they are, each sparse field's presence, ids per record and
distinct ids, the dense features, the label rate and the event times. Fields the records carry
that the model does not read are listed too, so a misspelt `model.sparse_fields` shows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from streamtrain.jobstate.offsets import Bounds
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.decoders import ChunkDecoder, DecodeError, make_decoder
from streamtrain.trainer.models import model_spec

# Records decoded one by one to find the fields the model does not read (the chunk decoder
# keeps only the model's).
_FIELD_SCAN = 1000


@dataclass(frozen=True)
class FieldSummary:
    name: str
    used: bool  # the model reads it (model.sparse_fields)
    present: float  # share of good records with at least one id in it
    ids_per_record: float
    distinct_ids: int


@dataclass(frozen=True)
class CheckReport:
    records: int
    good: int
    bad: tuple[tuple[str, str], ...]  # (where, reason), in sample order
    fields: tuple[FieldSummary, ...]
    dense_features: int
    dense_mean: tuple[float, ...]
    label_rate: float | None
    event_time_ms: tuple[int, int] | None  # (first, last) of the good records

    def as_dict(self) -> dict:
        return asdict(self)


def sample_ranges(bounds: dict[tuple[str, int], Bounds], records: int) -> dict[tuple[str, int], tuple[int, int]]:
    """The newest `records` records, shared out evenly over the partitions that hold any:
    [start, end) per partition. A partition with fewer gives the others its share."""
    sizes = {p: b.stable_end - b.earliest for p, b in sorted(bounds.items()) if b.stable_end > b.earliest}
    take = dict.fromkeys(sizes, 0)
    left = records
    while left > 0 and any(take[p] < sizes[p] for p in sizes):
        open_ = [p for p in sizes if take[p] < sizes[p]]
        share = max(left // len(open_), 1)
        for p in open_:
            more = min(share, sizes[p] - take[p], left)
            take[p] += more
            left -= more
    return {p: (bounds[p].stable_end - n, bounds[p].stable_end) for p, n in take.items() if n}


def check_records(config: JobConfig, sample: Sequence[tuple[str, bytes | None]]) -> CheckReport:
    """Decode `sample`, (where, value) pairs such as ("clicks:0@1234", b"..."), as the job's
    trainers would, and summarise what came out."""
    spec = model_spec(config)
    decoder = ChunkDecoder(config.input, spec.fields, spec.dense_features)
    decoded = decoder.decode([value for _, value in sample])
    columns, good = decoded.columns, len(decoded.columns)
    fields = [_field(name, True, ids, counts) for name, (ids, counts) in zip(spec.fields, columns.sparse)]
    fields += [FieldSummary(name, False, share, float("nan"), 0)
               for name, share in _unused_fields(config, decoder, sample).items()]
    times = columns.event_time_ms
    return CheckReport(
        records=len(sample), good=good,
        bad=tuple((sample[i][0], reason) for i, reason in decoded.bad),
        fields=tuple(fields),
        dense_features=spec.dense_features,
        dense_mean=tuple(float(x) for x in columns.dense.mean(axis=0)) if good else (),
        label_rate=float(columns.labels.mean()) if good else None,
        event_time_ms=(int(times.min()), int(times.max())) if good else None,
    )


def _field(name: str, used: bool, ids: np.ndarray, counts: np.ndarray) -> FieldSummary:
    n = max(len(counts), 1)
    return FieldSummary(name, used, float((counts > 0).sum() / n), float(counts.sum() / n),
                        int(len(np.unique(ids))))


def _unused_fields(config: JobConfig, decoder: ChunkDecoder, sample: Sequence[tuple[str, bytes | None]]
                   ) -> dict[str, float]:
    """Sparse fields the records carry that the model does not read, with the share of (up to
    `_FIELD_SCAN` of) the good records holding them; a CSV's declared sparse columns, share
    unknown (nan)."""
    if config.input.format == "csv":
        return {c.name: float("nan") for c in config.input.csv_columns
                if c.kind == "sparse" and c.name not in decoder.fields}
    seen: Counter[str]
    decode, seen, scanned = make_decoder(config.input), Counter(), 0
    for _, value in sample[:_FIELD_SCAN]:
        try:
            example = decoder.fit(decode(value))  # good as the trainers judge it
        except DecodeError:
            continue
        scanned += 1
        seen.update(k for k, ids in example.sparse.items() if ids and k not in decoder.fields)
    return {name: count / max(scanned, 1) for name, count in sorted(seen.items())}

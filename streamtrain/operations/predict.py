"""`streamtrain predict`: score records with the parameters a running job serves.

Records are read one per line in the job's `input.format` (for `binary`, `avro` and `protobuf`,
whose records may hold newline bytes, each line is the record base64-encoded); blank lines are skipped. Each record is
decoded with the trainer's own decoder (`trainer.decoders.make_decoder`) and scored by
`trainer.scoring.Scorer` against the job's config and slot map in etcd and its parameters in
Redis. One result per record, in input order: `{"line": n, "score": p}`, or
`{"line": n, "error": reason}` for a record that does not decode (the rest are still scored).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from streamtrain.infra import Endpoints
from streamtrain.schemas import StreamtrainError

BASE64_FORMATS = ("binary", "avro", "protobuf")  # records that are bytes, not text


class PredictError(StreamtrainError, RuntimeError):
    """The job cannot be scored at all (no config or slot map in etcd, parameters unavailable)."""


@dataclass(frozen=True)
class Result:
    line: int
    score: float | None = None
    error: str | None = None

    def as_dict(self) -> dict:
        return {"line": self.line, "score": self.score} if self.error is None else \
            {"line": self.line, "error": self.error}


class Predictor:
    """Decoder and scorer of one job, built from what its master stored in etcd."""

    def __init__(self, config, scorer, decoder) -> None:
        self.config = config
        self.scorer = scorer
        self.decode = decoder
        self.base64 = config.input.format in BASE64_FORMATS

    @classmethod
    def connect(cls, endpoints: Endpoints, job: str) -> tuple[Predictor, Any]:  # Any: a redis client
        """Returns the predictor and the Redis client it scores through (close it when done)."""
        from streamtrain.infra.clients import redis_client
        from streamtrain.jobstate.errors import CoordinationError
        from streamtrain.jobstate.etcd import Etcd
        from streamtrain.jobstate.membership import read_job_config
        from streamtrain.jobstate.sharding import SlotMap
        from streamtrain.schemas import EtcdKeys
        from streamtrain.schemas.config import JobConfigError

        etcd = Etcd.connect(endpoints)
        try:
            try:
                config = read_job_config(etcd, job)
            except (CoordinationError, JobConfigError) as exc:
                raise PredictError(str(exc)) from exc
            slots = etcd.get(EtcdKeys(job).slots)
            if slots is None:
                raise PredictError(f"job {job!r} has no slot map in etcd yet: start its master first")
            slot_map = SlotMap.from_json(slots.value)
        finally:
            etcd.close()
        from streamtrain.trainer.decoders import make_decoder
        from streamtrain.trainer.scoring import Scorer  # torch: imported once there is a job to score

        try:
            decoder = make_decoder(config.input)
        except ValueError as exc:
            raise PredictError(str(exc)) from exc
        client = redis_client(endpoints)
        return cls(config, Scorer(config, client, slot_map), decoder), client

    def predict(self, lines: Iterable[bytes], batch_size: int = 256) -> Iterator[Result]:
        """Results in input order; records are scored `batch_size` at a time (parameters are
        pulled fresh for every batch)."""
        batch: list[tuple[int, object]] = []  # (line number, Example or error string)
        for number, raw in enumerate(lines, start=1):
            value = raw.rstrip(b"\r\n")
            if not value.strip():
                continue
            batch.append((number, self._decode(value)))
            if len(batch) >= batch_size:
                yield from self._score(batch)
                batch = []
        if batch:
            yield from self._score(batch)

    def _decode(self, value: bytes):
        from streamtrain.trainer.decoders import DecodeError

        if self.base64:
            try:
                value = base64.b64decode(value.strip(), validate=True)
            except (binascii.Error, ValueError) as exc:
                return f"not base64 (binary records are read base64-encoded, one per line): {exc}"
        try:
            example = self.decode(value)
        except DecodeError as exc:
            return str(exc)
        want = self.scorer.featurizer.dense_features
        if len(example.dense) != want:
            return f"dense: {len(example.dense)} features, the model takes {want}"
        return example

    def _score(self, batch: list[tuple[int, object]]) -> Iterator[Result]:
        from streamtrain.params.paramstore import ParamsUnavailableError

        examples = [item for _, item in batch if not isinstance(item, str)]
        try:
            try:
                scores = iter(self.scorer.score(examples).tolist()) if examples else iter(())
            except (ValueError, TypeError, IndexError):
                if len(batch) == 1:
                    raise
                # One record the decoder accepted but the model cannot take: find it, score the rest.
                for one in batch:
                    yield from self._score([one])
                return
        except ParamsUnavailableError as exc:
            raise PredictError(f"job {self.config.name!r}: parameters unavailable in Redis ({exc}); "
                               "are its pserver shards running?") from exc
        except (ValueError, TypeError, IndexError) as exc:
            yield Result(batch[0][0], error=f"cannot score: {exc}")
            return
        for number, item in batch:
            if isinstance(item, str):
                yield Result(number, error=item)
            else:
                yield Result(number, score=float(next(scores)))

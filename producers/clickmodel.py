"""A known generating model for a synthetic click log, deterministic by seed.

An impression has one id in each sparse field (user, ad, site, device; Zipf-like popularity) and
a few dense features. Its click probability is

    p = sigmoid(bias + sum_f w_f[id_f] + dense . v)

so logistic regression over hashed (field, id) features plus the dense features is exactly the
right model, and the AUC of the true probabilities (`best_auc`) is the ceiling any trainer can
reach. Defaults give a best AUC of 0.79-0.84 and a base CTR of 16-18% over seeds 0-9 (0.790 and
15.5% for the default seed 7).

With `interaction = (a, b)` the logit also has a low-rank pairwise term `u_a[id_a] . v_b[id_b]`
(latent vectors of `interaction_rank` values per id): a factorisation machine or an MLP over
embeddings can learn it, logistic regression cannot, so deep models matter.
`ClickModelConfig.production()` is the workload the end-to-end bench trains on: 8 fields with
vocabularies from 10^3 to 10^6, 4 dense features, one interaction and drift.

Impression `i` is a pure function of (seed, i): every random draw comes from a counter-based
hash of (seed, i, stream), so any slice of the log can be regenerated without the rest.

Concept drift: with `drift_every = k > 0`, impressions `[e*k, (e+1)*k)` use the weights of
epoch `e`; going from epoch `e-1` to `e`, each sparse weight is redrawn with probability
`drift_fraction` (from the same prior), and the bias and dense weights stay. Drift is counted in
impressions, not seconds, so it stays a pure function of the index; at a paced rate `r` per
second it happens every `k / r` seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from streamtrain import schemas

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# Streams of the counter-based hash: one independent uniform per draw of an impression.
_STREAMS = 16
_S_FIELD = 0  # 0..7: one per sparse field
_S_DENSE = 8  # 8..11: two Box-Muller pairs
_S_CLICK = 12
_S_DELAY = 13  # 13, 14: one Box-Muller pair


@dataclass(frozen=True)
class SparseField:
    name: str
    cardinality: int
    zipf: float  # popularity of rank k is proportional to (k + 1) ** -zipf
    weight_std: float  # prior of the per-id weights


DEFAULT_FIELDS = (
    SparseField("user", 2000, 1.05, 0.9),
    SparseField("ad", 300, 1.1, 0.9),
    SparseField("site", 50, 1.2, 0.5),
    SparseField("device", 4, 1.5, 0.3),
)

PRODUCTION_FIELDS = (
    SparseField("user", 1_000_000, 1.05, 0.5),
    SparseField("item", 300_000, 1.05, 0.5),
    SparseField("query", 100_000, 1.1, 0.4),
    SparseField("ad", 30_000, 1.1, 0.6),
    SparseField("site", 10_000, 1.15, 0.5),
    SparseField("region", 3_000, 1.2, 0.3),
    SparseField("category", 1_000, 1.2, 0.4),
    SparseField("device", 1_000, 1.5, 0.3),
)


@dataclass(frozen=True)
class ClickModelConfig:
    seed: int = 7
    fields: tuple[SparseField, ...] = DEFAULT_FIELDS
    dense_weights: tuple[float, ...] = (0.5, -0.35)
    bias: float = -2.15
    drift_every: int = 0  # impressions per drift epoch; 0 = no drift
    drift_fraction: float = 0.2  # share of sparse weights redrawn at each epoch boundary
    # Delay of a click after its impression: log-normal, median `click_delay_median_ms`.
    click_delay_median_ms: float = 3000.0
    click_delay_sigma: float = 1.0
    origin_ms: int = 1_700_000_000_000  # event time of impression 0 when none is given
    interaction: tuple[str, str] | None = None  # two fields whose ids interact, or None
    interaction_std: float = 0.0  # standard deviation of the interaction term
    interaction_rank: int = 4

    @classmethod
    def production(cls, seed: int = 7, drift_every: int = 250_000, vocab_scale: int = 1) -> ClickModelConfig:
        """Like production CTR logs: 8 fields (vocabularies 10^3 to 10^6, Zipf ids), 4 dense
        features, an ad x site interaction, drift every `drift_every` impressions. Base CTR
        about 0.26. `vocab_scale` multiplies every vocabulary: the same shape with more
        distinct ids, for a shard of a million rows from a few million records (12M records
        at scale 1 give two shards about 500k rows each; 4M at scale 10, about 1M)."""
        if vocab_scale < 1:
            raise ValueError(f"vocab_scale must be >= 1, got {vocab_scale}")
        fields = tuple(replace(f, cardinality=f.cardinality * vocab_scale) for f in PRODUCTION_FIELDS)
        return cls(seed=seed, fields=fields, dense_weights=(0.5, -0.35, 0.25, -0.2), bias=-1.55,
                   drift_every=drift_every, drift_fraction=0.1, interaction=("ad", "site"),
                   interaction_std=1.0)

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2^63), got {self.seed}")
        if not self.fields or len(self.fields) > _S_DENSE:
            raise ValueError(f"fields: between 1 and {_S_DENSE} sparse fields, got {len(self.fields)}")
        if len(self.dense_weights) > 4:
            raise ValueError(f"dense_weights: at most 4 dense features, got {len(self.dense_weights)}")
        if self.drift_every < 0:
            raise ValueError(f"drift_every must be >= 0 (0 = no drift), got {self.drift_every}")
        if not 0.0 <= self.drift_fraction <= 1.0:
            raise ValueError(f"drift_fraction must be in [0, 1], got {self.drift_fraction}")
        if self.click_delay_median_ms <= 0 or self.click_delay_sigma < 0:
            raise ValueError("click delay: median must be > 0 and sigma >= 0")
        names = [f.name for f in self.fields]
        if self.interaction is not None and (len(self.interaction) != 2 or len(set(self.interaction)) != 2
                                             or not set(self.interaction) <= set(names)):
            raise ValueError(f"interaction: two different fields of {names}, got {self.interaction!r}")
        if self.interaction_std < 0 or self.interaction_rank < 1:
            raise ValueError("interaction: std must be >= 0 and rank >= 1")


@dataclass(frozen=True)
class Impression:
    """One ad shown, with what the model decided about it (the truth a log never records)."""

    index: int
    impression_id: str
    event_time_ms: int
    sparse: dict[str, int]
    dense: tuple[float, ...]
    probability: float
    clicked: bool
    click_delay_ms: int | None  # None when not clicked


@dataclass
class ImpressionColumns:
    """Columns of n consecutive impressions."""

    index: np.ndarray  # int64
    ids: dict[str, np.ndarray]  # field -> int64 ids
    dense: np.ndarray  # float32, shape (n, dense_features)
    probability: np.ndarray  # float64
    clicked: np.ndarray  # bool
    delay_ms: np.ndarray  # int64, meaningful where clicked


class ClickModel:
    """Generates impressions, clicks and labelled examples from a fixed, known model."""

    def __init__(self, config: ClickModelConfig = ClickModelConfig()) -> None:
        self.config = config
        self.fields: tuple[str, ...] = tuple(f.name for f in config.fields)
        self.dense_features: int = len(config.dense_weights)
        self._cdf = [_zipf_cdf(f.cardinality, f.zipf) for f in config.fields]
        self._dense_w = np.asarray(config.dense_weights, dtype=np.float64)
        self._key = _splitmix(np.array([config.seed], dtype=np.uint64))[0]
        self._weights: dict[int, list[np.ndarray]] = {0: self._draw_weights()}
        self._latent = self._draw_latent()

    # -- public surface -------------------------------------------------------------------

    def impressions(self, n: int, start: int = 0, event_time_ms: int | None = None) -> list[Impression]:
        """Impressions `start .. start+n-1`. Event time is `event_time_ms` for all of them when
        given, else `origin_ms + index` (one per millisecond)."""
        b = self._batch(n, start)
        times = self._times(b, event_time_ms)
        seed = self.config.seed
        cols = [b.ids[name].tolist() for name in self.fields]
        dense = b.dense.tolist()
        return [
            Impression(
                index=i,
                impression_id=f"imp-{seed}-{i}",
                event_time_ms=t,
                sparse=dict(zip(self.fields, (c[k] for c in cols))),
                dense=tuple(dense[k]),
                probability=p,
                clicked=c,
                click_delay_ms=d if c else None,
            )
            for k, (i, t, p, c, d) in enumerate(zip(
                b.index.tolist(), times, b.probability.tolist(), b.clicked.tolist(), b.delay_ms.tolist()))
        ]

    def examples(self, n: int, start: int = 0, event_time_ms: int | None = None) -> list[schemas.Example]:
        """Labelled examples: label 1.0 where the impression was clicked (at any delay), else 0.0."""
        b = self._batch(n, start)
        times = self._times(b, event_time_ms)
        cols = [b.ids[name].tolist() for name in self.fields]
        dense = b.dense.tolist()
        labels = b.clicked.astype(np.float64).tolist()
        return [
            schemas.Example({name: (c[k],) for name, c in zip(self.fields, cols)}, tuple(dense[k]), labels[k], times[k])
            for k in range(n)
        ]

    def columns(self, n: int, start: int = 0) -> ImpressionColumns:
        """Impressions `start .. start+n-1` column-wise, for writing a large log quickly (event
        time `origin_ms + index`, label `clicked`)."""
        return self._batch(n, start)

    def probabilities(self, examples: Sequence[schemas.Example], start: int = 0) -> np.ndarray:
        """True click probabilities of examples, the k-th under the weights in force at index
        `start + k` (which only matters with drift)."""
        n = len(examples)
        ids = {
            name: np.fromiter((_one_id(e.sparse[name]) for e in examples), dtype=np.int64, count=n)
            for name in self.fields
        }
        dense = np.array([e.dense for e in examples], dtype=np.float64).reshape(n, self.dense_features)
        return self._probability(np.arange(start, start + n, dtype=np.int64), ids, dense)

    def best_auc(self, n: int = 50_000, start: int = 0) -> float:
        """AUC of the true probabilities against the drawn labels: what a perfect model scores."""
        b = self._batch(n, start)
        return auc(b.clicked, b.probability)

    def weights(self, epoch: int = 0) -> dict[str, np.ndarray]:
        """Sparse weights per field in force during drift epoch `epoch` (read-only copies)."""
        return {name: w.copy() for name, w in zip(self.fields, self._epoch_weights(epoch))}

    def epoch_of(self, index: int) -> int:
        return index // self.config.drift_every if self.config.drift_every else 0

    # -- generation -----------------------------------------------------------------------

    def _batch(self, n: int, start: int) -> ImpressionColumns:
        if n < 0 or start < 0:
            raise ValueError(f"n and start must be >= 0, got n={n} start={start}")
        index = np.arange(start, start + n, dtype=np.int64)
        ids = {
            f.name: np.searchsorted(cdf, self._uniform(index, _S_FIELD + j), side="right").astype(np.int64)
            for j, (f, cdf) in enumerate(zip(self.config.fields, self._cdf))
        }
        normals = np.concatenate(
            [_box_muller(self._uniform(index, _S_DENSE + 2 * k), self._uniform(index, _S_DENSE + 2 * k + 1))
             for k in range(2)], axis=0)
        dense = normals[: self.dense_features].T.astype(np.float32)
        probability = self._probability(index, ids, dense.astype(np.float64))
        clicked = self._uniform(index, _S_CLICK) < probability
        z = _box_muller(self._uniform(index, _S_DELAY), self._uniform(index, _S_DELAY + 1))[0]
        delay = np.exp(np.log(self.config.click_delay_median_ms) + self.config.click_delay_sigma * z)
        return ImpressionColumns(index, ids, dense, probability, clicked, np.maximum(delay, 1.0).astype(np.int64))

    def _probability(self, index: np.ndarray, ids: dict[str, np.ndarray], dense: np.ndarray) -> np.ndarray:
        logit = np.full(len(index), self.config.bias, dtype=np.float64)
        logit += dense @ self._dense_w
        epochs = index // self.config.drift_every if self.config.drift_every else np.zeros_like(index)
        for epoch in np.unique(epochs).tolist():
            rows = epochs == epoch
            for name, w in zip(self.fields, self._epoch_weights(epoch)):
                logit[rows] += w[ids[name][rows]]
        if self._latent is not None:
            (a, u), (b, v) = self._latent
            logit += np.einsum("ij,ij->i", u[ids[a]], v[ids[b]])
        return 1.0 / (1.0 + np.exp(-logit))

    def _times(self, b: ImpressionColumns, event_time_ms: int | None) -> list[int]:
        if event_time_ms is not None:
            return [int(event_time_ms)] * len(b.index)
        return (b.index + self.config.origin_ms).tolist()

    def _uniform(self, index: np.ndarray, stream: int) -> np.ndarray:
        """A uniform in [0, 1) per index: a hash of (seed, index, stream)."""
        counter = index.astype(np.uint64) * np.uint64(_STREAMS) + np.uint64(stream)
        h = _splitmix(counter ^ self._key)
        return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)

    def _draw_weights(self) -> list[np.ndarray]:
        rng = np.random.default_rng([self.config.seed, 0])
        return [self._centred(rng.normal(0.0, f.weight_std, f.cardinality), j)
                for j, f in enumerate(self.config.fields)]

    def _draw_latent(self) -> tuple[tuple[str, np.ndarray], tuple[str, np.ndarray]] | None:
        """The interaction's latent vectors per id of its two fields (fixed across drift).
        The product of two N(0, s^2/sqrt(k)) vectors of k values has standard deviation s."""
        c = self.config
        if c.interaction is None or c.interaction_std == 0:
            return None
        rng = np.random.default_rng([c.seed, 2**32])
        scale = np.sqrt(c.interaction_std) / c.interaction_rank ** 0.25
        cardinality = {f.name: f.cardinality for f in c.fields}
        a, b = c.interaction
        return ((a, rng.normal(0.0, scale, (cardinality[a], c.interaction_rank))),
                (b, rng.normal(0.0, scale, (cardinality[b], c.interaction_rank))))

    def _centred(self, w: np.ndarray, j: int) -> np.ndarray:
        # Zero popularity-weighted mean per field: the few heavy ids of a Zipf field would
        # otherwise swing the base CTR from seed to seed (and from drift epoch to epoch).
        popularity = np.diff(np.r_[0.0, self._cdf[j], 1.0])
        return w - popularity @ w

    def _epoch_weights(self, epoch: int) -> list[np.ndarray]:
        # Epoch e is epoch e-1 with a random share redrawn; walk forward from the nearest known.
        if epoch in self._weights:
            return self._weights[epoch]
        known = max(e for e in self._weights if e < epoch)
        current = self._weights[known]
        for e in range(known + 1, epoch + 1):
            rng = np.random.default_rng([self.config.seed, e])
            nxt = []
            for j, (f, w) in enumerate(zip(self.config.fields, current)):
                redraw = rng.random(f.cardinality) < self.config.drift_fraction
                fresh = rng.normal(0.0, f.weight_std, f.cardinality)
                nxt.append(self._centred(np.where(redraw, fresh, w), j))
            current = nxt
            self._weights[e] = current
        return current


def auc(labels: Sequence[float] | np.ndarray, scores: Sequence[float] | np.ndarray) -> float:
    """Area under the ROC curve by ranks (Mann-Whitney U); tied scores share their mean rank.

    Raises:
        ValueError: lengths differ, or the labels are all of one class (AUC is undefined).
    """
    y = np.asarray(labels, dtype=np.float64) > 0.5
    s = np.asarray(scores, dtype=np.float64)
    if y.shape != s.shape:
        raise ValueError(f"auc: {y.size} labels but {s.size} scores")
    positives = int(y.sum())
    negatives = y.size - positives
    if positives == 0 or negatives == 0:
        raise ValueError(f"auc: needs both classes, got {positives} positives and {negatives} negatives")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    # Mean 1-based rank of each run of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], s.size]
    run_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(s.size, dtype=np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return float((ranks[y].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


def _splitmix(x: np.ndarray) -> np.ndarray:
    # splitmix64's finaliser: a bijection on u64 with full avalanche; uint64 arithmetic wraps.
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _box_muller(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    radius = np.sqrt(-2.0 * np.log1p(-u1))  # 1 - u1 is in (0, 1]: log is finite
    angle = 2.0 * np.pi * u2
    return np.stack([radius * np.cos(angle), radius * np.sin(angle)])


def _zipf_cdf(cardinality: int, exponent: float) -> np.ndarray:
    weights = np.arange(1, cardinality + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights / weights.sum())
    return cdf[:-1]  # searchsorted over the inner edges gives ids 0..cardinality-1


def _one_id(ids: tuple[int, ...]) -> int:
    if len(ids) != 1:
        raise ValueError(f"expected one id per sparse field, got {len(ids)}")
    return ids[0]

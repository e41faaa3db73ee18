"""Built-in models over hashed sparse fields plus dense features, and the interface a user's
model implements.

The embedding tables live on the pservers, not in the module: a model declares them in
`tables` ({name: row width}) and its `forward` receives, per table, the rows of the batch
pooled (summed) per (example, field): a tensor of shape (batch, fields, width). Everything
else the module holds as `nn.Parameter`s is *dense*: the trainer splits it into blocks that
the pservers own and serve like rows. A user's factory ("module:callable" in `model.factory`)
takes a `ModelSpec` and returns such a module.

`build_model` builds the job's model as every process does (trainers, `predict`, `job check`):
from its config's `ModelSpec`, under one seed, so its dense parameters start from the same
values everywhere.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from streamtrain.schemas.config import JobConfig


@dataclass(frozen=True)
class ModelSpec:
    fields: tuple[str, ...]
    dense_features: int
    embedding_dim: int


class SparseModel(nn.Module):
    """Base of the built-ins: `tables` plus forward(pooled, dense) -> logits of shape (batch,)."""

    tables: dict[str, int]

    def forward(self, pooled: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class LogisticRegression(SparseModel):
    """One weight per hashed feature (a width-1 table) plus a linear term on dense features."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tables = {"lr": 1}
        self.dense = nn.Linear(spec.dense_features, 1) if spec.dense_features else None
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, pooled: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        logit = pooled["lr"].sum(dim=(1, 2)) + self.bias
        if self.dense is not None:
            logit = logit + self.dense(dense).squeeze(1)
        return logit


def _mlp(width: int, hidden: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


class WideDeep(SparseModel):
    """Wide: logistic regression over the hashed features. Deep: an MLP over the fields'
    embeddings and the dense features (Cheng et al., 2016)."""

    def __init__(self, spec: ModelSpec, hidden: tuple[int, ...] = (64, 32)) -> None:
        super().__init__()
        self.tables = {"wide": 1, "deep": spec.embedding_dim}
        self.deep = _mlp(len(spec.fields) * spec.embedding_dim + spec.dense_features, hidden)

    def forward(self, pooled: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        wide = pooled["wide"].sum(dim=(1, 2))
        deep_in = torch.cat([pooled["deep"].flatten(1), dense], dim=1)
        return wide + self.deep(deep_in).squeeze(1)


class DeepFM(SparseModel):
    """First-order weights, factorisation-machine pairwise interactions of the fields'
    embeddings, and an MLP over the same embeddings (Guo et al., 2017)."""

    def __init__(self, spec: ModelSpec, hidden: tuple[int, ...] = (64, 32)) -> None:
        super().__init__()
        self.tables = {"fm1": 1, "fm2": spec.embedding_dim}
        self.deep = _mlp(len(spec.fields) * spec.embedding_dim + spec.dense_features, hidden)

    def forward(self, pooled: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        first = pooled["fm1"].sum(dim=(1, 2))
        v = pooled["fm2"]  # (batch, fields, dim)
        pairwise = 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1)
        deep = self.deep(torch.cat([v.flatten(1), dense], dim=1)).squeeze(1)
        return first + pairwise + deep


# --------------------------------------------------------------------- the job's model, built


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# Every process builds the job's model under this seed, so its dense parameters start from the
# same values everywhere (trainer/params.py: the shards store only what training adds). The
# seed is torch's global one: two builds at once in one process (trainers in threads) would
# draw from it in turn and differ, hence the lock.
MODEL_SEED = 0
_BUILDING = threading.Lock()


def build_model(config: JobConfig) -> SparseModel:
    """The job's model. Typed as `SparseModel`, whose interface (`tables`, `forward(pooled,
    dense)`) a user's module implements (the module doc), whether or not it subclasses it."""
    module_name, _, attr = config.model.factory.partition(":")
    found: object = importlib.import_module(module_name)
    for part in attr.split("."):
        found = getattr(found, part)
    # `model.factory` names a callable taking a ModelSpec and returning such a module.
    factory = cast("Callable[[ModelSpec], SparseModel]", found)
    with _BUILDING, torch.random.fork_rng(devices=[]):
        torch.manual_seed(MODEL_SEED)
        return factory(model_spec(config))


def use_torch_threads(config: JobConfig) -> None:
    """`train.torch_threads` (process-wide: torch has one intra-op pool per process)."""
    if config.train.torch_threads:
        torch.set_num_threads(config.train.torch_threads)


def model_spec(config: JobConfig) -> ModelSpec:
    declared = config.input.fields
    fields = config.model.sparse_fields or tuple(
        c.name for c in config.input.csv_columns if c.kind == "sparse") or (
        tuple(name for name, _ in declared.sparse) if declared else ())
    dense = config.model.dense_features or sum(1 for c in config.input.csv_columns if c.kind == "dense") or (
        len(declared.dense) if declared else 0)
    return ModelSpec(fields, dense, config.model.embedding_dim)

"""Built-in models over hashed sparse fields plus dense features, and the interface a user's
model implements.

The embedding tables live on the pservers, not in the module: a model declares them in
`tables` ({name: row width}) and its `forward` receives, per table, the rows of the batch
pooled (summed) per (example, field): a tensor of shape (batch, fields, width). Everything
else the module holds as `nn.Parameter`s is *dense*: the trainer splits it into blocks that
the pservers own and serve like rows. A user's factory ("module:callable" in `model.factory`)
takes a `ModelSpec` and returns such a module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


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

"""What asynchrony costs a deep CTR model, by simulation: trainers take turns stepping one set of
parameters, each computing its gradient on those parameters minus the updates it cannot see yet.

    python -m bench.staleness [--records 400000] [--trainers 2] [--commit-every 16] [--lag 2]
                              [--own-visible | --own-lag K [--own-rows hidden|lr|table]]
                              [--init model|small] [--sync] [--seed 0]
                              [--stale all|dense|rows] [--damp none|dense|rows|both]
                              [--dense-lr 1.0] [--dense-avg 1] [--beta1 0.9]

No services: one process, the production workload of `bench.e2e` (8 fields, Zipf ids, an
interaction, drift), a WideDeep-shaped model (sparse tables under SparseAdam, an MLP under
Adam, lr 0.01, batch 512). Trainer k takes global steps k, k + T, k + 2T, ... An update
becomes visible to the other trainers `lag` global steps after the commit that carries it, and a
trainer commits every `--commit-every` of its own steps (16 is one task of 8,192 records).
With `--own-visible` a trainer always sees its own updates exactly; with `--own-lag K` its own
updates become visible K global steps after their commit, and until then it sees them as
trainer/own.py estimates them: the dense change from Adam with this trainer's own moments, and
for rows (`--own-rows`) nothing (`hidden`, what the trainer does), or a fresh-state Adam step
at t = 1 (`lr`: lr a coordinate) or at the table's step (`table`: about 3 lr). With `--sync`
every update is seen at once (the sequential loop, the ceiling). `--init small` starts the
dense layers at uniform +-0.01 instead of PyTorch's own initialisation. `--seed` seeds the
initialisation.

What staleness costs, and what might make it cost less: `--stale dense` (or `rows`) hides only
the dense layers' (or only the rows') updates; `--damp` scales a step by 1 / (1 + the updates
hidden from it), the pservers' `train.damp_stale` for the dense layers (pserver/state.py), per
row for the rows; `--dense-lr` scales the dense layers' learning rate; `--dense-avg k` steps
them once every k steps with the mean gradient (a batch k times larger); `--beta1` is Adam's
for both optimizers. Prints JSON: the holdout AUC, the mean prediction and the observed CTR.

Each update's change to the parameters is kept while some trainer cannot see it, and
subtracted from the parameters that trainer computes on: exact for the rows of the batch and
for the dense layers, so the only difference between settings is what each step sees.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from streamtrain.producers.clickmodel import ClickModel, ClickModelConfig, auc

BUCKETS = 1 << 20
DIM = 8
BATCH = 512
LR = 0.01


@dataclass(frozen=True)
class Remedy:
    """What is hidden and how each step is taken (see the module's docstring)."""

    seed: int = 0
    stale: str = "all"  # all, dense, rows
    damp: str = "none"  # none, dense, rows, both
    dense_lr: float = 1.0
    dense_avg: int = 1
    beta1: float = 0.9


@dataclass(frozen=True)
class Update:
    step: int
    trainer: int
    rows: np.ndarray  # the distinct rows it changed
    first: torch.Tensor  # their change in the width-1 table
    second: torch.Tensor  # ... and in the embedding table
    dense: list[torch.Tensor]  # the change of each dense parameter
    estimate: tuple[torch.Tensor | None, torch.Tensor | None, list[torch.Tensor]]  # as its trainer sees it


class Visibility:
    def __init__(self, trainers: int, commit_every: int, lag: int, own_visible: bool, sync: bool,
                 own_lag: int | None = None) -> None:
        self.trainers, self.commit_every, self.lag = trainers, commit_every, lag
        self.own_visible, self.sync = own_visible, sync
        self.own_lag = lag if own_lag is None else own_lag
        self.estimated = own_lag is not None  # own updates not yet visible are seen as estimated

    def seen(self, update: Update, trainer: int, step: int) -> bool:
        """Whether `trainer`, computing at global `step`, sees `update`."""
        if self.sync or (self.own_visible and update.trainer == trainer):
            return True
        own = update.step // self.trainers  # the owner's own step number
        committed_at = (own // self.commit_every + 1) * self.commit_every * self.trainers + update.trainer
        return step >= committed_at + (self.own_lag if update.trainer == trainer else self.lag)


def fresh_adam(grad: torch.Tensor, t: int) -> torch.Tensor:
    """Adam's step from a zero state at step t (lr per coordinate at t = 1, about 3 lr late on)."""
    return -LR / (1 - 0.9 ** t) * 0.1 * grad / ((0.001 * grad * grad).sqrt() / (1 - 0.999 ** t) ** 0.5 + 1e-8)


class DenseEstimate:
    """One trainer's estimate of its dense updates: Adam on its own gradients only."""

    def __init__(self, params) -> None:
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        self.t += 1
        out = []
        for g, m, v in zip(grads, self.m, self.v):
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            out.append(-LR / (1 - 0.9 ** self.t) * m / ((v / (1 - 0.999 ** self.t)).sqrt() + 1e-8))
        return out


def hashed(model: ClickModel, columns) -> np.ndarray:
    return np.stack([(columns.ids[f] * 1_000_003 + j * 7_919_993) % BUCKETS for j, f in enumerate(model.fields)], 1)


def mlp(width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))


def simulate(records: int, holdout: int, visibility: Visibility, init: str, own_rows: str = "hidden",
             remedy: Remedy = Remedy()) -> dict:
    torch.set_num_threads(1)
    model = ClickModel(ClickModelConfig.production())
    train, test = model.columns(records), model.columns(holdout, start=records)
    fields = len(model.fields)
    torch.manual_seed(remedy.seed)
    dense = mlp(fields * DIM + model.dense_features)
    if init == "small":
        with torch.no_grad():
            for p in dense.parameters():
                p.uniform_(-0.01, 0.01)
    first = nn.Parameter(torch.empty(BUCKETS, 1).uniform_(-0.01, 0.01))
    second = nn.Parameter(torch.empty(BUCKETS, DIM).uniform_(-0.01, 0.01))
    betas = (remedy.beta1, 0.999)
    dense_opt = torch.optim.Adam(dense.parameters(), lr=LR * remedy.dense_lr, betas=betas)
    sparse_opt = torch.optim.SparseAdam([first, second], lr=LR, betas=betas)
    summed = [torch.zeros_like(p) for p in dense.parameters()]  # gradients of --dense-avg steps
    view = mlp(fields * DIM + model.dense_features)  # the dense layers as one trainer sees them
    idx_all, x_all = hashed(model, train), torch.from_numpy(train.dense)
    y_all = torch.from_numpy(train.clicked.astype(np.float32))
    pending: list[Update] = []  # updates some trainer cannot see yet
    estimates = [DenseEstimate(list(dense.parameters())) for _ in range(visibility.trainers)]
    for step in range((records + BATCH - 1) // BATCH):
        trainer = step % visibility.trainers
        batch = slice(step * BATCH, (step + 1) * BATCH)
        rows, inverse = np.unique(idx_all[batch], return_inverse=True)
        pending = [u for u in pending if not all(visibility.seen(u, t, step) for t in range(visibility.trainers))]
        hidden = [u for u in pending if not visibility.seen(u, trainer, step)]
        rows_t = torch.from_numpy(rows)
        with torch.no_grad():
            r1, r2 = first[rows_t].clone(), second[rows_t].clone()
            for mine, shared in zip(view.parameters(), dense.parameters()):
                mine.copy_(shared)
            for u in hidden:
                at = np.minimum(np.searchsorted(u.rows, rows), len(u.rows) - 1)
                hit = torch.from_numpy(u.rows[at] == rows)
                at_t = torch.from_numpy(at)[hit]
                # What the trainer sees of an update it does not see yet: nothing, or, for its
                # own, its estimate.
                mine_estimated = u.trainer == trainer and visibility.estimated
                est_first, est_second, est_dense = u.estimate if mine_estimated else (None, None, None)
                if remedy.stale != "dense":
                    r1[hit] -= u.first[at_t] - (0 if est_first is None else est_first[at_t])
                    r2[hit] -= u.second[at_t] - (0 if est_second is None else est_second[at_t])
                if remedy.stale != "rows":
                    for i, (mine, change) in enumerate(zip(view.parameters(), u.dense)):
                        mine -= change if est_dense is None else change - est_dense[i]
        r1.requires_grad_(True)
        r2.requires_grad_(True)
        inv = torch.from_numpy(inverse.reshape(-1, fields).astype(np.int64))
        logit = r1[inv].sum((1, 2)) + view(torch.cat([r2[inv].flatten(1), x_all[batch]], 1)).squeeze(1)
        view.zero_grad()
        F.binary_cross_entropy_with_logits(logit, y_all[batch]).backward()
        before = (first.data[rows_t].clone(), second.data[rows_t].clone(),
                  [p.detach().clone() for p in dense.parameters()])
        first.grad = torch.sparse_coo_tensor(rows_t[None], r1.grad, first.shape)
        second.grad = torch.sparse_coo_tensor(rows_t[None], r2.grad, second.shape)
        for total, mine in zip(summed, view.parameters()):
            total += mine.grad
        if remedy.damp in ("dense", "both"):
            for group in dense_opt.param_groups:
                group["lr"] = LR * remedy.dense_lr / (1 + len(hidden))
        if (step + 1) % remedy.dense_avg == 0:
            for shared, total in zip(dense.parameters(), summed):
                shared.grad = total / remedy.dense_avg
                total.zero_()
            dense_opt.step()
        sparse_opt.step()
        if remedy.damp in ("rows", "both"):
            with torch.no_grad():
                missed = torch.zeros(len(rows))
                for u in hidden:
                    at = np.minimum(np.searchsorted(u.rows, rows), len(u.rows) - 1)
                    missed += torch.from_numpy((u.rows[at] == rows).astype(np.float32))
                share = (1 / (1 + missed))[:, None]
                first.data[rows_t] = before[0] + (first.data[rows_t] - before[0]) * share
                second.data[rows_t] = before[1] + (second.data[rows_t] - before[1]) * share
        with torch.no_grad():
            t = {"hidden": None, "lr": 1, "table": step + 1}[own_rows]
            estimate = (None if t is None else fresh_adam(r1.grad, t), None if t is None else fresh_adam(r2.grad, t),
                        estimates[trainer].step([mine.grad for mine in view.parameters()]))
            pending.append(Update(step, trainer, rows, first.data[rows_t] - before[0], second.data[rows_t] - before[1],
                                  [p.detach() - b for p, b in zip(dense.parameters(), before[2])], estimate))
    with torch.no_grad():
        idx = torch.from_numpy(hashed(model, test))
        x = torch.cat([second[idx].flatten(1), torch.from_numpy(test.dense)], 1)
        p = torch.sigmoid(first[idx].sum((1, 2)) + dense(x).squeeze(1)).numpy()
    return {"holdout_auc": round(auc(test.clicked, p), 4), "mean_p": round(float(p.mean()), 4),
            "observed_ctr": round(float(test.clicked.mean()), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--holdout", type=int, default=50_000)
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--commit-every", type=int, default=16, help="own steps per commit (16: a task)")
    parser.add_argument("--lag", type=int, default=2, help="global steps from a commit to its visibility")
    parser.add_argument("--own-visible", action="store_true", help="a trainer sees its own updates at once")
    parser.add_argument("--sync", action="store_true", help="every update seen at once (the ceiling)")
    parser.add_argument("--own-lag", type=int, help="global steps from a commit to its visibility to its own "
                        "trainer, which sees its estimate until then (default: --lag)")
    parser.add_argument("--own-rows", choices=["hidden", "lr", "table"], default="hidden",
                        help="the estimate of its own rows a trainer adds until they are visible")
    parser.add_argument("--init", choices=["model", "small"], default="model")
    parser.add_argument("--seed", type=int, default=0, help="seeds the initialisation")
    parser.add_argument("--stale", choices=["all", "dense", "rows"], default="all", help="whose updates are hidden")
    parser.add_argument("--damp", choices=["none", "dense", "rows", "both"], default="none",
                        help="scale a step by 1 / (1 + the updates hidden from it)")
    parser.add_argument("--dense-lr", type=float, default=1.0, help="scales the dense layers' learning rate")
    parser.add_argument("--dense-avg", type=int, default=1, help="step the dense layers every k steps, mean gradient")
    parser.add_argument("--beta1", type=float, default=0.9, help="Adam's beta1, both optimizers")
    args = parser.parse_args()
    visibility = Visibility(args.trainers, args.commit_every, args.lag, args.own_visible, args.sync, args.own_lag)
    remedy = Remedy(args.seed, args.stale, args.damp, args.dense_lr, args.dense_avg, args.beta1)
    result = simulate(args.records, args.holdout, visibility, args.init, args.own_rows, remedy)
    print(json.dumps({"settings": vars(args), **result}))


if __name__ == "__main__":
    main()

import math
import sys
import textwrap
import uuid
from dataclasses import FrozenInstanceError

import numpy as np
import pytest
import torch

from streamtrain.params.optimizers import (
                                             FTRL,
                                             SGD,
                                             Adagrad,
                                             Adam,
                                             UpdateRule,
                                             UpdateRuleError,
                                             check_batch,
                                             make_rule,
                                             )

STEPS = 25
ATOL = 1e-6


def fresh_state(rule, shape):
    return {name: np.zeros(shape, dtype=np.float32) for name in rule.state_names}


def torch_optimizer(rule, params):
    if isinstance(rule, SGD):
        return torch.optim.SGD(params, lr=rule.lr)
    if isinstance(rule, Adagrad):
        return torch.optim.Adagrad(params, lr=rule.lr, eps=rule.eps,
                                   initial_accumulator_value=rule.initial_accumulator_value)
    if isinstance(rule, Adam):
        return torch.optim.Adam(params, lr=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps)
    raise AssertionError(rule)


TORCH_RULES = [
    SGD(lr=0.1),
    Adagrad(lr=0.1),
    Adagrad(lr=0.05, eps=1e-6, initial_accumulator_value=0.1),
    Adam(lr=0.01),
    Adam(lr=0.05, beta1=0.5, beta2=0.9, eps=1e-6),
    Adam(lr=0.01, beta1=0.0, beta2=0.0),
]


@pytest.mark.parametrize("shape", [(64, 16), (1, 300)], ids=["rows", "dense-block"])
@pytest.mark.parametrize("rule", TORCH_RULES, ids=repr)
def test_builtin_matches_torch_optim_over_25_steps_on_identical_gradients(rule, shape):
    rng = np.random.default_rng(1)
    rows = rng.standard_normal(shape, dtype=np.float32)
    state = fresh_state(rule, shape)
    param = torch.nn.Parameter(torch.from_numpy(rows.copy()))
    opt = torch_optimizer(rule, [param])
    for step in range(STEPS):
        grads = rng.standard_normal(shape, dtype=np.float32) * np.float32(rng.uniform(0.1, 3))
        rule.apply(rows, grads, state, np.full(shape[0], step, dtype=np.int64))
        param.grad = torch.from_numpy(grads.copy())
        opt.step()
        np.testing.assert_allclose(rows, param.detach().numpy(), rtol=0, atol=ATOL)


@pytest.mark.parametrize("rule", [Adagrad(lr=0.1, initial_accumulator_value=0.2), Adam(lr=0.03)],
                         ids=repr)
def test_builtin_state_matches_torch_optimizer_state(rule):
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((8, 4), dtype=np.float32)
    state = fresh_state(rule, rows.shape)
    param = torch.nn.Parameter(torch.from_numpy(rows.copy()))
    opt = torch_optimizer(rule, [param])
    for step in range(STEPS):
        grads = rng.standard_normal(rows.shape, dtype=np.float32)
        rule.apply(rows, grads, state, np.full(8, step, dtype=np.int64))
        param.grad = torch.from_numpy(grads)
        opt.step()
    names = {"accumulator": "sum", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
    for ours, theirs in names.items():
        if ours in state:
            np.testing.assert_allclose(state[ours], opt.state[param][theirs].numpy(), atol=ATOL)


# ------------------------------------------------------------------------------------ FTRL


class FtrlReference:
    """McMahan et al. 2013, Algorithm 1, one coordinate at a time in Python floats."""

    def __init__(self, alpha, beta, l1, l2):
        self.alpha, self.beta, self.l1, self.l2 = alpha, beta, l1, l2
        self.z = {}
        self.n = {}

    def weight(self, i):
        z, n = self.z.get(i, 0.0), self.n.get(i, 0.0)
        if abs(z) <= self.l1:
            return 0.0
        sign = 1.0 if z > 0 else -1.0
        return -(z - sign * self.l1) / ((self.beta + math.sqrt(n)) / self.alpha + self.l2)

    def update(self, i, g):
        w = self.weight(i)
        n = self.n.get(i, 0.0)
        sigma = (math.sqrt(n + g * g) - math.sqrt(n)) / self.alpha
        self.z[i] = self.z.get(i, 0.0) + g - sigma * w
        self.n[i] = n + g * g


FTRL_RULES = [
    FTRL(alpha=0.5),
    FTRL(alpha=0.1, beta=1.0, l1=0.3, l2=0.5),
    FTRL(alpha=1.0, beta=0.5, l1=2.0, l2=0.0),
]


@pytest.mark.parametrize("rule", FTRL_RULES, ids=repr)
def test_ftrl_matches_a_per_coordinate_reference_over_25_steps(rule):
    rng = np.random.default_rng(3)
    shape = (32, 8)
    rows = rng.uniform(-0.01, 0.01, shape).astype(np.float32)  # overwritten: FTRL starts at w=0
    state = fresh_state(rule, shape)
    ref = FtrlReference(rule.alpha, rule.beta, rule.l1, rule.l2)
    for step in range(STEPS):
        grads = rng.standard_normal(shape, dtype=np.float32)
        rule.apply(rows, grads, state, np.full(shape[0], step, dtype=np.int64))
        for (r, c), g in np.ndenumerate(grads):
            ref.update((r, c), float(g))
        expected = np.array([[ref.weight((r, c)) for c in range(shape[1])]
                             for r in range(shape[0])])
        np.testing.assert_allclose(rows, expected, rtol=0, atol=ATOL)
    assert (rows == 0).any() == (rule.l1 > 0)  # l1 makes some weights exactly zero


# ------------------------------------------------------------------------------ lazy state


def run_sparse(rule, init, touches, grads):
    """What a shard does: gather the touched rows, apply, scatter back, count the step."""
    table = init.copy()
    state = fresh_state(rule, table.shape)
    steps = np.zeros(len(table), dtype=np.int64)
    for ids, g in zip(touches, grads):
        rows = table[ids]
        gathered = {name: a[ids] for name, a in state.items()}
        rule.apply(rows, g, gathered, steps[ids])
        table[ids] = rows
        for name, a in gathered.items():
            state[name][ids] = a
        steps[ids] += 1
    return table, steps


def random_touches(rng, n_rows, dim, steps):
    touches = [np.flatnonzero(rng.random(n_rows) < 0.4) for _ in range(steps)]
    grads = [rng.standard_normal((len(t), dim), dtype=np.float32) for t in touches]
    return touches, grads


@pytest.mark.parametrize("rule", [SGD(lr=0.1), Adagrad(lr=0.1, initial_accumulator_value=0.1),
                                  Adam(lr=0.02)], ids=repr)
def test_rows_touched_at_different_steps_match_one_torch_optimizer_per_row(rule):
    rng = np.random.default_rng(4)
    n_rows, dim = 12, 6
    init = rng.standard_normal((n_rows, dim), dtype=np.float32)
    touches, grads = random_touches(rng, n_rows, dim, STEPS)
    table, steps = run_sparse(rule, init, touches, grads)

    params = [torch.nn.Parameter(torch.from_numpy(init[i].copy())) for i in range(n_rows)]
    opts = [torch_optimizer(rule, [p]) for p in params]
    for ids, g in zip(touches, grads):
        for k, i in enumerate(ids):
            params[i].grad = torch.from_numpy(g[k].copy())
            opts[i].step()
    assert len(set(steps.tolist())) > 3  # rows really are at different steps
    expected = np.stack([p.detach().numpy() for p in params])
    np.testing.assert_allclose(table, expected, rtol=0, atol=ATOL)


def test_ftrl_rows_touched_at_different_steps_match_the_reference_and_untouched_rows_keep_init():
    rule = FTRL(alpha=0.3, l1=0.2, l2=0.1)
    rng = np.random.default_rng(5)
    n_rows, dim = 12, 6
    init = rng.uniform(-0.01, 0.01, (n_rows, dim)).astype(np.float32)
    touches, grads = random_touches(rng, n_rows, dim, STEPS)
    touches[0] = np.array([], dtype=np.int64)
    grads[0] = np.zeros((0, dim), dtype=np.float32)
    untouched = 11
    touches = [t[t != untouched] for t in touches]
    grads = [rng.standard_normal((len(t), dim), dtype=np.float32) for t in touches]
    table, _ = run_sparse(rule, init, touches, grads)

    ref = FtrlReference(rule.alpha, rule.beta, rule.l1, rule.l2)
    for ids, g in zip(touches, grads):
        for k, i in enumerate(ids):
            for c in range(dim):
                ref.update((i, c), float(g[k, c]))
    expected = np.array([[ref.weight((i, c)) for c in range(dim)] for i in range(n_rows)])
    expected[untouched] = init[untouched]
    np.testing.assert_allclose(table, expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("rule", [*TORCH_RULES, *FTRL_RULES], ids=repr)
def test_apply_on_an_empty_batch_changes_nothing(rule):
    """No rows selected (a shard whose slots no id of a group hashed to): the table and its
    state, of which the batch is an empty slice, keep every value."""
    rng = np.random.default_rng(5)
    table = rng.standard_normal((6, 4), dtype=np.float32)
    state = {name: rng.random((6, 4), dtype=np.float32) for name in rule.state_names}
    before = table.copy(), {name: values.copy() for name, values in state.items()}
    rule.apply(table[:0], np.zeros((0, 4), np.float32), {name: values[:0] for name, values in state.items()},
               np.zeros(0, dtype=np.int64))
    np.testing.assert_array_equal(table, before[0])
    for name, values in state.items():
        np.testing.assert_array_equal(values, before[1][name], err_msg=name)


def test_builtins_satisfy_the_update_rule_protocol():
    for rule in (*TORCH_RULES, *FTRL_RULES):
        assert isinstance(rule, UpdateRule)
        assert isinstance(rule.state_names, tuple)


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize("build, key", [
    (lambda: SGD(lr=0), "lr"),
    (lambda: SGD(lr=-0.1), "lr"),
    (lambda: SGD(lr=float("nan")), "lr"),
    (lambda: SGD(lr=float("inf")), "lr"),
    (lambda: SGD(lr="0.1"), "lr"),
    (lambda: SGD(lr=True), "lr"),
    (lambda: Adagrad(lr=0.1, eps=0), "eps"),
    (lambda: Adagrad(lr=0.1, initial_accumulator_value=-1), "initial_accumulator_value"),
    (lambda: Adam(lr=0.1, beta1=1.0), "beta1"),
    (lambda: Adam(lr=0.1, beta1=-0.1), "beta1"),
    (lambda: Adam(lr=0.1, beta2=1.5), "beta2"),
    (lambda: Adam(lr=0.1, eps=-1e-8), "eps"),
    (lambda: FTRL(alpha=0), "alpha"),
    (lambda: FTRL(alpha=0.1, beta=0), "beta"),
    (lambda: FTRL(alpha=0.1, l1=-1), "l1"),
    (lambda: FTRL(alpha=0.1, l2=float("nan")), "l2"),
])
def test_a_bad_hyperparameter_is_refused_naming_it(build, key):
    with pytest.raises(ValueError, match=rf": {key}: "):
        build()


def test_hyperparameters_are_frozen_floats():
    rule = Adam(lr=1, beta1=0)
    assert rule == Adam(lr=1.0, beta1=0.0) and isinstance(rule.lr, float)
    with pytest.raises(FrozenInstanceError):
        rule.lr = 0.5  # type: ignore[misc]


@pytest.mark.parametrize("change, label", [
    (lambda b: b.update(rows=b["rows"].astype(np.float64)), "rows"),
    (lambda b: b.update(grads=b["grads"][:, :2].copy()), "grads"),
    (lambda b: b["state"].pop("exp_avg_sq"), "exp_avg_sq"),
    (lambda b: b["state"].update(exp_avg=np.zeros((3, 4), np.float64)), "exp_avg"),
    (lambda b: b.update(steps=np.zeros(2, np.int64)), "steps"),
    (lambda b: b.update(steps=np.zeros(3, np.float32)), "steps"),
])
def test_a_malformed_batch_is_refused_naming_the_argument(change, label):
    rule = Adam(lr=0.1)
    batch = {"rows": np.zeros((3, 4), np.float32), "grads": np.ones((3, 4), np.float32),
             "state": fresh_state(rule, (3, 4)), "steps": np.zeros(3, np.int64)}
    change(batch)
    with pytest.raises(ValueError, match=label):
        check_batch(rule, batch["rows"], batch["grads"], batch["state"], batch["steps"])
    with pytest.raises(ValueError, match=label):
        rule.apply(batch["rows"], batch["grads"], batch["state"], batch["steps"])


# ------------------------------------------------------------------------------- make_rule


def test_make_rule_builds_each_builtin_from_its_name_with_lr():
    assert make_rule("sgd", lr=0.1) == SGD(lr=0.1)
    assert make_rule("adagrad", lr=0.1, eps=1e-6) == Adagrad(lr=0.1, eps=1e-6)
    assert make_rule("adam", lr=0.1, beta2=0.99) == Adam(lr=0.1, beta2=0.99)
    assert make_rule("ftrl", lr=0.2, l1=1.0) == FTRL(alpha=0.2, l1=1.0)
    assert make_rule("ftrl", alpha=0.2) == FTRL(alpha=0.2)


@pytest.mark.parametrize("spec, hyper, needle", [
    ("rmsprop", {"lr": 0.1}, "rmsprop: unknown optimizer; use one of sgd, adagrad, adam, ftrl"),
    ("sgd", {"lr": 0.1, "beta1": 0.9}, "sgd: beta1: unknown hyperparameter"),
    ("adam", {}, "adam: lr: required"),
    ("adam", {"lr": -1}, "adam: lr: must be"),
    ("ftrl", {"lr": 0.1, "alpha": 0.1}, "ftrl: give lr or alpha, not both"),
    ("ftrl", {"l1": 0.1}, "ftrl: lr (or alpha): required"),
    ("Adam", {"lr": 0.1}, "Adam: unknown optimizer"),
    ("my_rules:", {}, "my_rules:: unknown optimizer"),
])
def test_make_rule_refuses_a_bad_builtin_spec_naming_it(spec, hyper, needle):
    with pytest.raises(ValueError) as info:
        make_rule(spec, **hyper)
    assert needle in str(info.value)


# A module of user rules, written to a temporary directory on sys.path by `user_module`.
USER_MODULE = """
import numpy as np

class SignSGD:
    \"\"\"A tiny user rule: w -= lr * sign(g); state 'seen' counts each coordinate's updates.\"\"\"

    name = "sign_sgd"
    state_names = ("seen",)

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def apply(self, rows, grads, state, steps):
        rows -= np.float32(self.lr) * np.sign(grads)
        state["seen"] += 1

def make(lr):
    return SignSGD(lr)

class Namespace:
    make = staticmethod(make)

class NoApply:
    name = "no_apply"
    state_names = ()
    def __init__(self, lr):
        pass

def no_state_names(lr):
    class Rule:
        name = "x"
        def apply(self, rows, grads, state, steps):
            pass
    return Rule()

def bad_state_names(lr):
    rule = SignSGD(lr)
    rule.state_names = ["seen"]
    return rule

def picky(lr):
    if lr > 1:
        raise ValueError("lr must be <= 1")
    return SignSGD(lr)

not_callable = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A fresh importable module of user rules; its name is unique to the test."""
    name = f"user_rules_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in (name, f"{name}_broken"):
        sys.modules.pop(mod, None)


def test_make_rule_builds_a_user_rule_from_module_and_callable(user_module):
    for spec in (f"{user_module}:make", f"{user_module}:Namespace.make"):
        rule = make_rule(spec, lr=0.5)
        assert rule.name == "sign_sgd" and isinstance(rule, UpdateRule)
        rows = np.zeros((2, 3), np.float32)
        state = {"seen": np.zeros((2, 3), np.float32)}
        rule.apply(rows, np.array([[1, -2, 0], [3, 3, -1]], np.float32), state,
                   np.zeros(2, np.int64))
        assert rows.tolist() == [[-0.5, 0.5, 0.0], [-0.5, -0.5, 0.5]]
        assert (state["seen"] == 1).all()


@pytest.mark.parametrize("attr, hyper, needle", [
    ("make", {"lr": 0.1, "momentum": 0.9}, "does not take hyperparameters"),
    ("missing", {"lr": 0.1}, "has no attribute 'missing'"),
    ("not_callable", {"lr": 0.1}, "is not callable"),
    ("NoApply", {"lr": 0.1}, "has no apply"),
    ("no_state_names", {"lr": 0.1}, "has no state_names"),
    ("bad_state_names", {"lr": 0.1}, "state_names must be a tuple"),
    ("picky", {"lr": 2.0}, "lr must be <= 1"),
])
def test_make_rule_refuses_a_bad_user_rule_naming_the_spec(user_module, attr, hyper, needle):
    spec = f"{user_module}:{attr}"
    with pytest.raises(ValueError) as info:
        make_rule(spec, **hyper)
    assert str(info.value).startswith(f"{spec}: ") and needle in str(info.value)


def test_make_rule_refuses_a_module_that_cannot_be_imported(user_module):
    for spec, needle in [(f"{user_module}_absent:make", "No module named"),
                         (f"{user_module}_broken:make", "boom at import")]:
        with pytest.raises(UpdateRuleError) as info:
            make_rule(spec, lr=0.1)
        message = str(info.value)
        assert message.startswith(f"{spec}: cannot import module") and needle in message

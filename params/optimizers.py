"""Update rules a pserver shard applies to the parameter rows it owns (docs/optimizers.md).

Every built-in has ``apply_at``: one compiled (numba) pass (optimizer_kernels.py) that updates
the rows a gradient batch touches where they live in the shard's tables, reading and writing
each row once. For a user's rule, which needs only ``apply``, the shard gathers the rows into
dense float32 arrays, calls ``rule.apply(rows, grads, state, steps)`` once for the whole batch,
and scatters rows and state back. The built-ins' ``apply`` is ``apply_at`` over the given rows.

State is lazy and per row: a row's state only advances when the row receives a gradient. What
``steps`` counts is the rule's ``clock``: ``"row"`` (the default), the updates row ``i`` had
before this one, so a sparse row at its k-th touch sees what a dense optimizer sees at its k-th
step; ``"table"``, the updates the whole table had before this one, which is how
torch.optim.SparseAdam and TensorFlow's LazyAdam bias-correct (Adam declares it: with per-row
correction a row touched for the first time late in training moves lr, with the table's about
3 lr, and the smaller steps cost one process training a production-like workload AUC,
bench/RESULTS.md, "Figures moved from the code and the docs").

A user's own rule is any object with ``name``, ``state_names`` and ``apply`` (``UpdateRule``),
named in the job config as ``"module.path:callable"`` and built by ``make_rule``.

Over 400 lines on purpose: the protocol, the four built-ins and the adapter for a user's rule
are read together (each built-in is a short class over its kernel in optimizer_kernels.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, cast, runtime_checkable

import numpy as np

from streamtrain.schemas import StreamtrainError

if TYPE_CHECKING:
    from types import ModuleType

NO_OUT = np.empty((0, 0), dtype=np.float32)  # `apply_at` keeps no copy of the new values


_KERNELS: ModuleType | None = None


def _kernels() -> ModuleType:
    """optimizer_kernels.py, imported at the first update: importing numba is about a second of
    a process's start, and a trainer at the defaults never runs a rule (trainer/groups.py).
    Kept in a global: an import statement per update is a measurable part of a shard's CPU."""
    global _KERNELS
    if _KERNELS is None:
        from streamtrain.params import optimizer_kernels

        _KERNELS = optimizer_kernels
    return _KERNELS

__all__ = [
    "Adagrad",
    "Adam",
    "FTRL",
    "SGD",
    "UpdateRule",
    "UpdateRuleError",
    "check_batch",
    "clock_of",
    "in_place",
    "make_rule",
]

_F32 = np.float32
# Same shape as schemas/config.py's reference check: importlib + getattr can resolve it.
_REF = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", re.ASCII)


class UpdateRuleError(StreamtrainError, ValueError):
    """A hyperparameter, a rule spec, or a batch handed to ``apply`` is refused.

    The message names what is at fault: ``adam: beta1: must be in [0, 1), got 1.0``,
    ``my.rules:Sign: cannot import module 'my.rules' (No module named 'my')``.
    """


@runtime_checkable
class UpdateRule(Protocol):
    """What a pserver shard needs from an optimizer: the built-ins and any user rule.

    Attributes:
        name: short name for logs, metrics and checkpoint manifests (``"adagrad"``).
        state_names: the per-row state arrays the rule keeps, each shaped like the rows and
            float32. The shard creates them filled with zeros for a new row and checkpoints them
            with the parameters; a rule that wants another start value writes it itself on a
            row's first update (``steps == 0`` under the row clock), as Adagrad does.
        clock: optional, what ``steps`` counts: ``"row"`` (when absent) or ``"table"``
            (see the module's docstring; ``clock_of``).
        absolute: optional, True for a rule that sets the values from its state rather than
            stepping them (FTRL's w(z, n)): a shard never damps its dense steps
            (``train.damp_stale``), which its next step would undo (``is_absolute``).
    """

    name: str
    state_names: tuple[str, ...]

    def apply(self, rows: np.ndarray, grads: np.ndarray, state: Mapping[str, np.ndarray],
              steps: np.ndarray) -> None:
        """Apply one update to a batch of distinct rows, in place.

        Args:
            rows: (n, dim) float32, the current parameters; updated in place. A dense parameter
                block comes as (1, block_len) (or (block_len // dim, dim)).
            grads: (n, dim) float32 gradients, one per row (the caller sums duplicate ids
                first); read only.
            state: ``state[name]`` for every name in ``state_names``, (n, dim) float32; updated
                in place.
            steps: (n,) int64, how many updates each row (clock "row") or its table (clock
                "table") had BEFORE this one; read only (the caller counts this one afterwards).
        """
        ...


CLOCKS = ("row", "table")


def in_place(rule: UpdateRule) -> Callable | None:
    """The rule's `apply_at`, if it is the same update as its `apply`: defined by the class that
    defines `apply` (a subclass of a built-in that overrides only `apply` must not have the
    built-in's kernel run instead)."""
    apply_at = getattr(rule, "apply_at", None)  # not UpdateRule's: a built-in's
    if apply_at is None:
        return None
    owner = next((c for c in type(rule).__mro__ if "apply" in c.__dict__), None)
    return apply_at if owner is not None and "apply_at" in owner.__dict__ else None


def clock_of(rule: UpdateRule) -> str:
    """The rule's ``clock``: ``"row"`` unless it declares ``"table"``."""
    clock = getattr(rule, "clock", "row")
    if clock not in CLOCKS:
        raise UpdateRuleError(f"{getattr(rule, 'name', rule)!r}: clock: must be one of {CLOCKS}, got {clock!r}")
    return clock


def is_absolute(rule: UpdateRule) -> bool:
    """The rule's ``absolute``: False unless it declares it."""
    return bool(getattr(rule, "absolute", False))


# ------------------------------------------------------------------------------ validation


def _hyper(rule: str, key: str, value: object, *, lo: float, lo_open: bool,
           hi: float = math.inf, hi_open: bool = True) -> float:
    """``value`` as a float within the interval, or UpdateRuleError naming rule and key."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise UpdateRuleError(f"{rule}: {key}: must be a number, got {value!r}")
    number = float(value)
    low_ok = number > lo if lo_open else number >= lo
    high_ok = number < hi if hi_open else number <= hi
    if not (math.isfinite(number) and low_ok and high_ok):
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        upper = "inf" if hi == math.inf else f"{hi:g}"
        raise UpdateRuleError(f"{rule}: {key}: must be finite and in {left}{lo:g}, {upper}{right}, "
                              f"got {value!r}")
    return number


def _set(obj: object, **values: float) -> None:
    for key, value in values.items():
        object.__setattr__(obj, key, value)  # frozen dataclass: store the coerced float


def check_batch(rule: UpdateRule, rows: np.ndarray, grads: np.ndarray,
                state: Mapping[str, np.ndarray], steps: np.ndarray) -> None:
    """Refuse a batch that ``rule.apply`` would silently mis-apply: wrong dtype, shape or a
    missing state array. Constant time; the built-ins call it on every batch.

    Raises:
        UpdateRuleError: naming the argument at fault.
    """
    where = f"{rule.name}.apply"
    for label, array in (("rows", rows), ("grads", grads)):
        if not isinstance(array, np.ndarray) or array.dtype != np.float32 or array.ndim != 2:
            raise UpdateRuleError(f"{where}: {label}: must be a 2-d float32 array, got "
                                  f"{_describe(array)}")
    if grads.shape != rows.shape:
        raise UpdateRuleError(f"{where}: grads: shape {grads.shape} differs from rows {rows.shape}")
    if not rows.flags.writeable:
        raise UpdateRuleError(f"{where}: rows: must be writeable (the update is in place)")
    for name in rule.state_names:
        held = state.get(name)
        if held is None:
            raise UpdateRuleError(f"{where}: state[{name!r}]: missing")
        if (not isinstance(held, np.ndarray) or held.dtype != np.float32
                or held.shape != rows.shape or not held.flags.writeable):
            raise UpdateRuleError(f"{where}: state[{name!r}]: must be a writeable float32 array "
                                  f"shaped like rows {rows.shape}, got {_describe(held)}")
    if (not isinstance(steps, np.ndarray) or steps.dtype.kind not in "iu"
            or steps.shape != rows.shape[:1]):
        raise UpdateRuleError(f"{where}: steps: must be an integer array of shape "
                              f"({rows.shape[0]},), got {_describe(steps)}")


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__


# ------------------------------------------------------------------------------- built-ins


class _BuiltIn:
    """A built-in's ``apply``: its ``apply_at`` over the given rows."""

    __slots__ = ()

    if TYPE_CHECKING:  # what every built-in defines: its kernel
        def apply_at(self, table: np.ndarray, state: Mapping[str, np.ndarray], at: np.ndarray,
                     grads: np.ndarray, steps: np.ndarray, out: np.ndarray = NO_OUT) -> None: ...

    def apply(self, rows: np.ndarray, grads: np.ndarray, state: Mapping[str, np.ndarray],
              steps: np.ndarray) -> None:
        check_batch(cast(UpdateRule, self), rows, grads, state, steps)  # every built-in is one
        self.apply_at(rows, state, np.arange(len(rows), dtype=np.int64), grads, steps)


@dataclass(frozen=True, slots=True)
class SGD(_BuiltIn):
    """Plain stochastic gradient descent: ``w -= lr * g`` (torch.optim.SGD, no momentum)."""

    name: ClassVar[str] = "sgd"
    state_names: ClassVar[tuple[str, ...]] = ()

    lr: float

    def __post_init__(self) -> None:
        _set(self, lr=_hyper(self.name, "lr", self.lr, lo=0.0, lo_open=True))

    def apply_at(self, table: np.ndarray, state: Mapping[str, np.ndarray], at: np.ndarray,
                 grads: np.ndarray, steps: np.ndarray, out: np.ndarray = NO_OUT) -> None:
        _kernels().sgd_at(table, at, grads, _F32(self.lr), out)


@dataclass(frozen=True, slots=True)
class Adagrad(_BuiltIn):
    """Adagrad as torch.optim.Adagrad (lr_decay=0, weight_decay=0)::

        a += g * g;   w -= lr * g / (sqrt(a) + eps)

    ``a`` starts at ``initial_accumulator_value``: written on a row's first update.
    """

    name: ClassVar[str] = "adagrad"
    state_names: ClassVar[tuple[str, ...]] = ("accumulator",)

    lr: float
    eps: float = 1e-10
    initial_accumulator_value: float = 0.0

    def __post_init__(self) -> None:
        _set(self,
             lr=_hyper(self.name, "lr", self.lr, lo=0.0, lo_open=True),
             eps=_hyper(self.name, "eps", self.eps, lo=0.0, lo_open=True),
             initial_accumulator_value=_hyper(
                 self.name, "initial_accumulator_value", self.initial_accumulator_value,
                 lo=0.0, lo_open=False))

    def apply_at(self, table: np.ndarray, state: Mapping[str, np.ndarray], at: np.ndarray,
                 grads: np.ndarray, steps: np.ndarray, out: np.ndarray = NO_OUT) -> None:
        _kernels().adagrad_at(table, state["accumulator"], at, grads, steps, _F32(self.lr), _F32(self.eps),
                              _F32(self.initial_accumulator_value), out)


@dataclass(frozen=True, slots=True)
class Adam(_BuiltIn):
    """Adam as torch.optim.Adam (amsgrad=False, weight_decay=0), bias-corrected with
    ``t = steps + 1``; on a shard's tables ``steps`` is the table's update count (clock
    "table"), as torch.optim.SparseAdam does::

        m = lerp(m, g, 1 - beta1);   v = beta2 * v + (1 - beta2) * g * g
        w -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)
    """

    name: ClassVar[str] = "adam"
    state_names: ClassVar[tuple[str, ...]] = ("exp_avg", "exp_avg_sq")
    clock: ClassVar[str] = "table"

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        _set(self,
             lr=_hyper(self.name, "lr", self.lr, lo=0.0, lo_open=True),
             beta1=_hyper(self.name, "beta1", self.beta1, lo=0.0, lo_open=False, hi=1.0),
             beta2=_hyper(self.name, "beta2", self.beta2, lo=0.0, lo_open=False, hi=1.0),
             eps=_hyper(self.name, "eps", self.eps, lo=0.0, lo_open=True))

    def apply_at(self, table: np.ndarray, state: Mapping[str, np.ndarray], at: np.ndarray,
                 grads: np.ndarray, steps: np.ndarray, out: np.ndarray = NO_OUT) -> None:
        # m = lerp(m, g, 1 - beta1), with torch's two-sided formula: exact (m = g) at beta1 = 0.
        weight = _F32(1.0 - self.beta1)
        _kernels().adam_at(table, state["exp_avg"], state["exp_avg_sq"], at, grads, steps, self.lr, self.beta1,
                           self.beta2, weight, bool(weight < 0.5), _F32(1.0 - self.beta2), _F32(self.eps), out)


@dataclass(frozen=True, slots=True)
class FTRL(_BuiltIn):
    """FTRL-Proximal, per coordinate (McMahan et al. 2013, Algorithm 1)::

        w = 0 if |z| <= l1 else -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)
        on g:  sigma = (sqrt(n + g*g) - sqrt(n)) / alpha;  z += g - sigma * w;  n += g*g
        then the rows are set to w(z, n)

    The weights are a function of (z, n): a row's first update starts from w = 0, as in the
    paper, whatever value the row was created with; afterwards the rows hold w(z, n), which
    ``apply`` reads as the current w rather than recomputing it.
    """

    name: ClassVar[str] = "ftrl"
    state_names: ClassVar[tuple[str, ...]] = ("z", "n")
    absolute: ClassVar[bool] = True

    alpha: float
    beta: float = 1.0
    l1: float = 0.0
    l2: float = 0.0

    def __post_init__(self) -> None:
        _set(self,
             alpha=_hyper(self.name, "alpha", self.alpha, lo=0.0, lo_open=True),
             # beta > 0 keeps the denominator positive while n is still 0.
             beta=_hyper(self.name, "beta", self.beta, lo=0.0, lo_open=True),
             l1=_hyper(self.name, "l1", self.l1, lo=0.0, lo_open=False),
             l2=_hyper(self.name, "l2", self.l2, lo=0.0, lo_open=False))

    def apply_at(self, table: np.ndarray, state: Mapping[str, np.ndarray], at: np.ndarray,
                 grads: np.ndarray, steps: np.ndarray, out: np.ndarray = NO_OUT) -> None:
        _kernels().ftrl_at(table, state["z"], state["n"], at, grads, steps, _F32(self.alpha), _F32(self.beta),
                           _F32(self.l1), _F32(self.l2), out)


# ------------------------------------------------------------------------------- make_rule

_BUILTINS: dict[str, type] = {"sgd": SGD, "adagrad": Adagrad, "adam": Adam, "ftrl": FTRL}


def make_rule(spec: str, **hyper: float) -> UpdateRule:
    """The update rule a job config names (``pservers.optimizer``), built with ``hyper``.

    Args:
        spec: ``"sgd"``, ``"adagrad"``, ``"adam"``, ``"ftrl"``, or ``"module.path:callable"``
            for a user rule: ``callable(**hyper)`` must return an ``UpdateRule``.
        **hyper: hyperparameters. ``lr`` is accepted by every built-in (FTRL takes it as
            ``alpha``), so the job's single ``train.learning_rate`` works with all of them.

    Raises:
        UpdateRuleError: unknown name, malformed spec, a module that cannot be imported, a
            missing or non-callable attribute, hyperparameters the rule does not take or
            refuses, or an object that is not an UpdateRule. The message starts with the spec.
    """
    if not isinstance(spec, str):
        raise UpdateRuleError(f"optimizer spec must be a string, got {spec!r}")
    builtin = _BUILTINS.get(spec)
    if builtin is not None:
        return _make_builtin(spec, builtin, hyper)
    if not _REF.fullmatch(spec):
        raise UpdateRuleError(f"{spec}: unknown optimizer; use one of {', '.join(_BUILTINS)} "
                              "or a 'module.path:callable' reference")
    factory = _resolve(spec)
    try:
        inspect.signature(factory).bind(**hyper)
    except TypeError as exc:
        raise UpdateRuleError(
            f"{spec}: does not take hyperparameters {sorted(hyper)}: {exc}") from exc
    except ValueError:
        pass  # no introspectable signature (a C callable): let the call decide
    try:
        rule = factory(**hyper)
    except (TypeError, ValueError) as exc:
        raise UpdateRuleError(f"{spec}: refused hyperparameters {hyper}: {exc}") from exc
    _check_rule(spec, rule)
    return cast(UpdateRule, rule)  # what _check_rule checked


def _make_builtin(spec: str, cls: type, hyper: dict[str, float]) -> UpdateRule:
    hyper = dict(hyper)
    if cls is FTRL and "lr" in hyper:
        if "alpha" in hyper:
            raise UpdateRuleError(f"{spec}: give lr or alpha, not both (lr is alpha for FTRL)")
        hyper["alpha"] = hyper.pop("lr")
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    accepted = sorted(names | ({"lr"} if cls is FTRL else set()))
    for key in hyper:
        if key not in names:
            raise UpdateRuleError(f"{spec}: {key}: unknown hyperparameter; takes "
                                  f"{', '.join(accepted)}")
    for f in fields:
        if f.default is dataclasses.MISSING and f.name not in hyper:
            missing = "lr (or alpha)" if cls is FTRL else f.name
            raise UpdateRuleError(f"{spec}: {missing}: required")
    return cls(**hyper)


def _resolve(spec: str) -> Callable[..., object]:
    module_name, _, attr_path = spec.partition(":")
    try:
        target: object = importlib.import_module(module_name)
    except Exception as exc:  # any failure while importing user code is the spec's fault
        raise UpdateRuleError(f"{spec}: cannot import module {module_name!r} "
                              f"({type(exc).__name__}: {exc})") from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise UpdateRuleError(
                f"{spec}: {module_name!r} has no attribute {attr_path!r}") from exc
    if not callable(target):
        raise UpdateRuleError(f"{spec}: {attr_path!r} is not callable")
    return target


def _check_rule(spec: str, rule: object) -> None:
    missing = [a for a in ("name", "state_names", "apply") if not hasattr(rule, a)]
    if missing:
        raise UpdateRuleError(f"{spec}: returned {type(rule).__name__}, which has no "
                              f"{', '.join(missing)}; an update rule needs name, state_names "
                              "and apply (params.optimizers.UpdateRule)")
    name, state_names = getattr(rule, "name"), getattr(rule, "state_names")
    if not isinstance(name, str) or not name:
        raise UpdateRuleError(f"{spec}: name must be a non-empty string, got {name!r}")
    if (not isinstance(state_names, tuple) or not all(isinstance(s, str) and s for s in state_names)
            or len(set(state_names)) != len(state_names)):
        raise UpdateRuleError(f"{spec}: state_names must be a tuple of distinct non-empty "
                              f"strings, got {state_names!r}")
    if not callable(getattr(rule, "apply")):
        raise UpdateRuleError(f"{spec}: apply is not callable")
    if getattr(rule, "clock", "row") not in CLOCKS:
        raise UpdateRuleError(f"{spec}: clock must be one of {CLOCKS}, got {getattr(rule, 'clock')!r}")

"""The built-in update rules' compiled kernels (params/optimizers.py): one numba pass per
gradient batch over the rows it touches, where they live."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

_F32 = np.float32

# One compiled pass per batch: each row is read, updated and written back where it lives (and
# copied to `out` when the caller wants the new values), instead of a dozen numpy passes over
# gathered copies. The arithmetic is the numpy formulas' own, in the same order and in float32
# (no fast-math: no contraction into fused multiply-adds), so the results are the same bits.
# `error_model="numpy"`: a division by zero gives inf or nan, as numpy does, not an exception.
_JIT: dict[str, Any] = {"nogil": True, "cache": True, "error_model": "numpy"}
NO_OUT = np.empty((0, 0), dtype=_F32)


@numba.njit(**_JIT)
def sgd_at(table, at, grads, lr, out):
    keep = out.shape[0] > 0
    for i in range(at.shape[0]):
        r = at[i]
        for j in range(table.shape[1]):
            w = table[r, j] - grads[i, j] * lr
            table[r, j] = w
            if keep:
                out[i, j] = w


@numba.njit(**_JIT)
def adagrad_at(table, acc, at, grads, steps, lr, eps, initial, out):
    keep = out.shape[0] > 0
    for i in range(at.shape[0]):
        r = at[i]
        fresh = steps[i] == 0 and initial != 0
        for j in range(table.shape[1]):
            g = grads[i, j]
            a = initial if fresh else acc[r, j]
            a = a + g * g
            acc[r, j] = a
            w = table[r, j] - g / (np.sqrt(a) + eps) * lr
            table[r, j] = w
            if keep:
                out[i, j] = w


@numba.njit(**_JIT)
def adam_at(table, m, v, at, grads, steps, lr, beta1, beta2, weight, small_weight, one_minus_beta2, eps, out):
    keep = out.shape[0] > 0
    last_t = -1
    step_size = np.float32(0.0)
    bc2_sqrt = np.float32(1.0)
    for i in range(at.shape[0]):
        r = at[i]
        if steps[i] != last_t:  # per-row scalars in float64, as numpy computes them
            last_t = steps[i]
            t = last_t + 1.0
            step_size = np.float32(lr / (1.0 - beta1 ** t))
            bc2_sqrt = np.float32(np.sqrt(1.0 - beta2 ** t))
        for j in range(table.shape[1]):
            g = grads[i, j]
            mm = m[r, j]
            if small_weight:
                mm = mm + (g - mm) * weight
            else:
                mm = g - (g - mm) * (np.float32(1.0) - weight)
            vv = v[r, j] * np.float32(beta2) + g * g * one_minus_beta2
            m[r, j] = mm
            v[r, j] = vv
            w = table[r, j] - mm / (np.sqrt(vv) / bc2_sqrt + eps) * step_size
            table[r, j] = w
            if keep:
                out[i, j] = w


@numba.njit(**_JIT)
def ftrl_at(table, z, n, at, grads, steps, alpha, beta, l1, l2, out):
    keep = out.shape[0] > 0
    zero = np.float32(0.0)
    for i in range(at.shape[0]):
        r = at[i]
        fresh = steps[i] == 0  # every coordinate starts at w(0, 0) = 0
        for j in range(table.shape[1]):
            g = grads[i, j]
            w = zero if fresh else table[r, j]
            n_old = n[r, j]
            n_new = n_old + g * g
            n[r, j] = n_new
            root = np.sqrt(n_new)
            sigma = (root - np.sqrt(n_old)) / alpha * w
            zz = z[r, j] + (g - sigma)
            z[r, j] = zz
            den = (root + beta) / alpha
            if l2 != 0:
                den = den + l2
            den = -den
            if l1 != 0:
                num = np.abs(zz) - l1
                if num < zero:  # nan stays nan, as np.maximum keeps it
                    num = zero
                w = np.copysign(num, zz) / den
            else:
                w = zz / den
            table[r, j] = w
            if keep:
                out[i, j] = w

"""Random Fourier features: a linear model over them is a kernel (RBF) regression of the row.

A per-arm linear model holds rewards that are linear in the context; many are not (a threshold,
a product of two features, the class regions of a dataset). ``n`` random Fourier features
(Rahimi & Recht 2007, "Random features for large-scale kernel machines") map a row ``x`` to::

    phi(x) = (1, A cos(x' W / (scale sqrt(m)) + c))

with ``W`` (dim, n) standard normal and ``c`` uniform on [0, 2 pi), both drawn from a generator
seeded by ``(dim, n)`` only, so the learner, the publisher and every edge client rebuild the same
map from the policy's parameters; ``x'`` is the row without its intercept and ``m`` its number of
non-zero entries (at least 1). The kernel is then ``exp(-|x - y|^2 / (2 scale^2 m))``: it compares
rows by their mean squared difference per feature, whether a row holds 3 features or 60 (the
encoder z-scores numeric features, so ``scale`` counts in their standard deviations); ``A`` =
sqrt(2) / 4 keeps each feature's variance near the ridge prior's scale. A linear model over
``phi`` approximates a Gaussian-kernel regression with ``n`` terms: it costs ``(n + 1)^2`` per
learned row and ``n`` per scored candidate.

The cosine is fdlibm's (:func:`fourier_cos`), in plain IEEE operations, rather than numpy's: it
is what a Fourier member's learning spends most on, and libm's costs ~14 ns a value where the
compiled copy in ``learner._fastscore.fourier`` costs a fraction of that; both copies give the
same bits on any CPU, where numpy's ``cos`` may take another code path on another one.
"""

from __future__ import annotations

import math

import numpy as np

try:
    from learner import _fastscore
except ImportError:  # not built: numpy below gives the same bits
    _fastscore = None

#: Amplitude of each feature: sqrt(2) is the kernel's, 1/4 brings the features' variance near the
#: intercept's prior scale (measured with ``benchmarks/regret.py``'s datasets).
AMPLITUDE = math.sqrt(2.0) / 4.0
#: fdlibm's constants (k_sin.c, k_cos.c, e_rem_pio2.c): 2/pi; pi/2 in three parts, the first two
#: of 33 bits, so ``n * PIO2_1`` and ``n * PIO2_2`` are exact for ``|n| < 2^20``; the sine's and
#: the cosine's kernels on [-pi/4, pi/4]. Past ``COS_REDUCED`` the cosine is numpy's (C: libm's).
INVPIO2 = 6.36619772367581382433e-01
PIO2_1, PIO2_2, PIO2_2T = 1.57079632673412561417e00, 6.07710050630396597660e-11, 2.02226624879595063154e-21
S1, S2, S3, S4, S5, S6 = (-1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
                          2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10)
C1, C2, C3, C4, C5, C6 = (4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
                          -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11)
COS_REDUCED = 823549.6
ROUNDER = 1.5 * 2.0**52
#: Generator key, so the map depends on (dim, n) and nothing a process chooses.
_KEY = 0x46F0


class FourierFeatures:
    """The map ``phi`` of a row of ``dim`` entries (``intercept_index`` its constant, or None)
    onto ``n + 1`` entries, the first the intercept (see the module docstring)."""

    def __init__(self, dim: int, n: int, scale: float = 1.0, intercept_index: int | None = 0) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"fourier must be a positive int (the number of features), got {n!r}")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (scale > 0.0 and math.isfinite(scale)):
            raise ValueError(f"fourier_scale must be a finite number > 0, got {scale!r}")
        self.dim, self.n, self.scale = int(dim), int(n), float(scale)
        rng = np.random.default_rng([_KEY, self.dim, self.n])
        self.W = rng.standard_normal((self.dim, self.n))
        self.c = rng.uniform(0.0, 2.0 * math.pi, self.n)
        self.keep = np.ones(self.dim, dtype=bool)
        if intercept_index is not None:
            self.keep[intercept_index] = False
            self.W[intercept_index] = 0.0

    @property
    def out_dim(self) -> int:
        return self.n + 1

    @property
    def key(self) -> tuple[int, int, float]:
        return (self.dim, self.n, self.scale)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """``phi`` of every row of ``X`` (k, dim): (k, n + 1)."""
        X = np.asarray(X, dtype=np.float64)
        if len(X) > 1 and (X == X[0]).all():  # a per-arm decide: every candidate's row is the context
            return np.repeat(self(X[:1]), len(X), axis=0)
        m = np.maximum(np.count_nonzero(X[:, self.keep], axis=1), 1)
        denom = self.scale * np.sqrt(m)
        out = np.empty((X.shape[0], self.n + 1))
        inner = X @ self.W
        if _fastscore is not None:
            _fastscore.fourier(inner, denom, self.c, AMPLITUDE, out)
            return out
        out[:, 0] = 1.0
        inner /= denom[:, None]
        inner += self.c
        out[:, 1:] = fourier_cos(inner)
        out[:, 1:] *= AMPLITUDE
        return out


def fourier_cos(t: np.ndarray) -> np.ndarray:
    """cos of every entry of ``t``, fdlibm's, in the operations ``learner._fastscore.fourier``
    performs (the same bits): reduce by pi/2, then the sine or cosine kernel by quadrant."""
    t = np.asarray(t, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # far, inf, nan: np.cos below, without a warning
        n = (t * INVPIO2 + ROUNDER) - ROUNDER  # to the nearest integer, ties to even (np.rint's bits)
        x = ((t - n * PIO2_1) - n * PIO2_2) - n * PIO2_2T
        z = x * x
        w = z * z
        sine = x + (z * x) * (S1 + z * (S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)))))
        r = z * (C1 + z * (C2 + z * C3)) + w * w * (C4 + z * (C5 + z * C6))
        hz = 0.5 * z
        w = 1.0 - hz
        cosine = w + (((1.0 - w) - hz) + z * r)
        q = np.remainder(n, 4.0)
        y = np.where(q % 2.0 == 1.0, sine, cosine)
        y = np.where((q == 1.0) | (q == 2.0), -y, y)
        far = ~(np.abs(t) <= COS_REDUCED)
        if far.any():
            y[far] = np.cos(t[far])
    return y

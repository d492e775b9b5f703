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
"""

from __future__ import annotations

import math

import numpy as np

#: Amplitude of each feature: sqrt(2) is the kernel's, 1/4 brings the features' variance near the
#: intercept's prior scale (measured with ``benchmarks/regret.py``'s datasets).
AMPLITUDE = math.sqrt(2.0) / 4.0
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
        out = np.empty((X.shape[0], self.n + 1))
        out[:, 0] = 1.0
        inner = X @ self.W
        inner /= (self.scale * np.sqrt(m))[:, None]
        inner += self.c
        np.cos(inner, out=out[:, 1:])
        out[:, 1:] *= AMPLITUDE
        return out

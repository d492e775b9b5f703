"""Small dense linear-algebra helpers for the policies, stacked over arms, numpy only.

The linear policies keep, per arm, the precision ``A`` (d x d, symmetric positive definite) and
``b``; everything else is derived from them here:

    A = C C^T                 (Cholesky, C lower triangular)
    L = C^-T                  so that L L^T = C^-T C^-1 = A^-1   (L upper triangular)
    theta = A^-1 b = L (L^T b)

The policies store ``L^T = C^-1`` (lower triangular) because every use is a product with it:
the UCB width of a row x is ``||L^T x||`` and a Thompson draw is ``theta + v L z``.

    >>> import numpy as np
    >>> A = np.array([[[4.0, 2.0], [2.0, 3.0]]])
    >>> theta, LT = factorise(A, np.array([[1.0, 2.0]]))
    >>> np.allclose(LT[0].T @ LT[0], np.linalg.inv(A[0]))
    True
    >>> np.allclose(theta[0], np.linalg.solve(A[0], [1.0, 2.0]))
    True
"""

from __future__ import annotations

import functools

import numpy as np


class NotPositiveDefinite(ArithmeticError):
    """A precision matrix lost positive definiteness (bad loaded state or numerical collapse)."""


@functools.cache
def _triangle(d: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat positions (row-major) of the upper triangle of a d x d matrix, and of its mirror."""
    rows, cols = np.triu_indices(d)
    upper, lower = rows * d + cols, cols * d + rows
    upper.setflags(write=False)
    lower.setflags(write=False)
    return upper, lower


def pack_symmetric(M: np.ndarray) -> np.ndarray:
    """The upper triangle of symmetric ``M`` (..., d, d), row by row, as (..., d(d+1)/2).

    >>> pack_symmetric(np.array([[1.0, 2.0], [2.0, 3.0]])).tolist()
    [1.0, 2.0, 3.0]
    """
    d = M.shape[-1]
    upper, _ = _triangle(d)
    return np.take(M.reshape(M.shape[:-2] + (d * d,)), upper, axis=-1)


def unpack_symmetric(packed: np.ndarray, d: int) -> np.ndarray:
    """Inverse of :func:`pack_symmetric`: a full symmetric (..., d, d) matrix."""
    upper, lower = _triangle(d)
    out = np.empty(packed.shape[:-1] + (d * d,), dtype=np.float64)
    out[..., upper] = packed
    out[..., lower] = packed
    return out.reshape(packed.shape[:-1] + (d, d))


def packed_size(d: int) -> int:
    return d * (d + 1) // 2


def factorise(A: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior means and covariance factors of a stack of precisions, from scratch.

    ``A`` (g, d, d) symmetric positive definite, ``b`` (g, d). Returns ``theta`` (g, d) with
    ``theta = A^-1 b`` and ``LT`` (g, d, d) lower triangular with ``LT^T LT = A^-1``.
    Only the lower triangle of ``A`` is read (Cholesky), so a rounding-level asymmetry in the
    accumulated sums cannot matter. Raises :class:`NotPositiveDefinite`.
    """
    try:
        C = np.linalg.cholesky(A)
    except np.linalg.LinAlgError as exc:
        raise NotPositiveDefinite(str(exc)) from exc
    LT = np.linalg.inv(C)
    LT = np.tril(LT)  # inv() of a triangular matrix leaves rounding dust above the diagonal
    y = np.matmul(LT, b[..., None])  # C^-1 b
    theta = np.matmul(np.swapaxes(LT, -1, -2), y)[..., 0]  # C^-T C^-1 b
    return theta, LT


def prior_factor(strength: np.ndarray, d: int) -> np.ndarray:
    """``LT`` for precisions ``strength * I`` without factorising: ``I / sqrt(strength)``."""
    eye = np.eye(d)
    return eye[None, :, :] / np.sqrt(np.asarray(strength, dtype=np.float64))[:, None, None]


def spectral_norm_spd(A: np.ndarray) -> float:
    """Largest eigenvalue of a symmetric positive (semi)definite matrix, i.e. ``||A||_2``."""
    return float(np.linalg.eigvalsh(A)[-1])


def precision_norm_from_factor(LT: np.ndarray) -> float:
    """``||A||_2`` from ``LT`` alone (``A^-1 = LT^T LT``): ``1 / sigma_min(LT)^2``."""
    smallest = float(np.linalg.svd(LT, compute_uv=False)[-1])
    return float("inf") if smallest == 0.0 else 1.0 / (smallest * smallest)


def rank_one_update(F: np.ndarray, z: np.ndarray, y: float) -> None:
    """The factor ``F = [theta^T; L^T]`` (d+1, d) of ``A``, ``b`` becomes, in place and in
    O(d^2), that of ``A + z z^T`` and ``b + y z`` (one row of weight w: ``z = sqrt(w) x``,
    ``y = sqrt(w) r``).

    Carlson's triangular update of the covariance factor (``L L^T = A^-1``) for one
    observation of unit noise variance; with ``f = L^T z`` and ``alpha_{-1} = 1``, row j of
    ``L^T`` in turn::

        alpha_j = alpha_{j-1} + f_j^2    s_j = sqrt(alpha_{j-1}) sqrt(alpha_j)
        L^T[j, :j+1] <- (alpha_{j-1} / s_j) L^T[j, :j+1] - (f_j / s_j) e_j
        e_j = sum_{k<j} f_k L^T[k, :]     (before the update; e_d = A^-1 z)

    then ``theta <- theta + e_d (y - z . theta) / alpha_{d-1}``. No square root of anything
    below 1 is taken, so it cannot fail, and rows only add information. ``learner._fastscore.
    rank_one`` computes the same operations in the same order (sums from 0 in index order,
    ``f_j`` in two lanes of even and odd columns): both give the same bits.

    >>> A, b = np.array([[4.0, 2.0], [2.0, 3.0]]), np.array([1.0, 2.0])
    >>> theta, LT = factorise(A[None], b[None])
    >>> F = np.vstack([theta, LT[0]])
    >>> rank_one_update(F, np.array([1.0, -1.0]), 0.5)
    >>> theta, LT = factorise((A + [[1.0, -1.0], [-1.0, 1.0]])[None], (b + [0.5, -0.5])[None])
    >>> np.allclose(F, np.vstack([theta, LT[0]]), rtol=0, atol=1e-14)
    True
    """
    d = F.shape[1]
    LT, theta = F[1:], F[0]
    zeros = np.zeros((d, 1))
    P = LT * z
    even = np.add.accumulate(np.hstack([zeros, P[:, 0::2]]), axis=1)[:, -1]
    odd = np.add.accumulate(np.hstack([zeros, P[:, 1::2]]), axis=1)[:, -1]
    f = even + odd  # columns past the diagonal are zeros: they add nothing to a sum from 0
    alpha = np.add.accumulate(np.concatenate([[1.0], f * f]))
    root = np.sqrt(alpha)
    s = root[:-1] * root[1:]  # not sqrt(alpha_{j-1} alpha_j): that product can overflow
    beta, gamma = alpha[:-1] / s, f / s
    E = np.add.accumulate(np.vstack([zeros.T, LT * f[:, None]]), axis=0)  # E[j] = e_j
    zt = np.add.accumulate(np.concatenate([[0.0], z * theta]))[-1]
    g = (y - zt) / alpha[-1]
    LT[...] = np.tril(beta[:, None] * LT - gamma[:, None] * E[:-1])
    theta += E[-1] * g

"""Bayesian linear regression per arm (or one shared), the statistics behind the linear policies.

Each model keeps the precision and the response vector::

    A = A0 + sum_i w_i x_i x_i^T        A0 = prior_strength * I
    b = b0 + sum_i w_i r_i x_i          b0 = prior_strength * prior_mean * e_0

(``e_0`` the intercept coordinate, ``intercept_index``), so the posterior mean
``theta = A^-1 b`` starts at ``prior_mean`` on the intercept and zero elsewhere, and with a zero
prior mean it is the ridge solution ``(X^T W X + lambda I)^-1 X^T W r``, ``lambda`` the strength.

``A`` and ``b`` are the truth; ``theta`` and the covariance factor ``L^T`` (``L L^T = A^-1``) are
derived from them from scratch (Cholesky, then a triangular inverse) and cached. An arm is
re-factorised when it has learned at least ``refactor_every`` rows since its last factorisation
and is next needed to decide; reading the scoring view or drift statistics refreshes any arm
with newer rows. Deciding never factorises an arm that has not changed.

**The shared model learns small batches in place.** One model learning every event cannot
afford an O(d^3) factorisation per row (30 ms at d = 512), so a batch of at most
``rank_one_rows(d)`` rows, with ``gamma = 1``, updates the factor row by row in O(d^2)
(:func:`learner.linalg.rank_one_update`, compiled in ``learner._fastscore``). ``A`` and ``b``
are summed exactly as by any other batch (the ``z z^T`` of single rows go into ``A`` up to
``OWED_ROWS`` at a time, with the same bits, before anything reads ``A``). Such a factor
agrees with a factorisation of ``A`` to rounding, not bit for bit, so from then on it is part
of the model's state: it is serialised with ``A`` and ``b`` (arrays ``theta`` and ``LT``, the
lower triangle packed) and the scoring view carries it, so a restarted learner, a publisher
and the SDK all use the very factor the learner computed. Which way a batch goes depends only
on its size, ``gamma``, the dimension and the update count, never on when anything decided or
was saved: the posterior is a function of the batches, as before. A batch that crosses a
multiple of ``EXACT_EVERY`` rows of the model, a larger batch or forgetting (``gamma < 1`` or
``half_life_s`` pulls ``A`` toward a full-rank prior: no rank-one update) goes back to an exact factorisation
of ``A``, and the state to ``A`` and ``b`` alone; so rounding never accumulates over more than
``EXACT_EVERY`` rows. The prior's factor (``I / sqrt(s)``, not a factorisation either) counts
as such a state too. The per-arm models are never updated in place.

Each arm caches both as one (d+1, d) matrix ``F = [theta^T; L^T]``, so that scoring a row is a
single product ``F x = (x . theta, L^T x)``: the decide path reads each arm's factor once.

When the C extension ``learner._fastscore`` is built (by ``pip install``), the disjoint
policies decide in one compiled call from those factors (scores, draws, floor and choice;
see learner/_fastscore.c); numpy, below, is the fallback and the reference.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from learner.linalg import (
    NotPositiveDefinite,
    factorise,
    pack_symmetric,
    packed_size,
    precision_norm_from_factor,
    prior_factor,
    rank_one_update,
    spectral_norm_spd,
    unpack_symmetric,
)
from learner.policies.base import Block, Choice, Drift, Policy, valid_dim
from learner.policies.errors import NumericalError, StateFormatError

try:
    from learner import _fastscore
except ImportError:  # not built: the numpy path decides
    _fastscore = None

#: The shared model is re-factorised exactly whenever its update count crosses a multiple of
#: this: the rounding of in-place updates (about 1e-13 relative) never piles up for longer.
EXACT_EVERY = 8192
#: Rows learned one at a time whose z z^T the shared model sums into A together, in one pass
#: over A (at d = 512, A is 2 MB: reading and writing it for every row would take longer than
#: the factor's update); anything that reads A sums them in first (:meth:`_settle`).
OWED_ROWS = 32


def rank_one_rows(d: int) -> int:
    """Largest batch the shared model learns by rank-one updates: about where k O(d^2) row
    updates start to cost more than one O(d^3) factorisation."""
    return max(1, d // 8)


class LinearPolicy(Policy):
    """Mechanics shared by LinUCB, LinTS and their shared-model variants.

    Parameters (besides those of :class:`~learner.policies.base.Policy`):

    - ``refactor_every``: rows an arm may learn before deciding re-factorises it (>= 1); with
      1 every decision uses the exact posterior, larger values trade freshness for decide time.
    - ``intercept_index``: coordinate of the intercept, where the prior mean goes (None: none).
    - ``prior_strength`` must be > 0: it is the ridge penalty that keeps ``A`` invertible.
    """

    _stat_names: ClassVar[tuple[str, ...]] = ("A", "b")
    _packed: ClassVar[frozenset[str]] = frozenset({"A"})
    _scoring_names: ClassVar[tuple[str, ...]] = ("theta", "L")

    def __init__(self, dim: int, *, refactor_every: int = 1, intercept_index: int | None = 0, **kwargs: Any) -> None:
        if isinstance(refactor_every, bool) or int(refactor_every) != refactor_every or refactor_every < 1:
            raise ValueError(f"refactor_every must be an int >= 1, got {refactor_every!r}")
        d = valid_dim(dim)
        if intercept_index is not None and not 0 <= intercept_index < d:
            raise ValueError(f"intercept_index must be None or in [0, dim={d}), got {intercept_index!r}")
        self.refactor_every = int(refactor_every)
        self.intercept_index = None if intercept_index is None else int(intercept_index)
        self._stale: set[int] = set()
        self._owed = np.empty((OWED_ROWS if self.shared else 0, d))  # rows z not yet in A
        self._n_owed = 0
        self._eye = np.eye(d)
        super().__init__(dim, **kwargs)

    def _check_prior(self, mean: float, strength: float, what: str) -> None:
        super()._check_prior(mean, strength, what)
        if strength <= 0.0:
            raise ValueError(f"{what} needs a strength > 0 (the ridge penalty), got {strength}")

    # --- statistics ------------------------------------------------------------------------------

    def _stat_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"A": (self.dim, self.dim), "b": (self.dim,)}

    def _prior_stats(self, mean: np.ndarray, strength: np.ndarray) -> dict[str, np.ndarray]:
        A = strength[:, None, None] * self._eye
        b = np.zeros((len(mean), self.dim))
        if self.intercept_index is not None:
            b[:, self.intercept_index] = strength * mean
        return {"A": A, "b": b}

    def _cache_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        d = self.dim
        return {
            "factor": ((d + 1, d), np.dtype(np.float64)),  # row 0: theta, rows 1..d: L^T
            "since": ((), np.dtype(np.int64)),
            "carried": ((), np.dtype(np.int64)),  # 1: the factor is state (updated in place), not f(A, b)
        }

    def _reset_cache(self, slots: np.ndarray) -> None:
        # At the prior A = s I and b = s m e_0, so theta = m e_0 and L^T = I / sqrt(s): no solve.
        factor = np.zeros((len(slots), self.dim + 1, self.dim))
        if self.intercept_index is not None:
            factor[:, 0, self.intercept_index] = self._arrays["pmean"][slots]
        factor[:, 1:] = prior_factor(self._arrays["pstrength"][slots], self.dim)
        self._arrays["factor"][slots] = factor
        self._arrays["since"][slots] = 0
        self._arrays["carried"][slots] = int(self.shared)  # I / sqrt(s) is not bitwise f(A0, b0)
        self._stale.difference_update(slots.tolist())

    def _accumulate(
        self, slots: np.ndarray, starts: np.ndarray, counts: np.ndarray, X: np.ndarray, r: np.ndarray, w: np.ndarray
    ) -> None:
        # Z = W^1/2 X makes Z^T Z = X^T W X one symmetric rank-k product (BLAS syrk: exactly
        # symmetric and half the flops of a general product); Z^T (W^1/2 r) = X^T W r.
        sw = np.sqrt(w)
        Z = X * sw[:, None]
        zr = r * sw
        if self.shared:
            if self._in_place(len(zr)):
                self._rank_one(Z, zr)
                return
            self._settle()
            self._arrays["carried"][0] = 0
        A = self._arrays["A"]
        b = self._arrays["b"]
        for slot, lo, k in zip(slots.tolist(), starts.tolist(), counts.tolist()):
            Za = Z[lo : lo + k]
            A[slot] += Za.T @ Za
            b[slot] += Za.T @ zr[lo : lo + k]

    def _in_place(self, k: int) -> bool:
        """Whether the shared model learns a batch of k rows by rank-one updates (see the
        module docstring): a function of the batch and the update count alone."""
        count = int(self._arrays["count"][0])
        return self.gamma == 1.0 and self.half_life_s is None and k <= rank_one_rows(self.dim) and (count + k) // EXACT_EVERY == count // EXACT_EVERY

    def _rank_one(self, Z: np.ndarray, zr: np.ndarray) -> None:
        """Fold the rows (``Z = W^1/2 X``, ``zr = W^1/2 r``) into the shared model's A, b and
        factor, one rank-one update per row."""
        slot = np.zeros(1, dtype=np.intp)
        self._refresh(slot, force=True)  # a factorisation still due comes first: it is the factor of A now
        F, A, b = self._arrays["factor"][0], self._arrays["A"][0], self._arrays["b"][0]
        if _fastscore is not None and len(zr) == 1:
            _fastscore.rank_one(F, Z, zr, b)  # b too: the bits of the product below
            self._owed[self._n_owed] = Z[0]  # and A later, with the same bits (_settle)
            self._n_owed += 1
            if self._n_owed == OWED_ROWS:
                self._settle()
        else:
            self._settle()
            A += Z.T @ Z
            b += Z.T @ zr
            if _fastscore is not None:
                _fastscore.rank_one(F, Z, zr, None)
            else:
                for z, y in zip(Z, zr.tolist()):
                    rank_one_update(F, z, y)
        self._arrays["carried"][0] = 1

    def _settle(self) -> None:
        """Sum the rows owed to the shared model's A into it, each as a one-row update."""
        if not self._n_owed:
            return
        A, owed = self._arrays["A"][0], self._owed[: self._n_owed]
        if _fastscore is not None:
            _fastscore.add_outer(A, owed)
        else:
            for t in range(len(owed)):
                A += owed[t : t + 1].T @ owed[t : t + 1]
        self._n_owed = 0

    def _invalidate(self, slots: np.ndarray, counts: np.ndarray) -> None:
        if self.shared and counts[0] > 0 and self._arrays["carried"][0]:
            return  # learned in place (_rank_one): the factor is current
        self._arrays["carried"][slots] = 0  # a loaded state brings its own factor, if any (_load_carried)
        since = self._arrays["since"]
        since[slots] = np.where(counts < 0, self.refactor_every, since[slots] + counts)
        self._stale.update(slots.tolist())

    def _carried_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"theta": (self.dim,), "LT": (packed_size(self.dim),)} if self.shared else {}

    def _carried_arrays(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        carried = self._arrays["carried"][slots]
        if not carried.any():
            return {}
        if not carried.all():  # only the shared model (one slot) is ever carried
            raise AssertionError("some arms' factors are state, others' are not")
        factor = self._arrays["factor"][slots]
        return {"theta": factor[:, 0], "LT": pack_symmetric(np.swapaxes(factor[:, 1:], 1, 2))}

    def _load_carried(self, slots: np.ndarray, arrays: Any) -> None:
        LT = np.tril(unpack_symmetric(arrays["LT"], self.dim))
        if not (np.diagonal(LT, axis1=1, axis2=2) > 0.0).all():
            raise StateFormatError("loaded covariance factor LT has a diagonal entry <= 0")
        self._arrays["factor"][slots, 0] = arrays["theta"]
        self._arrays["factor"][slots, 1:] = LT
        self._arrays["since"][slots] = 0
        self._arrays["carried"][slots] = 1
        self._stale.difference_update(slots.tolist())

    def _cache_of(self, slots: np.ndarray) -> Any:
        if not self._arrays["carried"][slots].any():
            return None  # as it always was: a refused load leaves the old statistics to be re-factorised
        return {name: self._arrays[name][slots] for name in ("factor", "since", "carried")}

    def _restore_cache(self, slots: np.ndarray, cache: Any) -> None:
        if cache is None:
            return
        for name, value in cache.items():
            self._arrays[name][slots] = value
        self._stale.difference_update(slots[cache["since"] == 0].tolist())

    def _check_loaded(self, slots: np.ndarray) -> None:
        # A Cholesky is the cheapest proof of positive definiteness; the factors themselves are
        # derived lazily (a learner that only loads and updates never needs them).
        try:
            np.linalg.cholesky(self._arrays["A"][slots])
        except np.linalg.LinAlgError as exc:
            arms = [self._arms[s] for s in slots.tolist()]
            raise StateFormatError(f"loaded precision of arm(s) {arms!r} is not positive definite") from exc

    # --- factorisation ---------------------------------------------------------------------------

    def _refresh(self, slots: np.ndarray, force: bool = False) -> None:
        """Re-factorise those of ``slots`` that are due (``force``: any with newer rows)."""
        if not self._stale:
            return
        since = self._arrays["since"][slots]
        due = since > 0 if force else since >= self.refactor_every
        if not due.any():
            return
        need = np.unique(slots[due])
        self._settle()
        try:
            theta, LT = factorise(self._arrays["A"][need], self._arrays["b"][need])
        except NotPositiveDefinite as exc:
            arms = [self._arms[s] for s in need.tolist()]
            raise NumericalError(f"precision of arm(s) {arms!r} is not positive definite") from exc
        self._arrays["factor"][need, 0] = theta
        self._arrays["factor"][need, 1:] = LT
        self._arrays["since"][need] = 0
        self._arrays["carried"][need] = 0
        self._stale.difference_update(need.tolist())

    def posterior_mean(self, arm: Any) -> np.ndarray:
        """``theta = A^-1 b`` of one arm (of the shared model: arm ``""``), freshly factorised."""
        slot = self._existing_slot(arm)
        self._refresh(np.array([slot]), force=True)
        return self._arrays["factor"][slot, 0].copy()

    def _row_means(self, X: np.ndarray, slots: np.ndarray) -> np.ndarray:
        self._refresh(np.unique(slots), force=True)  # the posterior mean as of the last row
        return np.einsum("kd,kd->k", X, self._arrays["factor"][slots, 0])

    # --- scoring ---------------------------------------------------------------------------------

    def _mean_width(self, X: np.ndarray, slots: np.ndarray, block: Block | None) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate k: ``x_k . theta_a`` and ``||L_a^T x_k||`` for its own arm a (disjoint)."""
        self._refresh(slots)
        F = self._arrays["factor"]
        if block is not None:  # the usual case: all arms (in any order) -> one stacked product on a view
            end = block.start + len(slots)
            Xb = X if block.inv is None else X.take(block.inv, axis=0)  # rows in block order
            R = np.matmul(F[block.start : end], Xb[:, :, None])[:, :, 0]
            if block.perm is not None:
                R = R.take(block.perm, axis=0)  # take: half the cost of fancy indexing at this size
        else:  # a subset of the arms: K small products rather than gathering K (d+1) x d copies
            R = np.empty((len(slots), self.dim + 1))
            for k, slot in enumerate(slots.tolist()):
                np.dot(F[slot], X[k], out=R[k])
        Y = R[:, 1:]
        return R[:, 0], np.sqrt(np.einsum("kd,kd->k", Y, Y))

    def _compiled_rule(self, K: int, rng: np.random.Generator) -> tuple[float, np.ndarray | None, int, float] | None:
        """``(coef, z, n_draws, igw)`` for ``_fastscore.choose``, on the scores
        ``mean + coef * width``: greedy when ``z`` is None and ``igw`` is 0, inverse-gap weighting
        with learning rate ``igw`` when it is positive (new arms raised by :meth:`_new_arm_rule`),
        else Thompson draws from the normals ``z`` (drawn here, as the numpy path draws them) with
        scale ``coef * width``; None when the policy has no compiled rule."""
        return None

    def _compiled_choice(self, X: np.ndarray, slots: np.ndarray, rng: np.random.Generator) -> Choice | None:
        if _fastscore is None:
            return None
        rule = self._compiled_rule(len(slots), rng)
        if rule is None:
            return None
        self._refresh(slots)
        coef, z, n_draws, igw = rule
        new_rows, new_share = self._new_arm_rule()
        p = np.empty(len(slots))
        chosen = _fastscore.choose(
            self._arrays["factor"], slots, np.ascontiguousarray(X), coef, z, n_draws, igw, self.eps0, rng.random(), p,
            self._arrays["count"], new_rows, new_share,
        )
        return Choice(p, chosen, float(p[chosen]))

    def _new_arm_rule(self) -> tuple[int, float]:
        """``(new_arm_rows, new_arm_share)`` of inverse-gap weighting's new arms (LinIGW's "New
        arms"); ``(0, 0.0)``: none."""
        return 0, 0.0

    def _shared_terms(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the one shared model: ``X theta`` (K,) and ``M = X L`` (K, d), rows ``L^T x_k``."""
        self._refresh(np.zeros(1, dtype=np.intp))
        R = X @ self._arrays["factor"][0].T
        return R[:, 0], R[:, 1:]

    def _scoring_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"theta": (self.dim,), "L": (self.dim, self.dim)}

    def _scoring_stack(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        self._refresh(slots, force=True)
        factor = self._arrays["factor"][slots]
        return {"theta": factor[:, 0].copy(), "L": np.swapaxes(factor[:, 1:], 1, 2).copy()}

    def _load_scoring_stack(self, slots: np.ndarray, arrays: Any) -> None:
        self._arrays["factor"][slots, 0] = arrays["theta"]
        self._arrays["factor"][slots, 1:] = np.swapaxes(arrays["L"], 1, 2)
        self._arrays["since"][slots] = 0
        self._arrays["carried"][slots] = 0  # a scoring view does not learn
        self._stale.difference_update(slots.tolist())

    def _drift(self, slot: int) -> Drift:
        self._settle()
        if not self._scoring_only:
            self._refresh(np.array([slot]), force=True)
        LT = self._arrays["factor"][slot, 1:]
        trace = float(np.einsum("ij,ij->", LT, LT))  # trace(A^-1) = ||L||_F^2
        if self._scoring_only:
            return Drift(trace, precision_norm_from_factor(LT))
        return Drift(trace, spectral_norm_spd(self._arrays["A"][slot]))

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        return {"dim": 4, "eps0": 0.1, "seed": 0, "prior_strength": 1.0}


class ThompsonParams:
    """``v`` (posterior scale) and ``n_draws`` (draws per decision), checked once for both
    Thompson-sampling policies (disjoint and shared)."""

    def __init__(self, dim: int, *, v: float = 1.0, n_draws: int = 64, **kwargs: Any) -> None:
        if not (v >= 0.0 and np.isfinite(v)):
            raise ValueError(f"v must be finite and >= 0, got {v!r}")
        if isinstance(n_draws, bool) or int(n_draws) != n_draws or n_draws < 1:
            raise ValueError(f"n_draws must be an int >= 1, got {n_draws!r}")
        self.v = float(v)
        self.n_draws = int(n_draws)
        super().__init__(dim, **kwargs)

"""Permutation importance of feature groups for a cross-fitted per-action reward model.

How much does predicting a logged reward from its context rely on each feature? For a
design matrix ``X`` (n, d) whose columns fall into groups (one per feature: a numeric
feature's column, a categorical feature's indicators), the logged actions and rewards:

1. **Folds.** A seeded permutation of the rows dealt round-robin into ``n_folds`` folds, as
   :func:`~learner.evaluation.reward_models.cross_fit` deals them.
2. **Reward model.** Per fold, the engine's :class:`~learner.evaluation.reward_models.PerActionModel`
   of :class:`~learner.evaluation.reward_models.Ridge` fitted on the other folds:
   ``q(x, k) = x . w_k + b_k``. The held-out loss is ``L = (1/n) sum_i (r_i - q(x_i, a_i))^2``,
   every row predicted by a model that never saw it (a feature that only fits noise does not
   lower it).
3. **Permutation.** For group g and repeat m, the held-out fold's rows of g's columns are
   shuffled among themselves (seeded), every other column kept: the rows keep their
   distribution of g but lose its link to the reward. ``L_g^m`` is the loss then, and g's
   importance is the mean rise ``drop_g = mean_m (L_g^m - L)`` (Breiman 2001; Fisher, Rudin
   and Dominici 2019's "model reliance"). Since the model is linear, shuffling rows of ``X_g``
   shuffles the rows of ``C = X_g W_g`` (n, K): each repeat costs one gather, not a refit or
   a product.

A rise near 0 (or below it: the shuffled rows fit by chance as well) means the model does
not use the feature. The result is deterministic for a given ``random_state``.

    >>> rng = np.random.default_rng(1)
    >>> n = 2000
    >>> X = rng.normal(size=(n, 2))                                  # column 0 drives the reward, 1 is noise
    >>> action = rng.integers(0, 2, n)
    >>> reward = np.where(action == 0, X[:, 0], -X[:, 0]) + rng.normal(scale=0.1, size=n)
    >>> result = permutation_importance(X, [slice(0, 1), slice(1, 2)], action, reward, n_actions=2, random_state=0)
    >>> bool(result.drop[0] > 1.5 and abs(result.drop[1]) < 0.01), result.scores().round(3).tolist()
    (True, [1.0, 0.0])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from learner.evaluation.errors import InvalidInputError
from learner.evaluation.reward_models import PerActionModel, Ridge, _check_actions, _check_reward, _folds

__all__ = ["Importance", "permutation_importance"]


@dataclass(frozen=True)
class Importance:
    """Per group: ``drop`` (the mean rise of the held-out squared error when it is shuffled)
    and ``stderr`` (its standard error over the repeats and folds); ``loss``: the held-out
    squared error unshuffled; ``rows``: n."""

    drop: np.ndarray
    stderr: np.ndarray
    loss: float
    rows: int

    def scores(self) -> np.ndarray:
        """Normalised: ``max(drop, 0) / max(drop)``, 1 for the group the model relies on most, 0
        for groups it does not use (all 0 when it relies on none)."""
        clipped = np.maximum(self.drop, 0.0)
        top = clipped.max(initial=0.0)
        return clipped / top if top > 0 else np.zeros_like(clipped)


def permutation_importance(
    X: np.ndarray,
    groups: Sequence[slice],
    action: np.ndarray,
    reward: np.ndarray,
    *,
    n_actions: int,
    n_folds: int = 5,
    repeats: int = 5,
    alpha: float = 1.0,
    random_state: int = 0,
) -> Importance:
    """The importance of each group of ``X``'s columns (``groups``: slices) for predicting
    ``reward`` from the row and its logged ``action``; see the module's doc."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise InvalidInputError(f"X must be (n, d), got shape {X.shape}")
    n, d = X.shape
    action = _check_actions(action, n, n_actions)
    reward = _check_reward(reward, n)
    if repeats < 1:
        raise InvalidInputError(f"repeats must be >= 1, got {repeats}")
    for g in groups:
        if not (0 <= (g.start or 0) < (g.stop or 0) <= d) or g.step not in (None, 1):
            raise InvalidInputError(f"group {g} is not a contiguous, non-empty slice of X's {d} columns")
    rng = np.random.default_rng(random_state)
    fold = _folds(n, n_folds, rng)  # dealt from rng, which the shuffles then go on drawing from
    loss = 0.0
    rises = np.zeros((len(groups), n_folds, repeats))  # summed squared-error rises, per fold and repeat
    for f in range(n_folds):
        held = fold == f
        W, b = _linear(PerActionModel(n_actions, Ridge(alpha)).fit(X[~held], action[~held], reward[~held]), d)
        Xh, ah, rh = X[held], action[held], reward[held]
        rows = np.arange(Xh.shape[0])
        residual = rh - ((Xh @ W)[rows, ah] + b[ah])
        loss += float(residual @ residual)
        for j, g in enumerate(groups):
            C = Xh[:, g] @ W[g]  # (n_f, K): the group's part of every action's prediction
            own = C[rows, ah]
            for m in range(repeats):
                shuffled = residual + own - C[rng.permutation(rows.size), ah]
                rises[j, f, m] = float(shuffled @ shuffled) - float(residual @ residual)
    # each repeat shuffles every fold once: its rise over all n rows is the sum over folds
    per_repeat = rises.sum(axis=1) / n
    drop = per_repeat.mean(axis=1)
    stderr = per_repeat.std(axis=1, ddof=1) / np.sqrt(repeats) if repeats > 1 else np.full(len(groups), np.nan)
    return Importance(drop=drop, stderr=stderr, loss=loss / n, rows=n)


def _linear(model: PerActionModel, d: int) -> tuple[np.ndarray, np.ndarray]:
    """The fitted per-action ridge as ``W`` (d, K) and ``b`` (K,); an action without training
    rows predicts the mean training reward (weights 0)."""
    W = np.zeros((d, model.n_actions))
    b = np.full(model.n_actions, model.fallback_)
    for k, fitted in enumerate(model.models_):
        if fitted is not None:
            W[:, k], b[k] = fitted.coef_, fitted.intercept_
    return W, b

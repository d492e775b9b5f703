"""Reward models for the model-based estimators (DM, DR, SNDR, Switch-DR, DRos).

A reward model predicts ``q(x, k)``, the expected reward of candidate k in context x, for every
logged row and every candidate: the ``estimated_rewards`` (n, K) array the estimators take. Two
layouts, chosen by the shape of the features:

- **per action** (features (n, d), e.g. :meth:`FeatureEncoder.context_matrix
  <learner.features.FeatureEncoder.context_matrix>` of a per-arm domain): one regressor per
  action, fitted on the rows that logged that action; :class:`PerActionModel`.
- **shared** (features (n, K, d), e.g. :meth:`FeatureEncoder.action_matrix
  <learner.features.FeatureEncoder.action_matrix>` per event of a shared domain, or
  :func:`one_hot_features` of a context matrix): one regressor over the rows of the logged
  (context, action) pairs, predicting every candidate's row; :class:`SharedModel`.

:func:`reward_model_features` builds either from DecisionEvents with the domain's own
:class:`~learner.features.FeatureEncoder`, so the model sees the features the learner saw.

The regressor is :class:`Ridge` (closed form, numpy) unless another one is passed: anything with
scikit-learn's ``fit(X, y)`` / ``predict(X)`` works, and is copied (``copy.deepcopy`` of the
unfitted one) for every fit.

**Cross-fitting** (:func:`cross_fit`): the rows are split into ``n_folds`` seeded folds, and each
fold's predictions come from a model fitted on the other folds only, so no row's estimated reward
was learned from its own reward (whose noise would otherwise leak into DR's correction term
``r_i - q(x_i, a_i)`` and bias it toward 0; Chernozhukov et al. 2018).

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = np.column_stack([np.ones(300), rng.normal(size=300)])
    >>> action = rng.integers(0, 2, 300)
    >>> reward = np.where(action == 0, 0.5 + 0.2 * X[:, 1], 0.3) + rng.normal(scale=0.01, size=300)
    >>> q = cross_fit(Ridge(alpha=1e-3), X, action, reward, n_actions=2, random_state=0)
    >>> q.shape, bool(np.abs(q[:, 1] - 0.3).max() < 0.01)
    ((300, 2), True)
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import numpy as np

from learner.evaluation.errors import InvalidInputError
from learner.features import FeatureEncoder

__all__ = ["PerActionModel", "Regressor", "Ridge", "SharedModel", "cross_fit", "cross_fit_rows", "one_hot_features",
           "reward_model_features"]


class Regressor(Protocol):
    """What a reward model's regressor must do (scikit-learn's estimator interface)."""

    def fit(self, X: np.ndarray, y: np.ndarray) -> Any: ...

    def predict(self, X: np.ndarray) -> np.ndarray: ...


class Ridge:
    """Ridge regression in closed form, with an unpenalised intercept (as scikit-learn's ``Ridge``).

    Minimises ``||y - X w - b||^2 + alpha ||w||^2``: with ``Xc``, ``yc`` centred on their means,
    ``w = (Xc^T Xc + alpha I)^-1 Xc^T yc`` (or ``Xc^T (Xc Xc^T + alpha I)^-1 yc`` when there are
    fewer rows than features, the same solution at a smaller size) and ``b = mean(y) - mean(X) w``.
    A constant column (such as the hashed features' intercept slot) gets weight 0.

        >>> X = np.array([[0.0], [1.0], [2.0]])
        >>> model = Ridge(alpha=1.0).fit(X, np.array([1.0, 3.0, 5.0]))
        >>> model.coef_.tolist(), model.intercept_        # Xc = (-1, 0, 1), yc = (-2, 0, 2): w = 4 / (2 + 1)
        ([1.3333333333333333], 1.6666666666666667)
    """

    def __init__(self, alpha: float = 1.0, fit_intercept: bool = True) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0.0:
            raise InvalidInputError(f"alpha must be a number >= 0, got {alpha!r}")
        self.alpha = float(alpha)
        self.fit_intercept = bool(fit_intercept)

    def __repr__(self) -> str:
        return f"Ridge(alpha={self.alpha!r}, fit_intercept={self.fit_intercept!r})"

    def fit(self, X: np.ndarray, y: np.ndarray) -> Ridge:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if X.ndim != 2 or y.shape != (X.shape[0],) or X.shape[0] == 0:
            raise InvalidInputError(f"Ridge.fit needs X (n, d) and y (n,) with n >= 1, got {X.shape} and {y.shape}")
        if self.fit_intercept:
            x_mean, y_mean = X.mean(axis=0), float(y.mean())
            Xc, yc = X - x_mean, y - y_mean
        else:
            x_mean, y_mean = np.zeros(X.shape[1]), 0.0
            Xc, yc = X, y
        n, d = Xc.shape
        if self.alpha == 0.0:
            coef = np.linalg.lstsq(Xc, yc, rcond=None)[0]
        elif n >= d:
            gram = Xc.T @ Xc
            gram.flat[:: d + 1] += self.alpha
            coef = np.linalg.solve(gram, Xc.T @ yc)
        else:
            kernel = Xc @ Xc.T
            kernel.flat[:: n + 1] += self.alpha
            coef = Xc.T @ np.linalg.solve(kernel, yc)
        self.coef_ = coef
        self.intercept_ = y_mean - float(x_mean @ coef)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X, dtype=np.float64) @ self.coef_ + self.intercept_


def _clone(regressor: Any) -> Any:
    if not (callable(getattr(regressor, "fit", None)) and callable(getattr(regressor, "predict", None))):
        raise InvalidInputError(f"a regressor needs fit(X, y) and predict(X), got {type(regressor).__name__}")
    return copy.deepcopy(regressor)


def _check_actions(action: Any, n: int, n_actions: int) -> np.ndarray:
    action = np.asarray(action)
    if action.ndim != 1 or action.dtype == np.bool_ or not np.issubdtype(action.dtype, np.integer):
        raise InvalidInputError(
            f"action must be a 1-dimensional array of integer indices, got {action.dtype} {action.shape}"
        )
    if action.shape[0] != n:
        raise InvalidInputError(f"action has {action.shape[0]} rows, but features have {n}")
    if n and (action.min() < 0 or action.max() >= n_actions):
        raise InvalidInputError(f"action must be in [0, {n_actions}), got values from {action.min()} to {action.max()}")
    return action.astype(np.intp, copy=False)


def _check_reward(reward: Any, n: int) -> np.ndarray:
    reward = np.asarray(reward, dtype=np.float64)
    if reward.shape != (n,):
        raise InvalidInputError(f"reward has shape {reward.shape}, but features have {n} rows")
    if not np.isfinite(reward).all():
        raise InvalidInputError("reward must be finite")
    return reward


class PerActionModel:
    """One regressor per action over the context rows: ``q(x, k) = f_k(x)``.

    ``fit(X (n, d), action, reward)`` fits ``f_k`` on the rows that logged action k; an action no
    training row logged predicts the mean training reward (nothing better is known of it).
    ``predict(X (m, d))`` returns (m, K).

        >>> X = np.array([[1.0], [2.0], [1.0], [2.0]])
        >>> model = PerActionModel(3, Ridge(alpha=0.0)).fit(X, np.array([0, 0, 1, 1]), np.array([1.0, 2.0, 5.0, 5.0]))
        >>> model.predict(np.array([[3.0]])).round(12).tolist()        # action 2 never logged: mean 3.25
        [[3.0, 5.0, 3.25]]
    """

    def __init__(self, n_actions: int, regressor: Any | None = None) -> None:
        if isinstance(n_actions, bool) or not isinstance(n_actions, (int, np.integer)) or n_actions < 1:
            raise InvalidInputError(f"n_actions must be an int >= 1, got {n_actions!r}")
        self.n_actions = int(n_actions)
        self.regressor = Ridge() if regressor is None else regressor
        _clone(self.regressor)  # fail now, not at the first fit

    def fit(self, X: Any, action: Any, reward: Any) -> PerActionModel:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise InvalidInputError(f"PerActionModel needs features of shape (n, d), got {X.shape}")
        action = _check_actions(action, X.shape[0], self.n_actions)
        reward = _check_reward(reward, X.shape[0])
        if X.shape[0] == 0:
            raise InvalidInputError("PerActionModel.fit needs at least one row")
        self.fallback_ = float(reward.mean())
        self.models_: list[Any | None] = []
        for k in range(self.n_actions):  # one fit per action (K fits), never a loop over rows
            mine = action == k
            self.models_.append(_clone(self.regressor).fit(X[mine], reward[mine]) if mine.any() else None)
        return self

    def predict(self, X: Any) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise InvalidInputError(f"PerActionModel needs features of shape (m, d), got {X.shape}")
        out = np.empty((X.shape[0], self.n_actions))
        for k, model in enumerate(self.models_):
            out[:, k] = self.fallback_ if model is None else np.asarray(model.predict(X), dtype=np.float64).reshape(-1)
        return out


class SharedModel:
    """One regressor over per-(row, action) feature rows: ``q(x, k) = f(phi(x, k))``.

    ``fit(X (n, K, d), action, reward)`` fits ``f`` on the logged rows ``X[i, action[i]]``;
    ``predict(X (m, K, d))`` returns ``f`` of every candidate's row, (m, K).

        >>> X = np.array([[[1.0, 0.0], [0.0, 1.0]]] * 4)              # one-hot actions, no context
        >>> model = SharedModel(Ridge(alpha=0.0, fit_intercept=False))
        >>> model = model.fit(X, np.array([0, 0, 1, 1]), np.array([1.0, 0.0, 1.0, 1.0]))
        >>> model.predict(X[:1]).round(12).tolist()
        [[0.5, 1.0]]
    """

    def __init__(self, regressor: Any | None = None) -> None:
        self.regressor = Ridge() if regressor is None else regressor
        _clone(self.regressor)

    def fit(self, X: Any, action: Any, reward: Any) -> SharedModel:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 3:
            raise InvalidInputError(f"SharedModel needs features of shape (n, K, d), got {X.shape}")
        action = _check_actions(action, X.shape[0], X.shape[1])
        reward = _check_reward(reward, X.shape[0])
        self.model_ = _clone(self.regressor).fit(X[np.arange(X.shape[0]), action], reward)
        return self

    def predict(self, X: Any) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 3:
            raise InvalidInputError(f"SharedModel needs features of shape (m, K, d), got {X.shape}")
        m, k, d = X.shape
        return np.asarray(self.model_.predict(X.reshape(m * k, d)), dtype=np.float64).reshape(m, k)


def one_hot_features(context: Any, n_actions: int, *, interactions: bool = False) -> np.ndarray:
    """(n, K, d + K) shared-model rows from an (n, d) context matrix: row k is the context
    followed by the one-hot of action k (OBP's default ``action_context``). With
    ``interactions`` also the context times that one-hot, (n, K, d + K + d K), so a linear model
    can give every action its own slope.

        >>> one_hot_features(np.array([[2.0]]), 2).tolist()
        [[[2.0, 1.0, 0.0], [2.0, 0.0, 1.0]]]
    """
    context = np.asarray(context, dtype=np.float64)
    if context.ndim != 2:
        raise InvalidInputError(f"context must be 2-dimensional (n, d), got shape {context.shape}")
    n, d = context.shape
    eye = np.eye(n_actions)
    parts = [np.broadcast_to(context[:, None, :], (n, n_actions, d)), np.broadcast_to(eye, (n, n_actions, n_actions))]
    if interactions:
        parts.append((context[:, None, None, :] * eye[None, :, :, None]).reshape(n, n_actions, n_actions * d))
    return np.concatenate(parts, axis=2)


def reward_model_features(encoder: FeatureEncoder, events: Iterable[Mapping[str, Any]]) -> np.ndarray:
    """Reward-model features of DecisionEvent-like mappings (``context``, ``actions``), hashed by
    the domain's own :class:`~learner.features.FeatureEncoder`: (n, d) context vectors for a
    per-arm domain (for :class:`PerActionModel`), (n, K, d) candidate rows for a shared one (for
    :class:`SharedModel`; every event must offer the same number K of candidates, in the order of
    ``action_dist``'s columns).

        >>> from learner.features import FeatureConfig
        >>> events = [{"context": {"numeric": {"x": 1.0}}, "actions": [{"id": "a"}, {"id": "b"}]}] * 3
        >>> reward_model_features(FeatureEncoder(FeatureConfig(dimension=8, normalize=False)), events).shape
        (3, 8)
        >>> reward_model_features(FeatureEncoder(FeatureConfig(dimension=8, shared=True, normalize=False)), events).shape
        (3, 2, 8)
    """
    events = list(events)
    if not encoder.config.shared:
        return encoder.context_matrix(event.get("context") or {} for event in events)
    d = encoder.dimension
    if not events:
        return np.zeros((0, 0, d))
    k = len(events[0]["actions"])
    out = np.empty((len(events), k, d))
    for i, event in enumerate(events):  # the encoder's unit is one event's candidates
        actions = event["actions"]
        if len(actions) != k:
            raise InvalidInputError(f"event {i} has {len(actions)} candidate actions, but the first has {k}")
        out[i] = encoder.action_matrix(event.get("context") or {}, actions)
    return out


def cross_fit(
    model: Any,
    features: Any,
    action: Any,
    reward: Any,
    *,
    n_actions: int | None = None,
    n_folds: int = 5,
    random_state: int | np.random.Generator | None = None,
) -> np.ndarray:
    """Cross-fitted ``estimated_rewards`` (n, K): each row predicted by a model fitted without
    its fold.

    ``model``: a :class:`PerActionModel`, a :class:`SharedModel`, or a bare regressor (None:
    :class:`Ridge` ``(alpha=1)``), which is wrapped in the layout the features' shape calls for
    (per action for (n, d), then ``n_actions`` is required; shared for (n, K, d)). Folds: a seeded permutation of the rows
    dealt round-robin into ``n_folds`` folds of equal size (within one row), ``n_folds`` in
    ``[2, n]``.
    """
    X = np.asarray(features, dtype=np.float64)
    if X.ndim not in (2, 3):
        raise InvalidInputError(f"features must be (n, d) per action or (n, K, d) shared, got shape {X.shape}")
    n = X.shape[0]
    if isinstance(model, (PerActionModel, SharedModel)):
        template = model
    elif X.ndim == 2:
        if n_actions is None:
            raise InvalidInputError("per-action features (n, d) need n_actions (the K of action_dist)")
        template = PerActionModel(n_actions, model)
    else:
        template = SharedModel(model)
    if isinstance(template, PerActionModel) and X.ndim != 2:
        raise InvalidInputError(f"PerActionModel needs features of shape (n, d), got {X.shape}")
    if isinstance(template, SharedModel) and X.ndim != 3:
        raise InvalidInputError(f"SharedModel needs features of shape (n, K, d), got {X.shape}")
    k = template.n_actions if isinstance(template, PerActionModel) else X.shape[1]
    if n_actions is not None and n_actions != k:
        raise InvalidInputError(f"n_actions is {n_actions}, but the model or features have {k} actions")
    action = _check_actions(action, n, k)
    reward = _check_reward(reward, n)
    fold = _folds(n, n_folds, random_state)
    out = np.empty((n, k))
    for f in range(n_folds):
        held_out = fold == f
        fitted = copy.deepcopy(template).fit(X[~held_out], action[~held_out], reward[~held_out])
        out[held_out] = fitted.predict(X[held_out])
    return out


def cross_fit_rows(
    acted: Any,
    candidate_rows: Any,
    candidates: Any,
    reward: Any,
    *,
    regressor: Any | None = None,
    n_folds: int = 5,
    random_state: int | np.random.Generator | None = None,
) -> np.ndarray:
    """Cross-fitted ``estimated_rewards`` (n, K) of a shared model's log, whose rows offer
    different candidates: one regressor (None: :class:`Ridge` ``(alpha=1)``) fitted on the
    acted rows ``acted`` (n, d) of the other folds predicts every candidate's own row.

    ``candidate_rows[i]`` (k_i, d) are row i's candidates' rows in the order of its columns
    ``np.flatnonzero(candidates[i])`` (``LoggedBandit.candidate_rows``); columns a row does not
    offer are 0 (no distribution puts mass there). Folds as :func:`cross_fit` deals them.

        >>> acted = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
        >>> rows = np.empty(4, dtype=object)
        >>> for i in range(4):
        ...     rows[i] = np.array([[1.0, 0.5], [1.0, 1.5]])
        >>> mask = np.array([[True, True, False]] * 4)
        >>> q = cross_fit_rows(acted, rows, mask, 2 * acted[:, 1], regressor=Ridge(alpha=0.0), n_folds=2, random_state=0)
        >>> q.round(6).tolist()[0]
        [1.0, 3.0, 0.0]
    """
    X = np.asarray(acted, dtype=np.float64)
    mask = np.asarray(candidates, dtype=bool)
    n = X.shape[0]
    reward = _check_reward(reward, n)
    if X.ndim != 2 or mask.shape[0] != n or len(candidate_rows) != n:
        raise InvalidInputError(f"cross_fit_rows needs acted (n, d), candidates (n, K) and n candidate row blocks, got "
                                f"{X.shape}, {mask.shape} and {len(candidate_rows)}")  # fmt: skip
    template = Ridge() if regressor is None else regressor
    fold = _folds(n, n_folds, random_state)
    out = np.zeros(mask.shape)
    for f in range(n_folds):
        held = np.flatnonzero(fold == f)
        model = _clone(template).fit(X[fold != f], reward[fold != f])
        blocks = [np.asarray(candidate_rows[i], dtype=np.float64) for i in held]
        predicted = np.asarray(model.predict(np.vstack(blocks)), dtype=np.float64).reshape(-1)
        at = 0
        for i, block in zip(held, blocks):
            out[i, np.flatnonzero(mask[i])] = predicted[at : at + len(block)]
            at += len(block)
    return out


def _folds(n: int, n_folds: int, random_state: int | np.random.Generator | None) -> np.ndarray:
    """Each row's fold: a seeded permutation of the rows dealt round-robin into ``n_folds``."""
    if isinstance(n_folds, bool) or not isinstance(n_folds, int) or not 2 <= n_folds <= n:
        raise InvalidInputError(f"n_folds must be an int in [2, n={n}], got {n_folds!r}")
    fold = np.empty(n, dtype=np.intp)
    fold[np.random.default_rng(random_state).permutation(n)] = np.arange(n) % n_folds
    return fold

"""Off-policy evaluation: what a policy would have earned on a log another policy collected.

Pure numpy over Open Bandit Pipeline's arrays (``reward`` (n,), ``action`` (n,), ``pscore`` (n,),
``action_dist`` (n, K), ``estimated_rewards`` (n, K)); readers turn the joined log into these
arrays, candidates' decision code into ``action_dist``. The steps, in order:

1. **Reward model** (for DM and the doubly robust family): :func:`cross_fit` a
   :class:`PerActionModel` or :class:`SharedModel` (ridge by default, any ``fit/predict``
   regressor otherwise) on features from :func:`reward_model_features` (the domain's own hashed
   features) to get ``estimated_rewards``, each row predicted by a model that never saw it.
2. **Estimator**: :class:`IPS`, :class:`SNIPS`, :class:`DM`, :class:`DR`, :class:`SNDR`,
   :class:`SwitchDR`, :class:`DRos` (or :func:`make_estimator` by name); each gives the
   estimate and its per-row :class:`Terms`.
3. **Interval and diagnostics**: :func:`evaluate` returns an :class:`Estimate` (estimate, bounds
   by CLT, empirical Bernstein or a seeded bootstrap, ESS, max weight, share of zero weights,
   warnings) that prints and serialises.

    >>> import numpy as np
    >>> from learner.evaluation import DR, cross_fit, evaluate
    >>> rng = np.random.default_rng(7)
    >>> n, k = 5000, 3
    >>> x = rng.normal(size=(n, 2))
    >>> action = rng.integers(0, k, n)                                    # uniform logging
    >>> reward = 0.5 + 0.1 * x[:, 0] * (action - 1) + rng.normal(scale=0.1, size=n)
    >>> q = cross_fit(None, x, action, reward, n_actions=k, random_state=0)
    >>> greedy = np.eye(k)[np.where(x[:, 0] > 0, 2, 0)]                   # true value 0.5 + 0.1 E|x0|
    >>> result = evaluate(DR(), reward, action, np.full(n, 1 / k), greedy, q)
    >>> print(result.estimator, round(result.estimate, 2), result.lower < 0.5 + 0.1 * np.sqrt(2 / np.pi) < result.upper)
    dr 0.58 True
    >>> sorted(result.to_dict())[:4]
    ['ess', 'estimate', 'estimator', 'level']
"""

from __future__ import annotations

from learner.evaluation._inputs import LoggedArrays, check_inputs
from learner.evaluation.errors import EvaluationError, EvaluationWarning, InvalidInputError, LowESSWarning
from learner.evaluation.estimators import (
    DM,
    DR,
    ESTIMATORS,
    IPS,
    SNDR,
    SNIPS,
    DRos,
    Estimator,
    SwitchDR,
    Terms,
    make_estimator,
)
from learner.evaluation.intervals import (
    METHODS,
    Estimate,
    WeightDiagnostics,
    bernstein_interval,
    bootstrap_distribution,
    bootstrap_interval,
    evaluate,
    gaussian_interval,
    weight_diagnostics,
)
from learner.evaluation.importance import Importance, permutation_importance
from learner.evaluation.logged import LoggedBandit
from learner.evaluation.candidates import AlwaysArm, Candidate, Fixed, Logging, Progressive, Recommended, Uniform, logged_choices
from learner.evaluation.reward_models import (
    PerActionModel,
    Ridge,
    SharedModel,
    cross_fit,
    one_hot_features,
    reward_model_features,
)

__all__ = [
    "AlwaysArm",
    "Candidate",
    "Fixed",
    "Logging",
    "LoggedBandit",
    "Progressive",
    "Recommended",
    "Uniform",
    "logged_choices",
    "DM",
    "DR",
    "ESTIMATORS",
    "IPS",
    "METHODS",
    "SNDR",
    "SNIPS",
    "DRos",
    "Estimate",
    "Estimator",
    "EvaluationError",
    "EvaluationWarning",
    "Importance",
    "InvalidInputError",
    "LoggedArrays",
    "LowESSWarning",
    "PerActionModel",
    "Ridge",
    "SharedModel",
    "SwitchDR",
    "Terms",
    "WeightDiagnostics",
    "bernstein_interval",
    "bootstrap_distribution",
    "bootstrap_interval",
    "check_inputs",
    "cross_fit",
    "evaluate",
    "gaussian_interval",
    "make_estimator",
    "one_hot_features",
    "permutation_importance",
    "reward_model_features",
    "weight_diagnostics",
]

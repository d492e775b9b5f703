"""Bandit policies over plain numpy statistics: the same code learns in the worker and scores in
the SDK.

Every policy is one module over :class:`~learner.policies.base.Policy`, which owns arms, priors,
forgetting, batching, the exploration floor, the rng and the state format. Build one by name::

    >>> import numpy as np
    >>> from learner.policies import POLICIES, make_policy
    >>> sorted(POLICIES)
    ['beta_ts', 'epsilon_greedy', 'lin_igw', 'lin_ts', 'lin_ucb', 'portfolio', 'shared_lin_ts', 'shared_lin_ucb', 'softmax', 'ucb1']
    >>> policy = make_policy("lin_ts", dim=4, v=0.3, seed=1)
    >>> touched = policy.update_batch(np.eye(4), ["a", "b", "a", "c"], [1.0, 0.5, 0.2, 0.0])
    >>> blobs = {arm: policy.arm_state_bytes(arm) for arm in touched}      # one store value each
    >>> snapshot = policy.scoring_view().to_bytes()                         # what the SDK pulls
    >>> sdk = Policy.from_bytes(snapshot)
    >>> choice = sdk.probabilities(np.tile([1.0, 0.0, 0.0, 0.0], (3, 1)), ["a", "b", "c"], rng=7)
    >>> round(float(choice.probabilities.sum()), 12), bool(choice.probability == choice.probabilities[choice.chosen])
    (1.0, True)
"""

from __future__ import annotations

from typing import Any

from learner.policies.base import FORMAT_MAJOR, SHARED_ARM, Choice, Drift, Policy, Prior, canonical_arm
from learner.policies.beta_ts import BetaTS
from learner.policies.epsilon_greedy import EpsilonGreedy
from learner.policies.errors import NumericalError, PolicyError, ScoringOnlyError, StateFormatError
from learner.policies.lin_igw import LinIGW
from learner.policies.lin_ts import LinTS
from learner.policies.lin_ucb import LinUCB
from learner.policies.portfolio import Portfolio
from learner.policies.shared_lin_ts import SharedLinTS
from learner.policies.shared_lin_ucb import SharedLinUCB
from learner.policies.softmax import Softmax
from learner.policies.ucb1 import UCB1

#: Every policy by its registry name (the ``policy`` field of PosteriorShard and state headers).
POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (LinUCB, LinTS, LinIGW, SharedLinUCB, SharedLinTS, BetaTS, UCB1, EpsilonGreedy, Softmax, Portfolio)
}


def make_policy(name: str, **params: Any) -> Policy:
    """A new policy by registry name, e.g. ``make_policy("lin_ucb", dim=32, alpha=0.5)``."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return cls(**params)


__all__ = [
    "FORMAT_MAJOR",
    "POLICIES",
    "SHARED_ARM",
    "BetaTS",
    "Choice",
    "Drift",
    "EpsilonGreedy",
    "LinIGW",
    "LinTS",
    "LinUCB",
    "NumericalError",
    "Policy",
    "PolicyError",
    "Portfolio",
    "Prior",
    "ScoringOnlyError",
    "SharedLinTS",
    "SharedLinUCB",
    "Softmax",
    "StateFormatError",
    "UCB1",
    "canonical_arm",
    "make_policy",
]

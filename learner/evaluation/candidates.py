"""Counterfactual candidates: each gives ``action_dist (n, K)``, its probability of every action
on every logged row, from its own decision code.

* :class:`Uniform` - every candidate of the row alike;
* :class:`Logging` - the logged distribution itself (its value is the on-policy mean, the
  reference every other candidate is read against);
* :class:`AlwaysArm` - one action wherever it was a candidate (uniform elsewhere);
* :class:`Fixed` - a trained policy (a snapshot's scoring view, say), scored on each row with
  :meth:`~learner.policies.base.Policy.probabilities`, the SDK's decide step. Thompson
  sampling's probabilities are the share of ``n_draws`` seeded posterior draws that pick each
  action (a Monte Carlo estimate, standard error at most ``0.5 / sqrt(n_draws)``);
* :class:`Progressive` - a policy spec (name and hyper-parameters) trained on the log in time
  order, in batches like the learner's: each batch is scored by the model of the rows before
  it and then learned, so no row is scored by a model that learned from it (progressive
  validation, as Vowpal Wabbit's ``--explore_eval`` and Li et al.'s replay avoid the same bias).
  It learns every logged row, as the learner does whatever decided them. A ``portfolio``
  also chooses who acts as the publisher does: each batch, scored by its members before they
  learn it, goes into their paired estimate;
* :class:`Recommended` - a shadow policy: the distribution the SDK logged for it beside each
  decision (its shadow snapshot, or the policy in shadow mode). It needs no model and no live
  traffic of its own, and is evaluated on the rows that carry its recommendation
  (:meth:`Candidate.rows`), of one snapshot version when one is named.

Per-arm models score a row's context vector for each candidate. Shared-model policies need
every candidate's own feature row, which the joined log does not carry (it keeps the acted
row): they are refused by name.

    >>> import numpy as np
    >>> from learner.evaluation.logged import LoggedBandit
    >>> rng = np.random.default_rng(0)
    >>> rows = [{"event_id": f"e{i}", "tenant": "default", "workspace": "main", "domain": "d",
    ...          "actions": ["a", "b"], "probabilities": [0.5, 0.5], "arm_index": i % 2,
    ...          "reward": float(i % 2), "features": [1.0, float(rng.normal())], "decision_time": i}
    ...         for i in range(200)]
    >>> log = LoggedBandit.from_updates(rows)
    >>> AlwaysArm("b").action_dist(log)[0].tolist(), Uniform().action_dist(log)[0].tolist()
    ([0.0, 1.0], [0.5, 0.5])
    >>> dist = Progressive("lin_ucb", {"alpha": 0.1, "eps0": 0.0}, batch_size=20).action_dist(log)
    >>> dist[:20].tolist() == [[0.5, 0.5]] * 20, round(float(dist[100:, 1].mean()), 2)   # learns b pays
    (True, 1.0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from learner.evaluation.errors import InvalidInputError
from learner.evaluation.logged import LoggedBandit
from learner.policies import POLICIES, Policy, Portfolio, make_policy

__all__ = ["AlwaysArm", "Candidate", "Fixed", "Logging", "Progressive", "Recommended", "Uniform"]


class Candidate:
    """A policy to evaluate on a log: a name and its ``action_dist``."""

    name: str = "candidate"

    def action_dist(self, log: LoggedBandit, progress: Callable[[int], None] | None = None) -> np.ndarray:
        raise NotImplementedError

    def rows(self, log: LoggedBandit) -> np.ndarray | None:
        """The rows the candidate can be evaluated on (a boolean mask); None: all of them."""
        return None

    def check(self, log: LoggedBandit) -> None:
        """Raise ValueError, saying why, when the candidate cannot score ``log`` at all."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Uniform(Candidate):
    name = "uniform"

    def action_dist(self, log: LoggedBandit, progress=None) -> np.ndarray:
        c = log.candidates.astype(float)
        return c / c.sum(axis=1, keepdims=True)


class Logging(Candidate):
    name = "logging"

    def action_dist(self, log: LoggedBandit, progress=None) -> np.ndarray:
        return log.logged_dist.copy()


@dataclass
class AlwaysArm(Candidate):
    arm: str

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"always:{self.arm}"

    def action_dist(self, log: LoggedBandit, progress=None) -> np.ndarray:
        dist = Uniform().action_dist(log)
        if self.arm in log.actions:
            k = log.actions.index(self.arm)
            there = log.candidates[:, k]
            dist[there] = 0.0
            dist[there, k] = 1.0
        return dist


def _check_rows(policy: Policy | str, log: LoggedBandit) -> None:
    """A shared model scores every candidate's own row: the log must carry them (the join
    writes them for a shared model's domain), and a per-arm model needs the context's."""
    cls = POLICIES[policy] if isinstance(policy, str) else type(policy)
    if cls.shared and log.candidate_rows is None:
        raise ValueError(
            f"policy {cls.name!r} is a shared model: it scores every candidate's own feature row, and this log keeps "
            "only the acted one (a per-arm model's log); evaluate it on a shared model's log"
        )
    if not cls.shared and log.candidate_rows is not None:
        raise ValueError(f"policy {cls.name!r} is a per-arm model and this is a shared model's log (its rows are "
                         "the acted candidates', not the context's); evaluate a shared policy on it")  # fmt: skip


def _score_rows(policy: Policy, log: LoggedBandit, rows: range, rng: np.random.Generator, out: np.ndarray) -> None:
    """``out[i]`` = the policy's distribution over row i's candidates (the SDK's decide step)."""
    actions = log.actions
    shared = log.candidate_rows if policy.shared else None
    for i in rows:
        columns = np.flatnonzero(log.candidates[i])
        if shared is not None:
            X = shared[i]
        else:
            X = np.ascontiguousarray(np.broadcast_to(log.context[i], (len(columns), log.context.shape[1])))
        choice = policy.probabilities(X, [actions[k] for k in columns], rng)
        out[i, columns] = choice.probabilities


def logged_choices(log: LoggedBandit, rows: range) -> tuple[list[list[str]], list[int]]:
    """Each row's candidate ids and the position of the logged action among them."""
    candidates, chosen = [], []
    for i in rows:
        columns = np.flatnonzero(log.candidates[i])
        candidates.append([log.actions[k] for k in columns])
        chosen.append(int(np.searchsorted(columns, log.action[i])))
    return candidates, chosen


@dataclass
class Fixed(Candidate):
    """A trained policy, unchanged over the log (e.g. a snapshot's scoring view)."""

    policy: Policy
    label: str = "fixed"
    seed: int = 0

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.label

    def check(self, log: LoggedBandit) -> None:
        _check_rows(self.policy, log)

    def action_dist(self, log: LoggedBandit, progress=None) -> np.ndarray:
        _check_rows(self.policy, log)
        out = np.zeros((len(log), log.n_actions))
        rng = np.random.default_rng(self.seed)
        step = 5000
        for start in range(0, len(log), step):
            _score_rows(self.policy, log, range(start, min(start + step, len(log))), rng, out)
            if progress is not None:
                progress(min(start + step, len(log)))
        return out


@dataclass
class Progressive(Candidate):
    """A policy spec trained progressively on the log (see the module's doc)."""

    policy: str
    params: Mapping[str, Any] = field(default_factory=dict)
    batch_size: int = 200
    seed: int = 0
    label: str | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; known: {', '.join(sorted(POLICIES))}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")

    @property
    def name(self) -> str:  # type: ignore[override]
        if self.label:
            return self.label
        knobs = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.policy}({knobs})" if knobs else self.policy

    def check(self, log: LoggedBandit) -> None:
        _check_rows(self.policy, log)

    def action_dist(self, log: LoggedBandit, progress=None) -> np.ndarray:
        _check_rows(self.policy, log)
        model = make_policy(self.policy, dim=log.dimension, seed=self.seed, **dict(self.params))
        rng = np.random.default_rng(self.seed)
        out = np.zeros((len(log), log.n_actions))
        arms = np.array(log.actions, dtype=object)[log.action]
        for start in range(0, len(log), self.batch_size):
            rows = range(start, min(start + self.batch_size, len(log)))
            model.age()  # as a snapshot scores: arms nobody played brought to the newest time (half_life_s)
            _score_rows(model, log, rows, rng, out)  # the model of the rows before: never its own
            if isinstance(model, Portfolio):  # chooses who acts from the batch, as the publisher does
                model.judge(log.context[rows.start : rows.stop], *logged_choices(log, rows), log.pscore[rows.start : rows.stop],
                            log.reward[rows.start : rows.stop], rng=rng)  # fmt: skip
            model.update_batch(log.context[rows.start : rows.stop], list(arms[rows.start : rows.stop]),
                               log.reward[rows.start : rows.stop], times=log.decision_time[rows.start : rows.stop])
            if progress is not None:
                progress(rows.stop)
        return out


@dataclass
class Recommended(Candidate):
    """A shadow policy, from the distributions logged for it (see the module's doc).

    ``version`` None takes every row that carries a recommendation, whichever snapshot gave
    it; a version, only that snapshot's rows.
    """

    version: str | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        return "shadow" if self.version is None else f"shadow:{self.version}"

    def rows(self, log: LoggedBandit) -> np.ndarray:
        keep = log.has_recommendation
        if self.version is not None:
            keep = keep & (log.recommended_version == self.version)
        if not keep.any():
            which = "" if self.version is None else f" of snapshot {self.version}"
            versions = sorted(set(log.recommended_version[log.has_recommendation]))
            raise InvalidInputError(
                f"no row of the log carries a shadow recommendation{which} "
                f"(versions recommending: {', '.join(versions) if versions else 'none'})"
            )
        return keep

    def action_dist(self, log: LoggedBandit, progress=None) -> np.ndarray:
        missing = int(len(log) - self.rows(log).sum())
        if missing:
            raise InvalidInputError(
                f"{missing} of {len(log)} rows carry no recommendation of {self.name!r}: "
                "evaluate it on log.select(candidate.rows(log))"
            )
        return log.recommended_dist.copy()

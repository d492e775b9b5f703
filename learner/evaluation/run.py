"""Many candidates, many estimators, one log: the run behind ``banditstream evaluate`` and the
promotion gate.

One cross-fitted reward model (:func:`~learner.evaluation.reward_models.cross_fit`; for a shared
model's log, :func:`~learner.evaluation.reward_models.cross_fit_rows` over every candidate's own
row) serves every model-based estimator; every candidate's ``action_dist`` comes from its own decision code and
every estimator gives an :class:`~learner.evaluation.intervals.Estimate`, all on the same rows.
Estimators are named by spec: ``ips``, ``ips:50`` (clipped at 50), ``switch_dr:20``,
``dros:10`` (its shrinkage), ``snips``, ``dm``, ``dr``, ``sndr``. A candidate that can only be
scored on some rows (a shadow policy, on the rows that logged its recommendation) is estimated
on those, and its result says how many (:attr:`CandidateResult.rows`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from learner.evaluation.candidates import Candidate
from learner.evaluation.errors import InvalidInputError
from learner.evaluation.estimators import ESTIMATORS, make_estimator
from learner.evaluation.intervals import Estimate, evaluate
from learner.evaluation.logged import LoggedBandit
from learner.evaluation.reward_models import cross_fit, cross_fit_rows

__all__ = ["CandidateResult", "Evaluation", "estimator_from_spec", "evaluate_candidates"]

#: estimators that need the reward model's predictions
MODEL_BASED = {"dm", "dr", "sndr", "switch_dr", "dros"}


def _value(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise InvalidInputError(f"estimator parameter {text!r} is not a number") from None


@dataclass
class CandidateResult:
    name: str
    estimates: dict[str, Estimate]
    seconds: float
    #: the rows its estimates rest on: all of the log's, or fewer (see :meth:`Candidate.rows`)
    rows: int = 0


@dataclass
class Evaluation:
    scope: tuple[str, str, str]
    rows: int
    actions: list[str]
    on_policy_value: float
    results: list[CandidateResult]
    estimators: list[str]
    seconds: dict[str, float] = field(default_factory=dict)

    def ranked(self, estimator: str | None = None) -> list[CandidateResult]:
        """Candidates by their estimate (best first) under ``estimator`` (default the first)."""
        name = estimator or self.estimators[0]
        return sorted(self.results, key=lambda r: -r.estimates[name].estimate)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tenant": self.scope[0], "workspace": self.scope[1], "domain": self.scope[2], "rows": self.rows,
            "actions": self.actions, "on_policy_value": self.on_policy_value, "estimators": self.estimators,
            "candidates": [{"name": r.name, "rows": r.rows, "seconds": round(r.seconds, 3),
                            "estimates": {k: e.to_dict() for k, e in r.estimates.items()}} for r in self.ranked()],
            "seconds": self.seconds,
        }  # fmt: skip


def evaluate_candidates(
    log: LoggedBandit,
    candidates: Sequence[Candidate],
    *,
    estimators: Sequence[str] = ("ips", "snips", "dr"),
    method: str = "gaussian",
    level: float = 0.95,
    n_resamples: int = 1000,
    seed: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
) -> Evaluation:
    """Every candidate under every estimator, on the same rows, or on the rows a candidate can
    be scored on (see the module's doc). ``progress(candidate_name, rows_done, rows)`` while
    each candidate is scored."""
    built = {spec: estimator_from_spec(spec) for spec in estimators}
    if not built:
        raise InvalidInputError("no estimator given")
    seconds: dict[str, float] = {}
    started = time.monotonic()
    q = None
    if MODEL_BASED & {spec.partition(":")[0] for spec in estimators}:
        if log.candidate_rows is not None:  # a shared model's log: one model over every candidate's own row
            q = cross_fit_rows(log.context, log.candidate_rows, log.candidates, log.reward, random_state=seed)
        else:
            q = cross_fit(None, log.context, log.action, log.reward, n_actions=log.n_actions, random_state=seed)
    seconds["reward_model"] = time.monotonic() - started
    results = []
    for candidate in candidates:
        began = time.monotonic()
        keep = candidate.rows(log)
        rows, q_rows = (log, q) if keep is None else (log.select(keep), None if q is None else q[keep])
        n = len(rows)
        dist = candidate.action_dist(rows, None if progress is None else lambda done, c=candidate: progress(c.name, done, n))
        if progress is not None:
            progress(candidate.name, n, n)
        estimates = {}
        for name in estimators:
            with warnings.catch_warnings(record=True):  # kept in each Estimate's own warnings
                warnings.simplefilter("always")
                estimates[name] = evaluate(
                    built[name], rows.reward, rows.action, rows.pscore, dist,
                    q_rows if name.partition(":")[0] in MODEL_BASED else None, method=method, level=level,
                    n_resamples=n_resamples, random_state=seed,
                )  # fmt: skip
        results.append(CandidateResult(candidate.name, estimates, time.monotonic() - began, n))
    seconds["total"] = time.monotonic() - started
    return Evaluation(log.scope, len(log), list(log.actions), float(log.reward.mean()), results, list(estimators), seconds)


#: the one parameter an estimator spec ``name:value`` sets
_ESTIMATOR_PARAM = {"ips": "clip", "dr": "clip", "switch_dr": "tau", "dros": "shrinkage"}


def estimator_from_spec(spec: str):
    """``ips``, ``ips:50`` (clipped at 50), ``switch_dr:20``, ``dros:10``, ... by registry name."""
    name, _, value = spec.partition(":")
    if name not in ESTIMATORS:
        raise InvalidInputError(f"unknown estimator {name!r}; known: {', '.join(sorted(ESTIMATORS))}")
    params = {}
    if value:
        if name not in _ESTIMATOR_PARAM:
            raise InvalidInputError(f"estimator {name!r} takes no parameter, got {spec!r}")
        params[_ESTIMATOR_PARAM[name]] = _value(value)
    elif name == "dros":
        raise InvalidInputError("estimator 'dros' needs its shrinkage: dros:LAMBDA (e.g. dros:10)")
    try:
        return make_estimator(name, **params)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"estimator {spec!r}: {exc}") from None

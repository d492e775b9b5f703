"""Guards a snapshot must pass before it is published, in the order they run.

1. **Finite.** Every arm that has learned anything has a finite covariance trace and spectral
   norm (NaN or inf in the state itself is caught earlier, when the scoring view is built:
   :class:`~publisher.errors.NonFiniteState` either way).
2. **Minimum samples.** The snapshot carries at least ``min_samples`` updates over all arms
   (:class:`~publisher.errors.TooFewSamples`).
3. **Drift.** Each arm's covariance trace and ``||A||_2`` lie within a factor ``f`` (default 2)
   of their median over the last ``history`` published snapshots::

       median / f  <=  s  <=  median * f

   Arms without history are not judged, nor arms still warming up: fewer than
   ``drift_warmup x dimension`` updates, while the prior still dominates and the statistics
   move fast by design. With ``per_sample`` (the default)
   the statistics are first put on a per-observation scale, using the arm's effective sample
   size ``n_eff = (1 - gamma^n) / (1 - gamma)`` (``n`` for ``gamma = 1``) plus its prior
   strength ``s0``::

       trace' = trace(A^-1) * (s0 + n_eff)        norm' = ||A||_2 / (s0 + n_eff)

   Raw statistics move by design as data accumulates (``||A||`` grows about linearly in n);
   compared raw, an arm that doubles its data fails the guard, and since the history only
   holds published snapshots it would fail every publish after that. Scaled, they stay put
   while the feature distribution does and jump when it shifts (a feature's scale changes, a
   feature goes missing), which is the drift the guard is for. ``per_sample=False`` applies
   the raw rule. A drift failure aborts (:class:`~publisher.errors.DriftGuardFailed`), or
   with ``on_drift="flag"`` publishes a snapshot whose drift flag makes deciders use their
   baseline.

    >>> config = GuardConfig(min_samples=1, drift_warmup=0)
    >>> history = DriftHistory(config.history)
    >>> arms = lambda norm: (ArmSummary("a", 0.0, 1.0, 100, 0.5, norm),)
    >>> history.record(arms(101.0))
    >>> check(arms(105.0), 100, history, config).ok
    True
    >>> check(arms(505.0), 100, history, config).ok
    Traceback (most recent call last):
    ...
    publisher.errors.DriftGuardFailed: arm 'a': spectral_norm (per sample) is 5x its median over the last 1 snapshot(s), outside [0.5x, 2x]
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from publisher.errors import DriftGuardFailed, NonFiniteState, TooFewSamples
from publisher.snapshot import ArmSummary

__all__ = ["DriftHistory", "GuardConfig", "GuardResult", "check", "warmup_count"]


@dataclass(frozen=True)
class GuardConfig:
    """Limits a snapshot must respect; see the module docstring."""

    #: Updates over all arms a snapshot must carry before it is worth publishing.
    min_samples: int = 1
    #: Band around the median: a statistic within [median / f, median * f] passes.
    drift_factor: float = 2.0
    #: How many of the last published snapshots the median is taken over.
    history: int = 5
    #: An arm's drift is judged once it has learned this many updates per feature dimension.
    drift_warmup: float = 10.0
    #: Compare statistics per observation (see the module docstring) rather than raw.
    per_sample: bool = True
    #: What a drift failure does: abort the publish, or publish with the drift flag set.
    on_drift: Literal["abort", "flag"] = "abort"

    def __post_init__(self) -> None:
        if self.min_samples < 0:
            raise ValueError(f"min_samples must be >= 0, got {self.min_samples}")
        if not (math.isfinite(self.drift_factor) and self.drift_factor > 1.0):
            raise ValueError(f"drift_factor must be a finite number > 1, got {self.drift_factor}")
        if self.drift_warmup < 0:
            raise ValueError(f"drift_warmup must be >= 0, got {self.drift_warmup}")
        if self.history < 1:
            raise ValueError(f"history must be >= 1, got {self.history}")
        if self.on_drift not in ("abort", "flag"):
            raise ValueError(f"on_drift must be 'abort' or 'flag', got {self.on_drift!r}")


@dataclass(frozen=True)
class GuardResult:
    """The outcome of a check that did not abort: drifted arms when ``on_drift="flag"``."""

    drifted: tuple[str, ...] = ()
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.drifted


def effective_samples(count: int, gamma: float) -> float:
    """Weight of ``count`` observations under forgetting ``gamma``: sum of gamma^k, k < count."""
    if gamma >= 1.0:
        return float(count)
    return (1.0 - gamma**count) / (1.0 - gamma)


def _scaled(arm: ArmSummary, gamma: float, per_sample: bool) -> tuple[float, float]:
    if not per_sample:
        return arm.cov_trace, arm.spectral_norm
    weight = arm.prior_strength + effective_samples(arm.count, gamma)
    return arm.cov_trace * weight, arm.spectral_norm / weight


@dataclass
class DriftHistory:
    """Scaled per-arm statistics of the last ``size`` published snapshots (newest last)."""

    size: int = 5
    gamma: float = 1.0
    per_sample: bool = True
    _entries: deque[dict[str, tuple[float, float]]] = field(default_factory=deque, repr=False)

    def record(self, arms: Iterable[ArmSummary], gamma: float | None = None, min_count: float = 1) -> None:
        """Remember one published snapshot's arms (those with at least ``min_count`` updates)."""
        g = self.gamma if gamma is None else gamma
        entry = {a.arm: _scaled(a, g, self.per_sample) for a in arms if a.count >= max(min_count, 1)}
        self._entries.append(entry)
        while len(self._entries) > self.size:
            self._entries.popleft()

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def medians(self, arm: str) -> tuple[float, float, int] | None:
        """(median trace, median norm, snapshots seen) of ``arm``, or None without history."""
        seen = [entry[arm] for entry in self._entries if arm in entry]
        if not seen:
            return None
        return statistics.median(s[0] for s in seen), statistics.median(s[1] for s in seen), len(seen)


def check(
    arms: Iterable[ArmSummary],
    samples: int,
    history: DriftHistory,
    config: GuardConfig,
    *,
    gamma: float = 1.0,
    dimension: int = 1,
    params: Mapping[str, Any] | None = None,
) -> GuardResult:
    """Run the guards in order; raise the first failure (or report drift when flagging).

    ``params`` (the policy's hyper-parameters) supply ``gamma`` and ``dim`` when given.
    """
    if params is not None:
        gamma = float(params.get("gamma", gamma))
        dimension = int(params.get("dim", dimension))
    arms = tuple(arms)
    _check_finite(arms)
    if samples < config.min_samples:
        raise TooFewSamples(f"{samples} samples, the minimum to publish is {config.min_samples}")
    problems = _drift(arms, history, config, gamma, warmup_count(config, dimension))
    if not problems:
        return GuardResult()
    reason = "; ".join(message for _, message in problems)
    drifted = tuple(arm for arm, _ in problems)
    if config.on_drift == "abort":
        raise DriftGuardFailed(reason, arms=drifted)
    return GuardResult(drifted, reason)


def _check_finite(arms: tuple[ArmSummary, ...]) -> None:
    for a in arms:
        values = {"prior_mean": a.prior_mean, "prior_strength": a.prior_strength}
        if a.count > 0:  # an arm without data may report an infinite variance, and rightly so
            values.update(cov_trace=a.cov_trace, spectral_norm=a.spectral_norm)
        bad = {name: value for name, value in values.items() if not math.isfinite(value)}
        if bad:
            name, value = next(iter(bad.items()))
            raise NonFiniteState(f"arm {a.arm!r}: {name} is {value}", subject=a.arm)


def warmup_count(config: GuardConfig, dimension: int) -> float:
    """Updates an arm needs before its drift is judged (and recorded into the history)."""
    return max(1.0, config.drift_warmup * dimension)


def _drift(
    arms: tuple[ArmSummary, ...], history: DriftHistory, config: GuardConfig, gamma: float, min_count: float
) -> list[tuple[str, str]]:
    f = config.drift_factor
    scale = "per sample" if config.per_sample else "raw"
    problems = []
    for a in arms:
        if a.count < min_count:
            continue
        medians = history.medians(a.arm)
        if medians is None:
            continue
        trace, norm = _scaled(a, gamma, config.per_sample)
        outside = [
            f"{name} ({scale}) is {value / median:.3g}x its median"
            for name, value, median in (("cov_trace", trace, medians[0]), ("spectral_norm", norm, medians[1]))
            if median > 0 and not (median / f <= value <= median * f)
        ]
        if outside:
            problems.append(
                (a.arm, f"arm {a.arm!r}: {' and '.join(outside)} over the last {medians[2]} snapshot(s), outside [{1 / f:.3g}x, {f:.3g}x]")
            )
    return problems

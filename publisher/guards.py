"""Guards a snapshot must pass before it is published, in the order they run.

1. **Finite.** Every arm that has learned anything has a finite covariance trace and spectral
   norm (NaN or inf in the state itself is caught earlier, when the scoring view is built:
   :class:`~publisher.errors.NonFiniteState` either way).
2. **Minimum samples.** The snapshot carries at least ``min_samples`` updates over all arms
   (:class:`~publisher.errors.TooFewSamples`).
3. **Drift**, judged on data the policy does not shape: the distribution of the context
   features over *every* decision, as the join's normaliser counts them (count, mean and
   spread of each numeric feature; a domain that does not normalise has none, and is not
   judged). An arm's own statistics are no measure of drift: they move whenever the policy
   changes which contexts the arm is shown. Each published snapshot carries the normaliser's
   running totals, so the decisions between two snapshots are a *window* whose statistics are
   the difference of the two (Chan et al.'s pairwise update, inverted). The newest window of
   at least ``drift_window`` decisions is compared with the reference: the window of the same
   size before it, both from snapshots that were accepted. A feature drifted when, against the
   reference,

   - its mean moved by more than ``drift_shift`` reference standard deviations,
   - its standard deviation changed by more than a factor ``drift_factor``, or
   - it went missing: its share of the window's decisions fell by more than ``drift_factor``.

   A window's statistics are those of hundreds of decisions, so sampling noise alone stays far
   inside these bands. A drifted snapshot is held back (:class:`~publisher.errors.DriftGuardFailed`,
   the default ``on_drift="abort"``), or published flagged with ``on_drift="flag"`` (deciders
   that hold an unflagged snapshot keep it). Either way it does not become a reference: the
   guard keeps judging against the data from before the drift until an operator acknowledges
   it (:meth:`FeatureHistory.acknowledge`; ``banditstream snapshot ack-drift``), when the
   history starts over from the current statistics.

    >>> config = GuardConfig(drift_window=100)
    >>> history = FeatureHistory(config)
    >>> totals = lambda n, mean, sd: {"format": 1, "features": {"tokens": [n, mean, sd * sd * n]}}
    >>> for n in (100, 200):                   # two windows of N(5, 1): the reference is built
    ...     history.accept(totals(n, 5.0, 1.0))
    >>> check((), 1, history, config, totals(300, 5.0, 1.0)).ok
    True
    >>> check((), 1, history, config, totals(300, 20.0 / 3, 1.0))    # the last 100 have mean 10
    Traceback (most recent call last):
    ...
    publisher.errors.DriftGuardFailed: feature 'tokens': mean 10 is 5 reference standard deviations from 5 (100 decisions against 100)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from publisher.errors import DriftGuardFailed, NonFiniteState, TooFewSamples
from publisher.snapshot import ArmSummary

__all__ = ["FeatureHistory", "GuardConfig", "GuardResult", "Window", "check", "window_between"]


@dataclass(frozen=True)
class GuardConfig:
    """Limits a snapshot must respect; see the module docstring."""

    #: Updates over all arms a snapshot must carry before it is worth publishing.
    min_samples: int = 1
    #: A feature's spread may change by this factor (either way), its share of decisions fall by it.
    drift_factor: float = 2.0
    #: A feature's mean may move by this many reference standard deviations.
    drift_shift: float = 1.0
    #: Decisions in a window: the newest one and its reference each need this many.
    drift_window: int = 1000
    #: At most this many accepted snapshots' totals are kept (fewer once they span two windows).
    history: int = 1000
    #: What a drift failure does: hold the publish back, or publish with the drift flag set.
    on_drift: Literal["abort", "flag"] = "abort"

    def __post_init__(self) -> None:
        if self.min_samples < 0:
            raise ValueError(f"min_samples must be >= 0, got {self.min_samples}")
        if not (math.isfinite(self.drift_factor) and self.drift_factor > 1.0):
            raise ValueError(f"drift_factor must be a finite number > 1, got {self.drift_factor}")
        if not (math.isfinite(self.drift_shift) and self.drift_shift > 0.0):
            raise ValueError(f"drift_shift must be a finite number > 0, got {self.drift_shift}")
        if self.drift_window < 1:
            raise ValueError(f"drift_window must be >= 1, got {self.drift_window}")
        if self.history < 3:
            raise ValueError(f"history must be >= 3 (a window, its reference and their start), got {self.history}")
        if self.on_drift not in ("abort", "flag"):
            raise ValueError(f"on_drift must be 'abort' or 'flag', got {self.on_drift!r}")


@dataclass(frozen=True)
class GuardResult:
    """The outcome of a check that did not abort: the drifted features when ``on_drift="flag"``."""

    drifted: tuple[str, ...] = ()
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.drifted


#: A feature's statistics over some decisions: (count, mean, sum of squared deviations).
Stat = tuple[float, float, float]


@dataclass(frozen=True)
class Window:
    """The features' statistics over the decisions between two sets of running totals."""

    decisions: float  # the most any feature was counted: the decisions in the window
    features: Mapping[str, Stat]

    def share(self, name: str) -> float:
        """The share of the window's decisions that carried feature ``name``."""
        counted = self.features.get(name, (0.0, 0.0, 0.0))[0]
        return counted / self.decisions if self.decisions > 0 else 0.0


def _totals(export: Mapping[str, Any] | None) -> dict[str, Stat]:
    """A normaliser export's features (``{"format": 1, "features": {name: [n, mean, m2]}}``)."""
    if not export or export.get("format") != 1:
        return {}
    return {name: (float(n), float(mean), float(m2)) for name, (n, mean, m2) in export.get("features", {}).items()}


def _decisions(totals: Mapping[str, Stat]) -> float:
    return max((n for n, _, _ in totals.values()), default=0.0)


def window_between(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> Window | None:
    """The statistics of the values counted after ``before`` and up to ``after`` (two running
    totals of one normaliser); None when ``after`` does not extend ``before`` (the totals were
    restarted, e.g. a join partition lost its state)."""
    old, new = _totals(before), _totals(after)
    features: dict[str, Stat] = {}
    for name, (n, mean, m2) in new.items():
        n0, mean0, m20 = old.get(name, (0.0, 0.0, 0.0))
        k = n - n0
        if k < 0:
            return None
        if k == 0:
            continue
        window_mean = (n * mean - n0 * mean0) / k
        delta = window_mean - mean0
        # m2 = m2_0 + m2_w + delta^2 n0 k / n  (Chan et al.), solved for m2_w
        features[name] = (k, window_mean, max(0.0, m2 - m20 - delta * delta * n0 * k / n))
    if any(name not in new for name in old):
        return None
    return Window(_decisions(new) - _decisions(old), features)


@dataclass
class FeatureHistory:
    """The running totals of the last accepted snapshots (newest last), to find windows in."""

    config: GuardConfig = field(default_factory=GuardConfig)
    _totals: list[Mapping[str, Any]] = field(default_factory=list, repr=False)
    #: the decisions each of ``_totals`` had counted (kept beside them, not derived per check)
    _counted: list[float] = field(default_factory=list, repr=False)

    def accept(self, totals: Mapping[str, Any] | None) -> None:
        """A snapshot with these normaliser totals was accepted (published unflagged)."""
        if not totals:
            return
        if self._totals and window_between(self._totals[-1], totals) is None:
            self._clear()  # the totals restarted: what came before no longer subtracts
        newest = _decisions(_totals(totals))
        self._totals.append(totals)
        self._counted.append(newest)
        del self._totals[: -self.config.history], self._counted[: -self.config.history]
        # the oldest are let go once the rest still span a window and its reference
        while len(self._totals) > 2 and newest - self._counted[1] >= 2 * self.config.drift_window:
            del self._totals[0], self._counted[0]

    def _clear(self) -> None:
        self._totals.clear()
        self._counted.clear()

    def acknowledge(self, totals: Mapping[str, Any] | None) -> None:
        """An operator accepted what the guard flagged: judge from these totals on."""
        self._clear()
        self.accept(totals)

    def __len__(self) -> int:
        return len(self._totals)

    def windows(self, totals: Mapping[str, Any] | None) -> tuple[Window, Window] | None:
        """(the newest window, its reference) ending at ``totals``, each of at least
        ``drift_window`` decisions; None while the history is too short to hold both."""
        if not totals or not self._totals:
            return None
        size = self.config.drift_window
        decisions, held = _decisions(_totals(totals)), self._counted
        cut = next((i for i in range(len(held) - 1, -1, -1) if decisions - held[i] >= size), None)
        if cut is None:
            return None
        start = next((i for i in range(cut - 1, -1, -1) if held[cut] - held[i] >= size), None)
        if start is None:
            return None
        newest, reference = window_between(self._totals[cut], totals), window_between(self._totals[start], self._totals[cut])
        return None if newest is None or reference is None else (newest, reference)


def check(
    arms: Iterable[ArmSummary],
    samples: int,
    history: FeatureHistory,
    config: GuardConfig,
    totals: Mapping[str, Any] | None = None,
) -> GuardResult:
    """Run the guards in order; raise the first failure (or report drift when flagging).
    ``totals`` are the snapshot's normaliser totals (None: the domain does not normalise)."""
    _check_finite(tuple(arms))
    if samples < config.min_samples:
        raise TooFewSamples(f"{samples} samples, the minimum to publish is {config.min_samples}")
    windows = history.windows(totals)
    problems = _drift(*windows, config) if windows is not None else []
    if not problems:
        return GuardResult()
    reason = "; ".join(message for _, message in problems)
    drifted = tuple(name for name, _ in problems)
    if config.on_drift == "abort":
        raise DriftGuardFailed(reason, features=drifted)
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


def _drift(newest: Window, reference: Window, config: GuardConfig) -> list[tuple[str, str]]:
    f, problems = config.drift_factor, []
    counts = f"({newest.decisions:,.0f} decisions against {reference.decisions:,.0f})"
    for name, (k0, mean0, m20) in sorted(reference.features.items()):
        sd0 = math.sqrt(m20 / k0) if k0 > 0 else 0.0
        share0, share = reference.share(name), newest.share(name)
        if share0 > 0 and share < share0 / f:
            problems.append((name, f"feature {name!r}: in {share:.1%} of the decisions, {share0:.1%} before {counts}"))
            continue
        if name not in newest.features or sd0 <= 0:
            continue  # a constant feature's spread cannot scale, nor its mean be measured in it
        k, mean, m2 = newest.features[name]
        sd = math.sqrt(m2 / k)
        if abs(mean - mean0) > config.drift_shift * sd0:
            problems.append((name, f"feature {name!r}: mean {mean:.3g} is {abs(mean - mean0) / sd0:.3g} reference "
                                   f"standard deviations from {mean0:.3g} {counts}"))  # fmt: skip
        elif not (sd0 / f <= sd <= sd0 * f):
            problems.append((name, f"feature {name!r}: standard deviation {sd:.3g} is {sd / sd0:.3g}x the reference "
                                   f"{sd0:.3g} {counts}"))  # fmt: skip
    return problems

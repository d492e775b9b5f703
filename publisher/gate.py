"""Evidence-gated promotion: a domain's canary snapshot goes to stable only with evidence, and
back out by itself when the evidence says it is worse.

The workflow of one :meth:`Gate.run`, in order:

1. **Heads.** The domain's ``stable`` and ``canary`` heads (verified, as a client pulls them).
   No canary, the canary is the stable version, or it carries the stable's state (a rollback
   made it): nothing to gate.
2. **Evidence.** The joined log since the canary was published: the live decisions of the
   domain, whichever snapshot made them. Fewer than ``min_events``: wait.
3. **Estimate.** Both snapshots' policies are scored on every logged row with their own
   decision step (:class:`~learner.evaluation.candidates.Fixed`) and rated by the configured
   estimator with its interval at ``level`` (one cross-fitted reward model for DR and the
   like). A paired comparison: the same rows, the same reward model. With the estimator
   ``on_policy`` instead, each channel is rated on the decisions it made itself: the mean
   reward of the rows its snapshot decided, with its CLT interval. The SDK routes units to
   the channels at random (by a hash), so this is an A/B test, unbiased whatever the two
   policies do; use it when they are too far apart (near-greedy policies over many
   candidates) for either one's choices to be found often enough in the other's traffic,
   which the off-policy estimators report as too small an effective sample size.
4. **Decide.**

   * **promote** when the canary's lower bound beats the stable's value by ``margin``:
     ``canary.lower > stable.estimate + margin``;
   * **roll back** when the canary's upper bound falls below the stable's value less the
     tolerated regression, ``canary.upper < stable.estimate - tolerated_regression``: a new
     canary version carrying the stable's state is published (clients move forward to it);
   * otherwise **wait**, and say why (the intervals overlap; too few effective rows).

Every decision is logged with its figures and exported as metrics; :class:`GateDecision` is
what the CLI prints and the worker logs.

    gate = Gate(publisher, read_log=lambda domain, since_ms: updates)
    decision = gate.run("llm_routing", GateConfig(min_events=2000, estimator="snips"))
    print(decision.action, decision.reason)
"""

from __future__ import annotations

import logging
import math
import time
from statistics import NormalDist
from datetime import datetime
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from learner.evaluation import Fixed, LoggedBandit
from learner.evaluation.errors import EvaluationError
from learner.evaluation.intervals import Estimate
from learner.evaluation.run import estimator_from_spec, evaluate_candidates
from publisher.errors import PublisherError
from publisher.publish import Publisher
from publisher.snapshot import Snapshot

__all__ = ["ON_POLICY", "Gate", "GateConfig", "GateDecision", "GateMetrics", "canary_since_ms", "nothing_to_gate", "on_policy_estimate"]

log = logging.getLogger(__name__)

ACTIONS = ("promote", "rollback", "wait", "nothing")
#: the gate's A/B estimator: each channel rated on the decisions it made (see the module's doc)
ON_POLICY = "on_policy"
#: fewer decisions of a channel than this and its on-policy estimate is too little evidence
MIN_ON_POLICY_ROWS = 30


@dataclass(frozen=True)
class GateConfig:
    """The evidence a promotion needs (a domain's ``promotion`` settings)."""

    #: logged live decisions since the canary was published, before the gate acts
    min_events: int = 1000
    #: estimator spec (``snips``, ``ips``, ``dr``, ``ips:50``, ...)
    estimator: str = "snips"
    level: float = 0.95
    #: how much the canary's lower bound must beat the stable's value by
    margin: float = 0.0
    #: how far the canary's upper bound may fall below the stable's value before it is rolled back
    tolerated_regression: float = 0.02
    #: ``gaussian`` (closed form, cheap) or ``bootstrap``
    interval: str = "gaussian"
    n_resamples: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.estimator != ON_POLICY:
            estimator_from_spec(self.estimator)  # an unknown estimator fails here, by name
        if not 0.5 <= self.level < 1.0:
            raise ValueError(f"level must be in [0.5, 1), got {self.level!r}")
        if self.interval not in ("gaussian", "bootstrap"):
            raise ValueError(f"interval must be gaussian or bootstrap, got {self.interval!r}")
        for name in ("margin", "tolerated_regression"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.min_events < 1:
            raise ValueError(f"min_events must be >= 1, got {self.min_events!r}")

    @classmethod
    def from_settings(cls, promotion: Any) -> "GateConfig":
        """From a domain's ``promotion`` settings (any object or mapping with these fields)."""
        get = promotion.get if isinstance(promotion, Mapping) else lambda k, d=None: getattr(promotion, k, d)
        names = ("min_events", "estimator", "level", "margin", "tolerated_regression", "interval")
        return cls(**{name: get(name) for name in names if get(name) is not None})


@dataclass
class GateDecision:
    domain: str
    action: str
    reason: str
    stable_version: str | None = None
    canary_version: str | None = None
    rows: int = 0
    canary_rows: int = 0
    stable: Estimate | None = None
    canary: Estimate | None = None
    #: the version a promote or rollback committed
    committed: str | None = None
    at_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["stable"] = None if self.stable is None else self.stable.to_dict()
        out["canary"] = None if self.canary is None else self.canary.to_dict()
        return out

    def __str__(self) -> str:
        return f"{self.domain}: {self.action} ({self.reason})"


def nothing_to_gate(stable: Any, canary: Any) -> str | None:
    """Why the channels' heads (target entries or None) leave the gate nothing to judge, or
    None when the canary awaits a verdict."""
    if canary is None or stable is None:
        return f"no {'canary' if canary is None else 'stable'} snapshot"
    if canary.version == stable.version:
        return "the canary is the stable version"
    if canary.custom.get("derived_from") == str(stable.version):
        return f"the canary carries the stable's state ({stable.version}): a rollback made it"
    return None


def canary_since_ms(canary: Any) -> int:
    """When a canary was published (epoch ms): the gate's evidence starts there."""
    return _millis(canary.custom.get("created_at"))


def _millis(value: Any) -> int:
    """A target's ``created_at`` (ISO 8601, or epoch ms) as epoch ms; 0 if absent."""
    if value is None or value == "":
        return 0
    if isinstance(value, (int, float)):
        return int(value)
    return int(datetime.fromisoformat(str(value)).timestamp() * 1000)


def on_policy_estimate(logged: LoggedBandit, version: str, level: float) -> Estimate:
    """The mean reward of the rows ``version`` decided, with its CLT interval at ``level``:
    the on-policy value of a channel's snapshot (the ``on_policy`` estimator)."""
    rewards = logged.reward[logged.policy_version == version]
    n = int(rewards.size)
    mean = float(rewards.mean()) if n else 0.0
    if n >= 2:
        half = NormalDist().inv_cdf((1.0 + level) / 2.0) * float(rewards.std(ddof=1)) / math.sqrt(n)
        lower, upper = mean - half, mean + half
    else:
        lower, upper = -math.inf, math.inf
    warnings = () if n >= MIN_ON_POLICY_ROWS else (f"{n} decisions of {version} (fewer than {MIN_ON_POLICY_ROWS})",)
    return Estimate(estimator=ON_POLICY, estimate=mean, lower=lower, upper=upper, level=level, method="gaussian", n=n,
                    ess=float(n), max_weight=1.0, zero_weight_share=0.0, warnings=warnings)  # fmt: skip


class GateMetrics:
    """The gate's Prometheus metrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.decisions = Counter("banditstream_gate_decisions", "Promotion gate decisions, by action.",
                                 ["domain", "action"], registry=r)
        self.estimate = Gauge("banditstream_gate_estimate", "The gate's last estimate of each channel's value.",
                              ["domain", "channel", "bound"], registry=r)
        self.rows = Gauge("banditstream_gate_rows", "Logged decisions behind the gate's last estimate.", ["domain"], registry=r)


class Gate:
    """See the module's doc. ``read_log(domain, since_ms)`` returns the joined log's
    UpdateEvents of the domain decided at or after ``since_ms``."""

    def __init__(
        self,
        publisher: Publisher,
        read_log: Callable[[str, int], list[dict]],
        *,
        metrics: GateMetrics | None = None,
    ) -> None:
        self.publisher = publisher
        self.read_log = read_log
        self.metrics = metrics

    def run(self, domain: str, config: GateConfig) -> GateDecision:
        decision = self._decide(domain, config)
        if self.metrics is not None:
            self._export(decision)
        log.warning("gate %s", decision) if decision.action in ("promote", "rollback") else log.info("gate %s", decision)
        return decision

    # -- the steps -------------------------------------------------------------------------

    def _decide(self, domain: str, config: GateConfig) -> GateDecision:
        repo = self.publisher.repository(domain)
        head = repo.head()
        stable, canary = head.channel_head("stable"), head.channel_head("canary")
        out = GateDecision(domain, "nothing", "", None if stable is None else str(stable.version),
                           None if canary is None else str(canary.version))
        nothing = nothing_to_gate(stable, canary)
        if nothing is not None:
            out.reason = nothing
            return out

        since = canary_since_ms(canary)
        tenant, workspace = self.publisher.tenant, self.publisher.workspace
        updates = self.read_log(domain, since)
        try:
            logged = LoggedBandit.from_updates(updates, domain=domain, tenant=tenant, workspace=workspace)
        except ValueError as exc:
            out.action, out.reason = "wait", f"the log cannot be used: {exc}"
            return out
        logged = logged.select(logged.decision_time >= since)
        out.rows = len(logged)
        out.canary_rows = int((logged.policy_version == str(canary.version)).sum())
        if out.rows < config.min_events:
            out.action, out.reason = "wait", f"{out.rows} of {config.min_events} logged decisions since the canary"
            return out

        if config.estimator == ON_POLICY:
            out.stable, out.canary = (on_policy_estimate(logged, str(entry.version), config.level)
                                      for entry in (stable, canary))  # fmt: skip
            return self._judge(domain, config, out)
        policies = {
            name: Snapshot.from_bytes(repo.fetch(entry), expect_major=None).load_policy()
            for name, entry in (("stable", stable), ("canary", canary))
        }
        try:
            run = evaluate_candidates(
                logged, [Fixed(policies["stable"], "stable", seed=config.seed), Fixed(policies["canary"], "canary", seed=config.seed)],
                estimators=[config.estimator], method=config.interval, level=config.level,
                n_resamples=config.n_resamples, seed=config.seed,
            )  # fmt: skip
        except (EvaluationError, ValueError) as exc:
            out.action, out.reason = "wait", f"the estimate failed: {exc}"
            return out
        by_name = {r.name: r.estimates[config.estimator] for r in run.results}
        out.stable, out.canary = by_name["stable"], by_name["canary"]
        return self._judge(domain, config, out)

    def _judge(self, domain: str, config: GateConfig, out: GateDecision) -> GateDecision:
        """Step 4, from the two estimates in ``out``."""
        s, c = out.stable, out.canary
        figures = (f"canary {c.estimate:.4f} [{c.lower:.4f}, {c.upper:.4f}] vs stable {s.estimate:.4f}, "
                   f"{config.estimator}, {out.rows} rows")
        warnings = (*c.warnings, *(s.warnings if config.estimator == ON_POLICY else ()))
        if warnings:
            out.action, out.reason = "wait", f"too little evidence: {warnings[0]}; {figures}"
        elif c.lower > s.estimate + config.margin:
            out.action, out.reason = "promote", f"its lower bound beats the stable's value by more than {config.margin}: {figures}"
            self._promote(domain, out)
        elif c.upper < s.estimate - config.tolerated_regression:
            out.action = "rollback"
            out.reason = f"its upper bound is more than {config.tolerated_regression} below the stable's value: {figures}"
            self._roll_back(domain, out)
        else:
            out.action, out.reason = "wait", f"no verdict at {int(round(100 * config.level))}% yet: {figures}"
        return out

    def _promote(self, domain: str, out: GateDecision) -> None:
        try:
            self.publisher.promote(domain, out.canary_version, "stable", source="canary")
        except PublisherError as exc:
            out.action, out.reason = "wait", f"the promotion failed: {exc}"
            return
        out.committed = out.canary_version

    def _roll_back(self, domain: str, out: GateDecision) -> None:
        """A new canary version carrying the stable's state: clients move forward to it."""
        try:
            result = self.publisher.rollback(domain, to_version=out.stable_version, channels=("canary",))
        except PublisherError as exc:
            out.action, out.reason = "wait", f"the rollback failed: {exc}"
            return
        out.committed = result.version

    def _export(self, decision: GateDecision) -> None:
        m = self.metrics
        m.decisions.labels(decision.domain, decision.action).inc()
        m.rows.labels(decision.domain).set(decision.rows)
        for channel, estimate in (("stable", decision.stable), ("canary", decision.canary)):
            if estimate is not None:
                for bound, value in (("estimate", estimate.estimate), ("lower", estimate.lower), ("upper", estimate.upper)):
                    m.estimate.labels(decision.domain, channel, bound).set(value)

"""A domain's learning settings: policy, features, reward and promotion, validated as one section.

The configuration tree (``banditstream.config``) holds one :class:`DomainSettings` per domain;
workers and the SDK build what they need from it, so the same settings score in the SDK
and learn in the worker:

    >>> settings = DomainSettings(policy="lin_ucb", params={"alpha": 0.5}, features={"dimension": 16})
    >>> settings.make_policy().dim, settings.reward_engine().window_s
    (16, 600.0)
    >>> settings.promotion.canary_share, settings.promotion.estimator
    (0.0, 'snips')
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from learner.features import FeatureConfig, FeatureEncoder
from learner.policies import POLICIES, Policy, make_policy
from learner.reward import RewardConfig, RewardEngine


class PromotionSettings(BaseModel):
    """Evidence-gated promotion of the domain's canary snapshot.

    The SDK sends ``canary_share`` of the units (by a stable hash of the caller's unit key,
    else the event id) to the canary channel's snapshot and logs the channel on every
    decision. Every ``every_s`` the publisher's gate estimates both channels' value from the
    log with ``estimator`` and a ``level`` interval, once at least ``min_events`` rows were
    decided by the canary: it promotes the canary when

        lower(canary) > value(stable) + margin

    rolls it back when ``upper(canary) < value(stable) - tolerated_regression``, and waits
    otherwise.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    canary_share: float = Field(0.0, ge=0.0, lt=1.0, description="share of units the SDK routes to the canary; 0: none")
    min_events: int = Field(1000, ge=1, description="canary-decided rows needed before the gate acts")
    estimator: str = Field("snips", description="off-policy estimator (a name in learner.evaluation.ESTIMATORS), or "
                           "on_policy: each channel rated on its own decisions, an A/B test")
    level: float = Field(0.95, gt=0.0, lt=1.0, description="confidence level of the intervals")
    margin: float = Field(0.0, ge=0.0, description="how much the canary's lower bound must beat the stable's value by")
    tolerated_regression: float = Field(
        0.02, ge=0.0, description="how far the canary's upper bound may fall below the stable's value before it is rolled back"
    )
    interval: Literal["gaussian", "bootstrap"] = Field("gaussian", description="closed-form (cheap) or seeded bootstrap intervals")
    every_s: float = Field(60.0, gt=0.0, description="how often the publisher runs the gate")

    @field_validator("min_events", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):  # pydantic would read true as 1
            raise ValueError("must be an integer, not a boolean")
        return value

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, value: str) -> str:
        # Imported here: the SDK reads these settings but never needs the estimators.
        from learner.evaluation.estimators import ESTIMATORS

        if value not in ESTIMATORS and value != "on_policy":
            raise ValueError(f"must be one of {', '.join(sorted([*ESTIMATORS, 'on_policy']))}")
        return value


class DomainSettings(BaseModel):
    """One decision point: its policy, features, reward and canary promotion."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    policy: str = Field("portfolio", description=f"one of: {', '.join(sorted(POLICIES))}")
    params: dict[str, Any] = Field(default_factory=dict, description="policy hyper-parameters (alpha, v, eps0, gamma, ...)")
    features: FeatureConfig = FeatureConfig()
    reward: RewardConfig = RewardConfig()
    max_actions: int | None = Field(None, ge=1)
    mode: Literal["live", "shadow", "off"] = "live"
    promotion: PromotionSettings = PromotionSettings()

    @model_validator(mode="after")
    def _policy_is_buildable(self) -> "DomainSettings":
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; known: {', '.join(sorted(POLICIES))}")
        if "dim" in self.params:
            raise ValueError("params.dim is taken from features.dimension; remove it")
        cls = POLICIES[self.policy]
        if cls.shared != self.features.shared:
            want = "true" if cls.shared else "false"
            raise ValueError(f"policy {self.policy!r} needs features.shared={want}")
        try:
            self.make_policy()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"params: {exc}") from None
        return self

    @property
    def vector_dim(self) -> int:
        return self.features.vector_dim

    def make_policy(self, **overrides: Any) -> Policy:
        """A fresh policy with these settings (its dimension is the feature dimension)."""
        return make_policy(self.policy, dim=self.features.dimension, **{**self.params, **overrides})

    def encoder(self) -> FeatureEncoder:
        return FeatureEncoder(self.features)

    def reward_engine(self) -> RewardEngine:
        return RewardEngine(self.reward)

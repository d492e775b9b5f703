"""A domain's learning settings: policy, features and reward, validated as one section.

The configuration tree (``banditstream.config``) holds one :class:`DomainSettings` per domain;
workers and the SDK build what they need from it, so the same settings score in the SDK
and learn in the worker:

    >>> settings = DomainSettings(policy="lin_ucb", params={"alpha": 0.5}, features={"dimension": 16})
    >>> settings.make_policy().dim, settings.reward_engine().window_s
    (16, 600.0)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from learner.features import FeatureConfig, FeatureEncoder
from learner.policies import POLICIES, Policy, make_policy
from learner.reward import RewardConfig, RewardEngine


class DomainSettings(BaseModel):
    """One decision point: its policy, features and reward."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    policy: str = Field("lin_ts", description=f"one of: {', '.join(sorted(POLICIES))}")
    params: dict[str, Any] = Field(default_factory=dict, description="policy hyper-parameters (alpha, v, eps0, gamma, ...)")
    features: FeatureConfig = FeatureConfig()
    reward: RewardConfig = RewardConfig()
    max_actions: int | None = Field(None, ge=1)
    mode: Literal["live", "shadow", "off"] = "live"

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

"""Simulated workloads with a known ground truth, for the demo, tests and benchmarks.

Two domains, modelled on the systems banditstream grew from:

- ``llm_routing``: route a request to one of several LLMs/agents. Context: task type,
  prompt length, language, user tier. Each model has a success rate per task and language,
  a latency that grows with the prompt, and a price per token. Reward (through the reward
  engine): ``1.0*success - 0.3*min(latency_ms/2000, 2) - 0.5*min(cost_usd/0.02, 2)``.
- ``support_templates``: pick a question template (or tool) for a support intent. Each
  template resolves some intents better than others and is cached at some rate; a cache
  hit is fast. Reward: ``1.0*resolved + 0.4*cache_hit - 0.2*min(latency_ms/1500, 2)``.

Every outcome is drawn from a seeded generator, and the expected reward of every action in
every context is known in closed form (latency noise is averaged over fixed quantiles of its
log-normal), so regret against the oracle is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from learner.reward import RewardConfig, RewardEngine

_Z = np.array([-1.8627, -1.3180, -0.9674, -0.6745, -0.4307, -0.2104, 0.0, 0.2104, 0.4307, 0.6745, 0.9674, 1.3180, 1.8627])
_W = np.full(len(_Z), 1.0 / len(_Z))


@dataclass(frozen=True)
class Outcome:
    signals: dict[str, float]
    reward: float


class Environment:
    """Base: a domain's contexts, actions, outcomes and their expected rewards."""

    name: str = ""
    actions: tuple[str, ...] = ()
    reward_expression: str = ""
    latency_sigma: float = 0.25

    def __init__(self) -> None:
        self.reward_config = RewardConfig.from_expression(self.reward_expression, window_s=2.0, default_reward=0.0)
        self.engine = RewardEngine(self.reward_config)

    def sample_context(self, rng: np.random.Generator) -> dict[str, Any]:
        raise NotImplementedError

    def _means(self, context: dict[str, Any], action: str) -> tuple[dict[str, float], float]:
        """Bernoulli probabilities of the binary signals, and the median latency."""
        raise NotImplementedError

    def _fixed(self, context: dict[str, Any], action: str) -> dict[str, float]:
        """Signals that do not vary given context and action (e.g. cost)."""
        return {}

    def outcome(self, context: dict[str, Any], action: str, rng: np.random.Generator) -> Outcome:
        probabilities, median_latency = self._means(context, action)
        signals = {name: float(rng.random() < p) for name, p in probabilities.items()}
        signals["latency_ms"] = float(median_latency * math.exp(self.latency_sigma * rng.standard_normal()))
        signals.update(self._fixed(context, action))
        signals = self._adjust(signals)
        return Outcome(signals, self.engine.score(signals))

    def _adjust(self, signals: dict[str, float]) -> dict[str, float]:
        return signals

    def expected_reward(self, context: dict[str, Any], action: str) -> float:
        return float(self.expected_rewards(context)[self.actions.index(action)])

    def expected_rewards(self, context: dict[str, Any]) -> np.ndarray:
        """E[reward | context, a] for every action: exact over the binary signals (every
        combination, weighted by its probability), quadrature over the latency noise; one
        vectorised pass through the reward engine."""
        columns: dict[str, list[float]] = {}
        weights: list[float] = []
        owners: list[int] = []
        for index, action in enumerate(self.actions):
            probabilities, median_latency = self._means(context, action)
            fixed = self._fixed(context, action)
            names = list(probabilities)
            for mask in range(1 << len(names)):
                weight = 1.0
                signals = dict(fixed)
                for bit, name in enumerate(names):
                    on = (mask >> bit) & 1
                    weight *= probabilities[name] if on else 1.0 - probabilities[name]
                    signals[name] = float(on)
                for z, w in zip(_Z, _W):
                    adjusted = self._adjust({**signals, "latency_ms": median_latency * math.exp(self.latency_sigma * z)})
                    for name, value in adjusted.items():
                        columns.setdefault(name, []).append(value)
                    weights.append(weight * w)
                    owners.append(index)
        scores = self.engine.score_batch({name: np.asarray(values) for name, values in columns.items()})
        return np.bincount(owners, weights=np.asarray(weights) * scores, minlength=len(self.actions))

    def oracle(self, context: dict[str, Any]) -> tuple[str, float]:
        values = self.expected_rewards(context)
        best = int(np.argmax(values))
        return self.actions[best], float(values[best])

    def random_value(self, context: dict[str, Any]) -> float:
        return float(np.mean(self.expected_rewards(context)))


class LLMRouting(Environment):
    name = "llm_routing"
    actions = ("gpt-small", "gpt-large", "claude-haiku", "llama-70b", "code-agent")
    reward_expression = "1.0*success - 0.3*min(latency_ms/2000, 2) - 0.5*min(cost_usd/0.02, 2)"
    tasks = ("code", "chat", "summarise", "translate", "extract")
    languages = ("en", "sv", "de", "fr")
    # success rate per model and task
    quality = {
        "gpt-small": {"code": 0.45, "chat": 0.80, "summarise": 0.70, "translate": 0.65, "extract": 0.60},
        "gpt-large": {"code": 0.80, "chat": 0.90, "summarise": 0.88, "translate": 0.85, "extract": 0.85},
        "claude-haiku": {"code": 0.55, "chat": 0.85, "summarise": 0.85, "translate": 0.75, "extract": 0.80},
        "llama-70b": {"code": 0.70, "chat": 0.75, "summarise": 0.75, "translate": 0.55, "extract": 0.70},
        "code-agent": {"code": 0.95, "chat": 0.30, "summarise": 0.35, "translate": 0.20, "extract": 0.50},
    }
    # base latency (ms), ms per 1k prompt tokens, $ per 1k tokens
    profile = {
        "gpt-small": (300.0, 150.0, 0.0004),
        "gpt-large": (900.0, 700.0, 0.0100),
        "claude-haiku": (400.0, 200.0, 0.0010),
        "llama-70b": (700.0, 450.0, 0.0030),
        "code-agent": (1500.0, 600.0, 0.0060),
    }
    non_english_penalty = {"gpt-small": 0.15, "gpt-large": 0.02, "claude-haiku": 0.05, "llama-70b": 0.20, "code-agent": 0.05}

    def sample_context(self, rng: np.random.Generator) -> dict[str, Any]:
        return {
            "numeric": {"prompt_ktokens": float(np.round(rng.lognormal(0.0, 0.8), 3))},
            "categorical": {
                "task": self.tasks[rng.integers(len(self.tasks))],
                "lang": self.languages[rng.choice(4, p=[0.55, 0.15, 0.15, 0.15])],
                "tier": "pro" if rng.random() < 0.3 else "free",
            },
            "vector": [],
        }

    def _means(self, context, action):
        task, lang = context["categorical"]["task"], context["categorical"]["lang"]
        p = self.quality[action][task] - (self.non_english_penalty[action] if lang != "en" else 0.0)
        base, per_k, _ = self.profile[action]
        return {"success": min(max(p, 0.0), 1.0)}, base + per_k * context["numeric"]["prompt_ktokens"]

    def _fixed(self, context, action):
        tokens_k = context["numeric"]["prompt_ktokens"] + 0.5  # prompt plus a typical answer
        return {"cost_usd": self.profile[action][2] * tokens_k}


class SupportTemplates(Environment):
    name = "support_templates"
    actions = ("faq-short", "faq-detailed", "ask-clarify", "tool-order-lookup", "tool-kb-search", "escalate")
    reward_expression = "1.0*resolved + 0.4*cache_hit - 0.2*min(latency_ms/1500, 2)"
    intents = ("billing", "shipping", "returns", "tech", "account")
    resolve = {
        "faq-short": {"billing": 0.55, "shipping": 0.60, "returns": 0.50, "tech": 0.25, "account": 0.45},
        "faq-detailed": {"billing": 0.65, "shipping": 0.55, "returns": 0.70, "tech": 0.45, "account": 0.50},
        "ask-clarify": {"billing": 0.45, "shipping": 0.40, "returns": 0.45, "tech": 0.60, "account": 0.55},
        "tool-order-lookup": {"billing": 0.50, "shipping": 0.90, "returns": 0.75, "tech": 0.15, "account": 0.30},
        "tool-kb-search": {"billing": 0.50, "shipping": 0.45, "returns": 0.50, "tech": 0.80, "account": 0.60},
        "escalate": {"billing": 0.70, "shipping": 0.50, "returns": 0.55, "tech": 0.55, "account": 0.75},
    }
    cache_rate = {"faq-short": 0.85, "faq-detailed": 0.70, "ask-clarify": 0.40, "tool-order-lookup": 0.10, "tool-kb-search": 0.50, "escalate": 0.0}
    latency = {"faq-short": 400.0, "faq-detailed": 700.0, "ask-clarify": 500.0, "tool-order-lookup": 1200.0, "tool-kb-search": 1000.0, "escalate": 2500.0}

    def sample_context(self, rng: np.random.Generator) -> dict[str, Any]:
        return {
            "numeric": {"question_words": float(rng.integers(3, 60))},
            "categorical": {
                "intent": self.intents[rng.integers(len(self.intents))],
                "tier": "vip" if rng.random() < 0.2 else "standard",
            },
            "vector": [],
        }

    def _means(self, context, action):
        intent = context["categorical"]["intent"]
        p = self.resolve[action][intent] + (0.05 if context["categorical"]["tier"] == "vip" and action == "escalate" else 0.0)
        return {"resolved": min(p, 1.0), "cache_hit": self.cache_rate[action]}, self.latency[action]

    def _adjust(self, signals):
        if signals.get("cache_hit", 0.0) >= 1.0:  # a cached answer comes back fast
            signals = {**signals, "latency_ms": signals["latency_ms"] * 0.2}
        return signals


ENVIRONMENTS: dict[str, type[Environment]] = {cls.name: cls for cls in (LLMRouting, SupportTemplates)}


def make_environment(name: str) -> Environment:
    try:
        return ENVIRONMENTS[name]()
    except KeyError:
        raise ValueError(f"unknown simulated domain {name!r}; known: {', '.join(ENVIRONMENTS)}") from None

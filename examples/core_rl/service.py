"""The simulated service of the learning engine: five decision domains, their actions, the
signals each action yields, and the truth.

Every action yields the five signals the reward engine combines: ``quality`` (a judge's
score in [0, 1]), ``groundedness`` and ``safety`` (pass/fail checks), ``cost_usd`` (the
action's price) and ``latency_ms`` (log-normal around the action's median). Each domain's
first action is what the service did before learning (its deterministic baseline); each has
a better action to find.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: quality, groundedness, safety are per-draw means; cost in USD; latency median in ms
REWARD = ("0.5*quality + 0.3*groundedness + 0.2*safety - 0.2*min(cost_usd/0.02, 2) "
          "- 0.1*min(latency_ms/2000, 2)")  # fmt: skip
LATENCY_SIGMA = 0.35


@dataclass(frozen=True)
class Action:
    name: str
    quality: float
    groundedness: float
    safety: float
    cost_usd: float
    latency_ms: float


@dataclass(frozen=True)
class Domain:
    name: str
    policy: str
    params: dict
    actions: tuple[Action, ...]

    @property
    def ids(self) -> list[str]:
        return [a.name for a in self.actions]


DOMAINS = (
    Domain("model_routing", "beta_ts", {}, (
        Action("small", 0.45, 0.78, 0.97, 0.002, 400),
        Action("medium", 0.72, 0.86, 0.98, 0.009, 900),
        Action("large", 0.85, 0.90, 0.99, 0.032, 2200),  # the best answers, over a free request's budget
    )),
    Domain("prompt_selection", "epsilon_greedy", {"eps_start": 0.3, "decay": 0.995}, (
        Action("concise", 0.58, 0.80, 0.98, 0.003, 500),
        Action("step_by_step", 0.70, 0.84, 0.98, 0.005, 800),
        Action("few_shot", 0.64, 0.88, 0.98, 0.006, 700),
    )),
    Domain("retrieval_scoring", "ucb1", {"c": 0.5}, (
        Action("bm25", 0.56, 0.72, 0.98, 0.001, 150),
        Action("dense", 0.62, 0.80, 0.98, 0.002, 300),
        Action("hybrid", 0.66, 0.90, 0.98, 0.002, 380),
    )),
    Domain("tool_planning", "beta_ts", {}, (
        Action("direct_answer", 0.52, 0.65, 0.97, 0.002, 450),
        Action("search_then_answer", 0.68, 0.91, 0.98, 0.004, 1300),
        Action("calculator_chain", 0.60, 0.75, 0.99, 0.003, 700),
    )),
    Domain("plugin_budget", "ucb1", {"c": 0.5}, (
        Action("budget_100ms", 0.40, 0.80, 0.99, 0.000, 100),
        Action("budget_500ms", 0.66, 0.85, 0.99, 0.001, 480),
        Action("budget_2000ms", 0.74, 0.86, 0.96, 0.002, 1900),  # past an interactive request's latency budget
    )),
)  # fmt: skip
#: the shields' budgets: a free request may not cost more than this; an interactive one may
#: not take longer (p95) than this
FREE_MAX_COST_USD = 0.02
INTERACTIVE_MAX_LATENCY_MS = 1500.0


def signals(rng: np.random.Generator, action: Action) -> dict[str, float]:
    """One outcome of taking ``action``: the five signals."""
    return {
        "quality": float(np.clip(rng.normal(action.quality, 0.15), 0.0, 1.0)),
        "groundedness": float(rng.random() < action.groundedness),
        "safety": float(rng.random() < action.safety),
        "cost_usd": action.cost_usd,
        "latency_ms": float(action.latency_ms * np.exp(rng.normal(0.0, LATENCY_SIGMA))),
    }


def expected_rewards(domain: Domain, engine, *, draws: int = 20_000, seed: int = 0) -> np.ndarray:
    """Each action's expected reward under the engine, by a seeded Monte Carlo (the latency
    cap and the quality clip make a closed form awkward; 20,000 draws: standard error ~0.001)."""
    rng = np.random.default_rng(seed)
    return np.array([np.mean([engine.score(signals(rng, a)) for _ in range(draws)]) for a in domain.actions])

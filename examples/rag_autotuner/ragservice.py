"""The RAG service the auto-tuner tunes, simulated with a known truth.

A question (its category and length) is answered with one retrieval/generation
configuration; the service reports the answer's faithfulness F and relevancy R (RAGAS-style
judges, noisy), its latency and its cost, and whether it broke a content policy. Everything
the tuner must learn is hidden here:

- **retrieval**: each category has a best mix of lexical and dense retrieval (its
  ``DENSE_AFFINITY``: policy questions name the words of the policy, how-to questions
  paraphrase); BM25 is fusion weight 0, dense 1, a hybrid anything between, with a small
  bonus for fusing at all;
- **top-k**: recall grows with k and saturates at a scale that grows with the question's
  length, and passages beyond about twice that scale distract the generator (a re-ranker
  halves the distraction);
- **re-rank**: better answers, but it costs time per passage;
- **prompt template**: ``cited`` is more faithful (and breaks policy less), ``stepwise``
  more relevant for how-to and troubleshooting, ``concise`` for definitions;
- **latency and cost**: both grow with k, re-ranking and the template's length;
- **the embedding upgrade**: the history was logged before the dense retriever's new
  embedding model shipped (``upgraded=False``); since then dense retrieval suits every
  category better (``DENSE_AFFINITY_UPGRADED``) and finds what it needs in fewer passages
  (its recall scale shrinks with the dense share), so more quality costs less: what the warm
  start cannot know and live learning finds.

The reward is the seed's ``α·F + β·R − γ·L̂ − δ·Ĉ − λ·P`` with ``L̂ = min(latency/500 ms, 2)`` and
``Ĉ = min(cost/$0.004, 2)``: the loop's reward engine computes it from the signals
(``REWARD``). The hard gates are ``F ≥ 0.75``, ``R ≥ 0.75`` and p95 latency ≤ 500 ms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

CATEGORIES = ("policy", "howto", "definition", "troubleshooting")
VARIANTS = ("bm25", "dense", "hybrid")
TEMPLATES = ("concise", "cited", "stepwise")
#: the discretised knobs (see the README: why discretised, not sampled)
TOP_K = (3, 5, 8, 12, 16, 24, 32)
FUSION = (0.25, 0.5, 0.75)

#: the seed's reward, in the reward engine's compact form
ALPHA, BETA, GAMMA, DELTA, LAMBDA = 0.5, 0.5, 0.1, 0.1, 0.5
LATENCY_SCALE_MS, COST_SCALE_USD = 500.0, 0.004
REWARD = (f"{ALPHA}*faithfulness + {BETA}*relevancy - {GAMMA}*min(latency_ms/{LATENCY_SCALE_MS:g}, 2) "
          f"- {DELTA}*min(cost_usd/{COST_SCALE_USD:g}, 2) - {LAMBDA}*violation")  # fmt: skip
#: the hard gates
QUALITY_FLOOR, P95_BUDGET_MS = 0.75, 500.0
#: configurations whose planned p95 latency is above this are never offered (10% headroom)
SHIELD_P95_MS = 450.0

DENSE_AFFINITY = {"policy": 0.2, "howto": 0.8, "definition": 0.35, "troubleshooting": 0.65}
#: the same after the embedding upgrade: dense retrieval now finds policy wording too
DENSE_AFFINITY_UPGRADED = {"policy": 0.6, "howto": 0.9, "definition": 0.7, "troubleshooting": 0.85}
RECALL_SCALE = {"policy": 5.0, "howto": 8.0, "definition": 4.0, "troubleshooting": 10.0}
#: (ΔF, ΔR) of each template per category
TEMPLATE_FIT = {
    "policy": {"concise": (0.0, 0.0), "cited": (0.06, 0.01), "stepwise": (-0.02, -0.01)},
    "howto": {"concise": (-0.01, -0.02), "cited": (0.02, 0.0), "stepwise": (0.02, 0.07)},
    "definition": {"concise": (0.01, 0.04), "cited": (0.03, 0.0), "stepwise": (-0.03, -0.03)},
    "troubleshooting": {"concise": (-0.02, -0.03), "cited": (0.03, 0.01), "stepwise": (0.03, 0.06)},
}
GENERATION_MS = {"concise": 0.0, "cited": 40.0, "stepwise": 90.0}
GENERATION_TOKENS = {"concise": 150, "cited": 220, "stepwise": 320}
LATENCY_SIGMA = 0.15  # lognormal spread of one answer's latency
JUDGE_NOISE = 0.04
#: how much the embedding upgrade shrinks dense retrieval's recall scale (at dense share 1)
UPGRADE = 0.45


@dataclass(frozen=True)
class Config:
    """One retrieval/generation configuration."""

    variant: str
    k: int
    rerank: bool
    template: str
    fusion: float = 0.0

    @property
    def id(self) -> str:
        retrieval = f"hybrid{self.fusion:.2f}" if self.variant == "hybrid" else self.variant
        return f"{retrieval}-k{self.k}-{'rerank' if self.rerank else 'norerank'}-{self.template}"

    @property
    def dense_share(self) -> float:
        return {"bm25": 0.0, "dense": 1.0}.get(self.variant, self.fusion)

    def features(self) -> dict:
        """What the shared model sees of the configuration (the knobs and two shapes of them)."""
        w = self.dense_share
        return {"variant": self.variant, "template": self.template, "rerank": self.rerank,
                "dense_share": w, "dense_share_sq": w * w, "log_k": math.log(self.k), "k": float(self.k)}  # fmt: skip

    def action(self) -> dict:
        return {"id": self.id, "features": self.features()}

    @cached_property
    def mean_latency_ms(self) -> float:
        retrieval = 180.0 + 5.0 * self.k + {"bm25": 0.0, "dense": 35.0, "hybrid": 55.0}[self.variant]
        return retrieval + (30.0 + 9.0 * self.k if self.rerank else 0.0) + GENERATION_MS[self.template]

    @property
    def planned_p95_ms(self) -> float:
        """p95 of its latency (what the latency budget is planned with)."""
        return self.mean_latency_ms * math.exp(1.645 * LATENCY_SIGMA)

    @cached_property
    def cost_usd(self) -> float:
        tokens = 400 + 220 * self.k + GENERATION_TOKENS[self.template]
        return tokens * 1.5e-6 + (4e-5 * self.k if self.rerank else 0.0)


def all_configs() -> list[Config]:
    out = []
    for variant in VARIANTS:
        for fusion in FUSION if variant == "hybrid" else (0.0,):
            for k in TOP_K:
                for rerank in (False, True):
                    for template in TEMPLATES:
                        out.append(Config(variant, k, rerank, template, fusion))
    return out


#: the hand-set production configuration: what the service ran before the tuner
PROD = Config("bm25", 8, False, "concise")
#: what may be offered at all: within the latency budget with headroom
ALLOWED = [c for c in all_configs() if c.planned_p95_ms <= SHIELD_P95_MS]
BY_ID = {c.id: c for c in ALLOWED}
assert PROD.id in BY_ID


@dataclass(frozen=True)
class Question:
    category: str
    words: int

    def context(self) -> dict:
        return {"category": self.category, "words": float(self.words)}


@dataclass(frozen=True)
class Answer:
    faithfulness: float
    relevancy: float
    latency_ms: float
    cost_usd: float
    violation: float

    def signals(self) -> dict[str, float]:
        return {"faithfulness": self.faithfulness, "relevancy": self.relevancy, "latency_ms": self.latency_ms,
                "cost_usd": self.cost_usd, "violation": self.violation}  # fmt: skip

    @property
    def reward(self) -> float:
        return reward(self.faithfulness, self.relevancy, self.latency_ms, self.cost_usd, self.violation)


def reward(f: float, r: float, latency_ms: float, cost_usd: float, violation: float) -> float:
    return (ALPHA * f + BETA * r - GAMMA * min(latency_ms / LATENCY_SCALE_MS, 2.0)
            - DELTA * min(cost_usd / COST_SCALE_USD, 2.0) - LAMBDA * violation)  # fmt: skip


def questions(n: int, rng: np.random.Generator) -> list[Question]:
    cats = rng.choice(len(CATEGORIES), size=n, p=[0.3, 0.3, 0.2, 0.2])
    words = rng.integers(5, 41, size=n)
    return [Question(CATEGORIES[c], int(w)) for c, w in zip(cats, words)]


def quality(question: Question, config: Config, upgraded: bool = True) -> tuple[float, float]:
    """The expected (F, R) of answering ``question`` with ``config`` (before or after the
    embedding upgrade)."""
    c = question.category
    affinity = (DENSE_AFFINITY_UPGRADED if upgraded else DENSE_AFFINITY)[c]
    fit = 1.0 - 0.8 * (config.dense_share - affinity) ** 2 + (0.03 if config.variant == "hybrid" else 0.0)
    scale = RECALL_SCALE[c] * (0.7 + 0.6 * (question.words - 5) / 35) * (1.0 - UPGRADE * config.dense_share * upgraded)
    recall = 1.0 - math.exp(-config.k / scale)
    distraction = 0.004 * max(0.0, config.k - 2.0 * scale) * (0.5 if config.rerank else 1.0)
    q = fit * recall
    df, dr = TEMPLATE_FIT[c][config.template]
    f = 0.55 + 0.30 * q + (0.05 if config.rerank else 0.0) - distraction + df
    r = 0.56 + 0.32 * q + (0.04 if config.rerank else 0.0) - 0.6 * distraction + dr
    return f, r


def violation_rate(config: Config) -> float:
    return 0.01 if config.template == "cited" else 0.03


def expected_reward(question: Question, config: Config, upgraded: bool = True) -> float:
    """The truth the tuner learns: the reward's expectation (latency's lognormal mean included)."""
    f, r = quality(question, config, upgraded)
    latency = config.mean_latency_ms * math.exp(LATENCY_SIGMA**2 / 2)
    return reward(f, r, latency, config.cost_usd, violation_rate(config))


def answer(question: Question, config: Config, rng: np.random.Generator, upgraded: bool = True) -> Answer:
    f, r = quality(question, config, upgraded)
    return Answer(
        faithfulness=float(np.clip(f + rng.normal(0.0, JUDGE_NOISE), 0.0, 1.0)),
        relevancy=float(np.clip(r + rng.normal(0.0, JUDGE_NOISE), 0.0, 1.0)),
        latency_ms=float(config.mean_latency_ms * math.exp(rng.normal(0.0, LATENCY_SIGMA))),
        cost_usd=config.cost_usd,
        violation=float(rng.random() < violation_rate(config)),
    )


def slate(rng: np.random.Generator, size: int) -> list[Config]:
    """The candidates one request is offered: the production configuration first (the
    baseline), then ``size - 1`` others drawn from the allowed ones."""
    others = [c for c in ALLOWED if c != PROD]
    picks = rng.choice(len(others), size=size - 1, replace=False)
    return [PROD, *(others[i] for i in sorted(picks))]

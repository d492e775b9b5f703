"""The simulated assistant of the routing example: its requests, its three decisions, and the truth.

A request has an ``intent`` (billing, tech, chitchat, legal) with the intent classifier's
``confidence``, a ``language`` (en, de, fr), a ``guardian`` state (``ok``, or ``flagged`` when
the safety guardian marked the request as sensitive) and a ``text_len`` in characters. For
each request the assistant decides three things:

- **route**: answer with the ``fast`` model path or the ``deep`` one. The fast path is cheap
  and quick and good enough on short, confidently classified, English small talk; its quality
  falls with the text's length, a low confidence, another language, a flagged request, and on
  tech and legal questions. The deep path is slow and dear and good nearly everywhere.
- **tools**: which tool the answer calls (``search``, ``calculator``, ``kb_lookup``, or
  ``none``); the best one depends on the intent.
- **cache**: ``no_cache``, an ``exact`` cache, or a ``semantic`` one (hits on paraphrases too,
  at some cost in quality: a near-duplicate question's answer is not always this one's).

Every outcome is three signals: ``quality`` (a judge's score in [0, 1], drawn from a Beta
distribution around its mean), ``latency_ms`` (log-normal around the median) and
``cost_usd``. The reward is :data:`REWARD` over them, linear, so every expected reward below is
exact: ``E[quality] - 0.1 * E[latency_ms] / 1000 - 10 * E[cost_usd]``.

The route's expected reward is linear in the features the router sees (the intent, language
and guardian indicators, the text length and the confidence), so a linear contextual policy
can learn it exactly; which path is better changes sign across requests, so neither fixed path
is close.

``reward_log.jsonl`` is what the assistant logged before banditstream: its old router picked
the path uniformly at random (``probability`` 0.5). An interaction line carries
``interaction_id``, ``agent`` (the path), ``context``, ``timestamp`` and ``probability``; a
feedback line ``interaction_id`` and ``reward`` (with the three signals, for audit).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: one reward for all three decisions: the judged quality, less 0.1 per second and 10 per dollar
REWARD = "quality - 0.1*latency_ms/1000 - 10*cost_usd"

INTENTS = ("billing", "tech", "chitchat", "legal")
INTENT_SHARE = (0.30, 0.25, 0.30, 0.15)
LANGUAGES = ("en", "de", "fr")
LANGUAGE_SHARE = (0.6, 0.25, 0.15)
FLAGGED_SHARE = 0.12

PATHS = ("fast", "deep")
TOOLS = ("search", "calculator", "kb_lookup", "none")  # search first: what the assistant did before
CACHES = ("no_cache", "exact", "semantic")  # no_cache first: what the assistant did before

#: the judge's Beta concentration around the mean quality
CONCENTRATION = 8.0
LATENCY_SIGMA = 0.3
#: E[latency] = median * exp(sigma^2 / 2) for a log-normal latency
LATENCY_MEAN = math.exp(LATENCY_SIGMA**2 / 2)


@dataclass(frozen=True)
class ModelPath:
    """A model path's quality (a linear function of the request) and its latency and price."""

    quality: dict[str, float]  # per intent, at 100 characters, confidence 0.75, English, guardian ok
    language: dict[str, float]
    flagged: float
    per_100_chars: float
    per_confidence: float
    latency_ms: float  # median, plus latency_per_char per character
    latency_per_char: float
    cost_usd: float  # plus cost_per_char per character
    cost_per_char: float


ROUTE = {
    "fast": ModelPath(quality={"billing": 0.68, "tech": 0.56, "chitchat": 0.84, "legal": 0.56},
                  language={"en": 0.0, "de": -0.05, "fr": -0.05}, flagged=-0.10, per_100_chars=-0.04,
                  per_confidence=0.45, latency_ms=250.0, latency_per_char=0.8, cost_usd=0.0002, cost_per_char=1e-6),
    "deep": ModelPath(quality={"billing": 0.82, "tech": 0.84, "chitchat": 0.84, "legal": 0.84},
                  language={"en": 0.0, "de": -0.01, "fr": -0.01}, flagged=-0.02, per_100_chars=-0.003,
                  per_confidence=0.05, latency_ms=1800.0, latency_per_char=0.8, cost_usd=0.002, cost_per_char=6e-6),
}  # fmt: skip

#: mean judged quality of each tool (TOOLS order) per intent (INTENTS order)
TOOL_QUALITY = np.array([
    [0.62, 0.70, 0.80, 0.55],  # billing: the knowledge base has the plans and the invoices
    [0.82, 0.50, 0.70, 0.58],  # tech: searching the docs and the forums
    [0.66, 0.55, 0.62, 0.82],  # chitchat: a tool only slows the answer down
    [0.66, 0.45, 0.86, 0.50],  # legal: the knowledge base has the terms
])  # fmt: skip
TOOL_LATENCY_MS = np.array([900.0, 150.0, 400.0, 0.0])  # on top of the answer's ANSWER_LATENCY_MS
TOOL_COST_USD = np.array([0.002, 0.0, 0.0005, 0.0])  # on top of ANSWER_COST_USD
ANSWER_LATENCY_MS, ANSWER_COST_USD = 800.0, 0.001

#: the cache: (hit rate, quality on a hit, latency on a hit (ms), extra latency on a miss (ms),
#: extra cost per lookup (USD)); a miss costs an answer (CACHE_ANSWER_*) on top
CACHE = {
    "no_cache": (0.0, 0.0, 0.0, 0.0, 0.0),
    "exact": (0.15, 0.78, 30.0, 5.0, 0.0),
    "semantic": (0.60, 0.73, 80.0, 60.0, 0.0001),
}
CACHE_ANSWER_QUALITY, CACHE_ANSWER_LATENCY_MS, CACHE_ANSWER_COST_USD = 0.78, 1400.0, 0.004


@dataclass(frozen=True)
class Request:
    interaction_id: str
    intent: str
    language: str
    guardian: str
    text_len: int
    confidence: float

    def context(self) -> dict[str, float | str]:
        """What the router sees: three categorical features, two numeric ones."""
        return {"intent": self.intent, "language": self.language, "guardian": self.guardian,
                "text_len": float(self.text_len), "confidence": self.confidence}  # fmt: skip


def request(rng: np.random.Generator, interaction_id: str) -> Request:
    intent = INTENTS[rng.choice(len(INTENTS), p=INTENT_SHARE)]
    language = LANGUAGES[rng.choice(len(LANGUAGES), p=LANGUAGE_SHARE)]
    guardian = "flagged" if rng.random() < FLAGGED_SHARE else "ok"
    text_len = int(np.clip(rng.gamma(2.0, 100.0), 20, 700))
    confidence = round(float(np.clip(rng.beta(4.0, 1.6), 0.4, 0.99)), 3)
    return Request(interaction_id, intent, language, guardian, text_len, confidence)


# -- route --------------------------------------------------------------------------------


def _route_quality(path: ModelPath, r: Request) -> float:
    """The judge's mean score of the path's answer: linear in the request's features."""
    return _clip(path.quality[r.intent] + path.language[r.language] + path.flagged * (r.guardian == "flagged")
                 + path.per_100_chars * (r.text_len - 100) / 100 + path.per_confidence * (r.confidence - 0.75))  # fmt: skip


def route_means(r: Request) -> np.ndarray:
    """The expected reward of each path (PATHS order) on this request."""
    out = []
    for name in PATHS:
        path = ROUTE[name]
        latency = (path.latency_ms + path.latency_per_char * r.text_len) * LATENCY_MEAN
        cost = path.cost_usd + path.cost_per_char * r.text_len
        out.append(_route_quality(path, r) - 0.1 * latency / 1000 - 10 * cost)
    return np.array(out)


def route_outcome(rng: np.random.Generator, r: Request, name: str) -> dict[str, float]:
    path = ROUTE[name]
    return {"quality": _judge(rng, _route_quality(path, r)),
            "latency_ms": _latency(rng, path.latency_ms + path.latency_per_char * r.text_len),
            "cost_usd": path.cost_usd + path.cost_per_char * r.text_len}  # fmt: skip


# -- tools --------------------------------------------------------------------------------


def tool_means(r: Request) -> np.ndarray:
    """The expected reward of each tool (TOOLS order) for this request's intent."""
    latency = (ANSWER_LATENCY_MS + TOOL_LATENCY_MS) * LATENCY_MEAN
    return TOOL_QUALITY[INTENTS.index(r.intent)] - 0.1 * latency / 1000 - 10 * (ANSWER_COST_USD + TOOL_COST_USD)


def tool_outcome(rng: np.random.Generator, r: Request, tool: str) -> dict[str, float]:
    k = TOOLS.index(tool)
    return {"quality": _judge(rng, TOOL_QUALITY[INTENTS.index(r.intent), k]),
            "latency_ms": _latency(rng, ANSWER_LATENCY_MS + TOOL_LATENCY_MS[k]),
            "cost_usd": ANSWER_COST_USD + float(TOOL_COST_USD[k])}  # fmt: skip


# -- cache --------------------------------------------------------------------------------


def cache_means() -> np.ndarray:
    """The expected reward of each cache strategy (CACHES order): the same on every request."""
    miss = CACHE_ANSWER_QUALITY - 0.1 * CACHE_ANSWER_LATENCY_MS * LATENCY_MEAN / 1000 - 10 * CACHE_ANSWER_COST_USD
    out = []
    for name in CACHES:
        rate, quality, hit_ms, miss_ms, lookup = CACHE[name]
        hit_reward = quality - 0.1 * hit_ms * LATENCY_MEAN / 1000 - 10 * lookup
        miss_reward = miss - 0.1 * miss_ms * LATENCY_MEAN / 1000 - 10 * lookup
        out.append(rate * hit_reward + (1 - rate) * miss_reward)
    return np.array(out)


def cache_outcome(rng: np.random.Generator, strategy: str) -> dict[str, float]:
    rate, quality, hit_ms, miss_ms, lookup = CACHE[strategy]
    if rng.random() < rate:
        return {"quality": _judge(rng, quality), "latency_ms": _latency(rng, hit_ms), "cost_usd": lookup}
    return {"quality": _judge(rng, CACHE_ANSWER_QUALITY), "latency_ms": _latency(rng, CACHE_ANSWER_LATENCY_MS + miss_ms),
            "cost_usd": CACHE_ANSWER_COST_USD + lookup}  # fmt: skip


# -- draws and the log --------------------------------------------------------------------


def _clip(mean: float) -> float:
    """A judge's mean stays inside (0, 1): the rare extreme request (long, unsure, flagged,
    not English) is as bad as an answer gets, not worse."""
    return min(max(mean, 0.02), 0.98)


def _judge(rng: np.random.Generator, mean: float) -> float:
    return float(rng.beta(mean * CONCENTRATION, (1.0 - mean) * CONCENTRATION))


def _latency(rng: np.random.Generator, median: float) -> float:
    return float(median * np.exp(rng.normal(0.0, LATENCY_SIGMA)))


def reward(signals: dict[str, float]) -> float:
    """:data:`REWARD`, as the assistant computed it before banditstream."""
    return signals["quality"] - 0.1 * signals["latency_ms"] / 1000 - 10 * signals["cost_usd"]


def write_reward_log(path: Path, n: int, *, seed: int, start_ms: int) -> list[Request]:
    """``n`` requests of the old router (uniform over the paths), each with its feedback line,
    a few seconds apart from ``start_ms``. Returns the requests, for the truth."""
    rng = np.random.default_rng(seed)
    requests = []
    with open(path, "w") as out:
        for i in range(n):
            r = request(rng, f"hist-{i:06d}")
            requests.append(r)
            name = PATHS[int(rng.integers(len(PATHS)))]
            signals = route_outcome(rng, r, name)
            out.write(json.dumps({"interaction_id": r.interaction_id, "agent": name, "context": r.context(),
                                  "timestamp": start_ms + 3000 * i, "probability": 1.0 / len(PATHS)}) + "\n")  # fmt: skip
            out.write(json.dumps({"interaction_id": r.interaction_id, "reward": round(reward(signals), 5),
                                  **{k: round(v, 5) for k, v in signals.items()}}) + "\n")  # fmt: skip
    return requests

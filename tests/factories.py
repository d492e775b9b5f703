"""Seeded builders of realistic events for tests."""

from __future__ import annotations

import random

TASKS = ("code", "chat", "summarise", "translate", "extract")
LANGS = ("en", "sv", "de", "fr")
MODELS = ("gpt-small", "gpt-large", "claude-haiku", "llama-70b", "mistral-7b")


def decision(i: int, rng: random.Random, *, domain: str = "routing", n_actions: int = 5, vector_dim: int = 0) -> dict:
    """A DecisionEvent like a router logs: 20 context features, candidates with 3 features each."""
    numeric = {f"f{j}": rng.gauss(0.0, 1.0) for j in range(16)}
    numeric["prompt_tokens"] = float(rng.randint(5, 4000))
    categorical = {"task": rng.choice(TASKS), "lang": rng.choice(LANGS), "tier": rng.choice(("free", "pro"))}
    k = n_actions
    weights = [rng.random() + 0.05 for _ in range(k)]
    total = sum(weights)
    probabilities = [w / total for w in weights]
    probabilities[-1] = 1.0 - sum(probabilities[:-1])
    return {
        "event_id": f"{domain}-{i:08d}",
        "tenant": "default",
        "workspace": "main",
        "domain": domain,
        "timestamp": 1_700_000_000_000 + i,
        "context": {"numeric": numeric, "categorical": categorical, "vector": [rng.random() for _ in range(vector_dim)]},
        "actions": [
            {
                "id": MODELS[a % len(MODELS)] + ("" if a < len(MODELS) else f"-{a}"),
                "features": {
                    "numeric": {"cost": rng.random(), "latency": rng.random(), "quality": rng.random()},
                    "categorical": {},
                    "vector": [],
                },
            }
            for a in range(k)
        ],
        "chosen": rng.randrange(k),
        "probabilities": probabilities,
        "policy_version": "1.0.0",
        "mode": "live",
        "deferred": False,
        "recommended": -1,
        "channel": "stable",
        "recommended_probabilities": [],
        "recommended_version": "",
    }


def reward(event_id: str, j: int, rng: random.Random, *, domain: str = "routing") -> dict:
    return {
        "event_id": event_id,
        "reward_id": f"{event_id}-r{j}",
        "tenant": "default",
        "workspace": "main",
        "domain": domain,
        "timestamp": 1_700_000_000_000 + j,
        "signals": {"success": float(rng.random() < 0.7), "latency_ms": rng.uniform(50, 3000)},
        "value": None,
    }

"""The simulated assistant of the adaptation loop: its agents, its questions, and the truth.

Four answering agents (the seed's RAG variants and the LoRA-adapted student) serve questions
of five categories. How well each answers is a known function of the category and of the
question's length (agentic retrieval pays off on long, multi-part questions; the naive one is
best on short FAQ-like ones). A judged answer scores in [0, 1], drawn from a Beta
distribution around that mean, as an LLM judge's scores spread.

``reward_log.jsonl`` is what the assistant logged before banditstream: every interaction
(``interaction_id``, ``question``, ``agent``, ``category``, ``top_k``, ``timestamp``,
``probability``), and a feedback line (``interaction_id``, ``reward``) for those a user
rated. The legacy router picked the agent uniformly at random, and says so in
``probability``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

AGENTS = ("naive_rag", "agentic_rag", "hybrid_rag", "lora_rag")
CATEGORIES = ("billing", "technical", "product", "account", "general")

#: mean judged score of each agent (columns, in AGENTS order) per category, at a question of
#: 12 words
BASE = np.array([
    [0.66, 0.50, 0.60, 0.45],  # billing: short, factual - the naive retriever is enough
    [0.30, 0.62, 0.55, 0.72],  # technical: the LoRA student was tuned on technical answers
    [0.48, 0.50, 0.70, 0.45],  # product: hybrid (BM25 + vectors) finds product names
    [0.60, 0.48, 0.62, 0.50],  # account
    [0.45, 0.55, 0.58, 0.40],  # general
])  # fmt: skip
#: change of the mean per 10 words of question beyond 12 (agentic retrieval decomposes)
LENGTH_SLOPE = np.array([-0.06, 0.07, 0.01, 0.0])
#: Beta concentration of the judge's scores around the mean
CONCENTRATION = 6.0
TOP_K = (3, 5, 8)
WORDS = ("how", "do", "i", "change", "my", "plan", "when", "the", "api", "returns", "an", "error", "after",
         "upgrading", "which", "product", "supports", "export", "to", "csv", "and", "why", "is", "invoice", "late")


@dataclass(frozen=True)
class Question:
    interaction_id: str
    question: str
    category: str
    top_k: int

    @property
    def words(self) -> int:
        return len(self.question.split())

    def context(self) -> dict[str, float | str]:
        """The features the router sees, named as ``banditstream replay`` names them."""
        return {"category": self.category, "question_words": float(self.words), "top_k": float(self.top_k)}


def means(question: Question) -> np.ndarray:
    """The expected judged score of every agent (AGENTS order) on this question."""
    row = BASE[CATEGORIES.index(question.category)]
    return np.clip(row + LENGTH_SLOPE * (question.words - 12) / 10.0, 0.02, 0.98)


def ask(rng: np.random.Generator, interaction_id: str) -> Question:
    category = CATEGORIES[rng.choice(len(CATEGORIES), p=[0.25, 0.3, 0.2, 0.15, 0.1])]
    words = int(np.clip(rng.gamma(3.0, 5.0), 3, 60))
    text = " ".join(rng.choice(WORDS, size=words))
    return Question(interaction_id, text + "?", category, int(rng.choice(TOP_K)))


def judge(rng: np.random.Generator, question: Question, agent: str) -> float:
    """One judged score in [0, 1] for the agent's answer."""
    mean = means(question)[AGENTS.index(agent)]
    return float(rng.beta(mean * CONCENTRATION, (1.0 - mean) * CONCENTRATION))


def write_reward_log(path: Path, n: int, *, seed: int, start_ms: int, rated: float = 1.0) -> list[Question]:
    """``n`` interactions of the legacy (uniform) router, a feedback line for ``rated`` of them,
    a few seconds apart from ``start_ms``. Returns the questions, for the truth."""
    rng = np.random.default_rng(seed)
    questions = []
    with open(path, "w") as out:
        for i in range(n):
            q = ask(rng, f"hist-{i:06d}")
            questions.append(q)
            agent = AGENTS[int(rng.integers(len(AGENTS)))]
            ts = start_ms + 3000 * i
            out.write(json.dumps({"interaction_id": q.interaction_id, "question": q.question, "agent": agent,
                                  "category": q.category, "top_k": q.top_k, "timestamp": ts,
                                  "probability": 1.0 / len(AGENTS)}) + "\n")  # fmt: skip
            if rng.random() < rated:
                out.write(json.dumps({"interaction_id": q.interaction_id, "reward": round(judge(rng, q, agent), 4)}) + "\n")
    return questions

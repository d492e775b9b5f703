"""The simulated interrogator of the example: its tasks, its question templates, the embedded
conversation, the answers and their cache, and the truth.

The interrogator is an agent that works out a hidden target (a text it cannot read) by asking
questions about it, as Perquire does: after each answer it revises its guess, and the task is
solved when the guess's similarity to the target reaches :data:`SOLVED` (0.9, the seed's
"steps to 90% similarity"), or given up after :data:`STEP_CAP` questions. Each step it asks one
of :data:`TEMPLATES`, 50 question templates (the seed's ``questions.yaml``).

**Which question helps** depends on the target's kind (one of :data:`KINDS`: code, a recipe, a
news story, ...) and on how close the guess already is (:func:`usefulness`):

- ``q01``-``q08`` are generic ("What is it about?"): of some use on every kind, all along;
- ``q09``-``q26`` are broad, three per kind ("Is it a program?"): of much use on their own kind
  while the guess is far off, of little once it is close;
- ``q27``-``q50`` are narrow, four per kind ("Which language is it in?"): the other way round,
  of much use on their own kind once the guess is close;
- asked about another kind, a broad or narrow question is of a little use (a "no" rules
  something out).

**The state** is the conversation so far, embedded: a 256-D vector of about unit length. The
simulator makes it as a fixed random projection (:data:`PROJECTION`) of the conversation's
latent content (:func:`latent`: the kind, how far the guess still has to go, and eight factors
of style that matter to no question) plus a little noise. The kind is nowhere in the state by
name: a policy has to read it from the embedding.

**The answer** moves the guess: ``sim_gain``, the rise in similarity, is ``(1 - s) * u`` on
average, where ``s`` is the similarity before and ``u`` the template's use here, with
log-normal noise. The answer comes from the answer cache (redis, shared by the fleet) or from a
fresh LLM call: a closed question (few distinct answers: "Which language is it in?") finds its
answer cached 85% of the time, an open one ("Describe its tone") 20% (:data:`CACHE_HIT`). In
each kind's broad and narrow groups the open questions are a little more useful than the
closed ones, so the cache and the gain pull apart, and the cache wins near the end, where
every gain is small.

**The reward** is the seed's ``sim_gain - 0.05 * cache_miss``. Its expectation is linear in
the latent content (:func:`expected_rewards`), so a linear policy over the embedding can learn
it; the example knows it exactly, for every template on every state.

**The fixed order** (:data:`FIXED_ORDER`) is what the interrogator did before: ``q01``,
``q02``, ... in the file's order, one per step, whatever the conversation. ``log.jsonl`` is
what it logged once that order was made ε-random (:data:`EPSILON` of the steps ask a template
drawn uniformly) so that every template has data: an interaction line carries
``interaction_id``, ``agent`` (the template), ``context`` (``{"embedding": [256 numbers]}``),
``timestamp`` and ``probability`` (exact: ``1 - ε + ε/50`` for the order's template, ``ε/50``
for any other); a feedback line ``interaction_id`` and ``reward``, with ``sim_gain`` and
``cache_hit`` beside it for audit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

KINDS = ("code", "recipe", "news", "review", "poem", "legal")
TEMPLATES = tuple(f"q{i:02d}" for i in range(1, 51))
#: what the interrogator did before: the templates in the file's order, one per step
FIXED_ORDER = TEMPLATES

#: a task is solved once the guess's similarity to the target reaches this
SOLVED = 0.9
#: and given up after this many questions
STEP_CAP = 30
#: the reward's price of a cache miss (the seed's λ)
CACHE_PENALTY = 0.05
#: the share of the logging policy's steps that ask a template drawn uniformly
EPSILON = 0.5
#: log-normal noise of the similarity gain
GAIN_SIGMA = 0.25

#: the embedding's dimension
DIM = 256
#: latent factors of the conversation's style: in the embedding, of no use to any question
STYLE = 8
#: the embedding's noise, per dimension
NOISE = 0.003


def _usefulness() -> tuple[np.ndarray, np.ndarray]:
    """``(early, late)``: each template's use (the share of the remaining distance its answer
    closes) on each kind, far from the target and close to it; shape (50, len(KINDS))."""
    early = np.full((len(TEMPLATES), len(KINDS)), 0.06)  # another kind's question
    late = np.full((len(TEMPLATES), len(KINDS)), 0.05)
    early[:8], late[:8] = np.linspace(0.20, 0.14, 8)[:, None], np.linspace(0.17, 0.12, 8)[:, None]  # generic
    for k in range(len(KINDS)):
        broad = 8 + 3 * k  # open, open, closed
        early[broad : broad + 3, k], late[broad : broad + 3, k] = (0.33, 0.32, 0.30), 0.06
        narrow = 26 + 4 * k  # open, closed, open, closed
        early[narrow : narrow + 4, k], late[narrow : narrow + 4, k] = 0.08, (0.37, 0.34, 0.36, 0.33)
    return early, late


EARLY, LATE = _usefulness()
#: each template's chance of finding its answer in the cache: closed questions 0.85, open 0.2
CACHE_HIT = np.array([0.2] * 8 + [0.2, 0.2, 0.85] * 6 + [0.2, 0.85, 0.2, 0.85] * 6)

#: the embedder, as the simulator plays it: the latent content (:func:`latent`) to 256-D, the
#: same on every run; a conversation's embedding comes out about unit length
PROJECTION = np.random.default_rng(20250601).normal(0.0, 0.6 / np.sqrt(DIM), (DIM, 3 * len(KINDS) + 2 + STYLE))


def stage(similarity: float) -> float:
    """How close the guess is, as the questions feel it: 0 far off (below 0.5), 1 close (above
    0.8), linear between."""
    return float(np.clip((similarity - 0.5) / 0.3, 0.0, 1.0))


def usefulness(kind: int, similarity: float) -> np.ndarray:
    """Every template's use at this point of a task of this kind (TEMPLATES order)."""
    late = stage(similarity)
    return (1.0 - late) * EARLY[:, kind] + late * LATE[:, kind]


def expected_rewards(kind: int, similarity: float) -> np.ndarray:
    """The expected reward of every template (TEMPLATES order): ``E[sim_gain] - λ E[miss]``."""
    return (1.0 - similarity) * usefulness(kind, similarity) - CACHE_PENALTY * (1.0 - CACHE_HIT)


def latent(kind: int, similarity: float, style: np.ndarray) -> np.ndarray:
    """The conversation's latent content: the kind, and how far the guess still has to go at
    each stage, per kind (the expected gains are linear in these), the similarity, the style."""
    onehot = np.zeros(len(KINDS))
    onehot[kind] = 1.0
    late = stage(similarity)
    far, close = (1.0 - similarity) * (1.0 - late), (1.0 - similarity) * late
    return np.concatenate([onehot, onehot * far, onehot * close, [similarity, 1.0 - similarity], style])


@dataclass(frozen=True)
class Task:
    """A target to work out: its kind (hidden from the agent), the first guess's similarity."""

    task_id: str
    kind: int
    start: float
    #: seeds the task's own draws (its embedding's noise, its answers)
    seed: int


@dataclass(frozen=True)
class Answer:
    """What a question brought: the rise in similarity, and whether the cache answered it."""

    sim_gain: float
    cache_hit: bool

    @property
    def reward(self) -> float:
        return self.sim_gain - CACHE_PENALTY * (not self.cache_hit)


def task(rng: np.random.Generator, task_id: str) -> Task:
    """A task of a uniformly drawn kind, its first guess 0.25 to 0.4 similar to the target."""
    return Task(task_id, int(rng.integers(len(KINDS))), round(float(rng.uniform(0.25, 0.4)), 4), int(rng.integers(2**32)))


class Conversation:
    """One task being worked out: the state to decide on, the answer to each question.

    Its draws come from the task's own generator, so every policy that works on the same task
    meets the same noise at the same step (whatever it asks)."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.similarity = task.start
        self.steps = 0
        self.cache_hits = 0
        self._rng = np.random.default_rng(task.seed)
        self._style = self._rng.normal(0.0, 0.3, STYLE)
        self._state: np.ndarray | None = None

    @property
    def done(self) -> bool:
        return self.similarity >= SOLVED or self.steps >= STEP_CAP

    @property
    def solved(self) -> bool:
        return self.similarity >= SOLVED

    def state(self) -> np.ndarray:
        """The conversation so far, embedded (256-D): the same until the next answer."""
        if self._state is None:
            style = self._style + self._rng.normal(0.0, 0.1, STYLE)
            clean = PROJECTION @ latent(self.task.kind, self.similarity, style)
            self._state = clean + self._rng.normal(0.0, NOISE, DIM)
        return self._state

    def means(self) -> np.ndarray:
        """The expected reward of every template now (TEMPLATES order)."""
        return expected_rewards(self.task.kind, self.similarity)

    def ask(self, template: str) -> Answer:
        self.state()  # the step's draws in one order, whoever asks
        k = TEMPLATES.index(template)
        q = usefulness(self.task.kind, self.similarity)[k]
        noise = float(np.exp(self._rng.normal(-GAIN_SIGMA**2 / 2, GAIN_SIGMA)))
        hit = bool(self._rng.random() < CACHE_HIT[k])
        gain = min((1.0 - self.similarity) * q * noise, 1.0 - self.similarity)
        self.similarity += gain
        self.steps += 1
        self.cache_hits += hit
        self._state = None
        return Answer(round(gain, 6), hit)


@dataclass
class Played:
    """Tasks worked out: each conversation (at its end) and every answer, in order."""

    conversations: list[Conversation] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)


def play(tasks: list[Task], choose: Callable[[Conversation], str],
         answered: Callable[[Answer], None] | None = None) -> Played:  # fmt: skip
    """Work out each task, asking ``choose(conversation)`` each step; ``answered(answer)``
    after each answer."""
    played = Played()
    for t in tasks:
        conversation = Conversation(t)
        while not conversation.done:
            answer = conversation.ask(choose(conversation))
            played.answers.append(answer)
            if answered is not None:
                answered(answer)
        played.conversations.append(conversation)
    return played


def fixed_order(conversation: Conversation) -> str:
    """What the interrogator did before: the template the fixed order asks at this step."""
    return FIXED_ORDER[conversation.steps]


def oracle(conversation: Conversation) -> str:
    """The template of the best expected reward now: what a policy that knew the simulator
    would ask."""
    return TEMPLATES[int(np.argmax(conversation.means()))]


@dataclass(frozen=True)
class Logged:
    """A logged step, for the truth: its task's step number and every template's expected reward."""

    step: int
    means: np.ndarray


def write_log(path: Path, n_rows: int, *, seed: int, start_ms: int) -> dict[str, Logged]:
    """``n_rows`` steps of the ε-random fixed order, each with its feedback line, a second
    apart from ``start_ms``. Returns each step's :class:`Logged` by interaction id."""
    rng = np.random.default_rng(seed)
    explore = np.random.default_rng(seed + 1)
    K = len(TEMPLATES)
    logged: dict[str, Logged] = {}
    with open(path, "w") as out:
        while len(logged) < n_rows:
            conversation = Conversation(task(rng, f"hist-{len(logged):06d}"))
            while not conversation.done and len(logged) < n_rows:
                iid = f"hist-{len(logged):06d}"
                state, step = conversation.state(), conversation.steps
                logged[iid] = Logged(step, conversation.means())
                order = fixed_order(conversation)
                template = TEMPLATES[int(explore.integers(K))] if explore.random() < EPSILON else order
                answer = conversation.ask(template)
                out.write(json.dumps({"interaction_id": iid, "agent": template,
                                      "context": {"embedding": [round(float(x), 5) for x in state]},
                                      "timestamp": start_ms + 1000 * len(logged),
                                      "probability": (1 - EPSILON) * (template == order) + EPSILON / K}) + "\n")  # fmt: skip
                out.write(json.dumps({"interaction_id": iid, "reward": round(answer.reward, 6),
                                      "sim_gain": answer.sim_gain, "cache_hit": answer.cache_hit}) + "\n")  # fmt: skip
    return logged

"""Regret suite: banditstream's policies as a user gets them, against peers, on twelve environments.

Every learner meets the same seeded streams (``benchmarks/_regret_envs.py``: stationary linear,
nonlinear, four scikit-learn datasets as bandits with ``digits`` held out, abrupt and gradual
drift, heavy-tailed noise, 100 and 50 arms, arms that appear at T/2) in the same run.

Protocol, per environment, seed and batch size B:

1. The learner decides B consecutive steps with its model frozen (one arm among those available
   at each step, and the probability it was drawn with), then learns from those B rows
   (context, arm, realised reward, probability) at once; B = 200 and B = 1 (fully sequential).
2. Regret is the sum over steps of ``max_k mu_t(k) - mu_t(a_t)``: expected rewards, not the
   noisy ones. Rewards use common random numbers (the reward an arm would realise at a step is
   drawn once), so learners differ only by their choices. The figures are the mean over seeds.
3. No learner is tuned: each runs with its library's defaults, as a user first gets it.

Learners (contexts z are the environment's raw features; each learner gets them the way its
library expects them):

- **ours**: a domain declared with defaults, ``DomainSettings()``: a portfolio of ``lin_igw``
  (inverse-gap weighting over UCB scores: alpha=0.3, gamma_t = 300 sqrt(t), floor eps0=0.01,
  an arm of fewer than 5 rows at least 0.1 x its posterior chance of beating the best score,
  ridge prior 1), the same forgetting (gamma 0.995) and SquareCB on 128 random Fourier features
  of the row, ``lin_igw`` acting first; before each batch is learned every member scores its
  rows and the log's paired (doubly robust) estimate may switch who acts, as the publisher
  does. Over the default features (z sent as named numeric features
  ``{"numeric": {"x0": ..}}``, hashed into 64 slots with an intercept, z-scored by the running
  normaliser). It decides as the SDK does (``encoder.action_matrix``, then
  ``policy.probabilities``) and learns as the join and learner do (each row encoded with the
  normaliser as it stands, then observed; one ``update_batch``). This is the headline. Event time
  is one step a second (a row's ``times`` is its step in ms), so ``half_life_s`` counts steps;
  before each segment it decides, the policy is aged as a snapshot would be (``policy.age()``,
  a no-op unless it forgets by time; at B = 1 that ages every arm every step, which makes a
  half-life variant several times slower than the default there).
- **our LinUCB**, **our LinTS** (floor eps0=0.05, their default), **our IGW** (``lin_igw``, the
  default portfolio's first member): the policies with default parameters on the dense row
  (1, z), no hashing or normalising: what the policy alone does, and what the features cost.
- **MABWiser** LinUCB and LinTS (defaults: alpha=1, l2_lambda=1) on (1, z), since it fits no
  intercept of its own; it predicts a whole frozen segment in one call and learns by
  ``partial_fit``; a new arm joins by ``add_arm``.
- **Vowpal Wabbit** ``--cb_explore_adf -q sa`` with ``--squarecb``, ``--regcb``, ``--bag 5`` and
  ``--epsilon 0.05`` (default learning rate), driven as in ``benchmarks/learner.py``: one
  multi-line text example per row (``shared |s`` with z, one ``|a a<k>`` line per available arm),
  the choice drawn from VW's pmf with a seeded generator, cost = -reward. VW adds its own
  constant; ``-q sa`` gives every arm its own weights on z.
- **contextualbandits** LinUCB and LinTS (defaults; it fits its own intercept), only when
  ``import contextualbandits`` works: the project's venv does not have it (it builds and runs on
  this Python: install it next to the venv and put it on ``PYTHONPATH`` to include it, below).
  Without it the peer is skipped with a note.

The best peer of an environment is the peer with the lowest mean regret; ``ratio`` is ours over
it (below 1: ours has less regret).

**Cap at B = 1.** MABWiser deep-copies every arm's model on each ``partial_fit``, and
contextualbandits is nearly as slow per call: measured here, MABWiser costs 0.5-0.65 ms a step at
10 arms and 5-6.5 ms at 100 (contextualbandits 0.35-0.45 ms at 10), so at B = 1, T = 20,000 and
three seeds MABWiser alone would take over 20 minutes. At B = 1 these peers run only the first
``--b1-cap`` steps (5,000; 0 runs all T): their cells are marked ``*``, they are left out of the best
peer over T, and a second table compares every learner over those first steps (``at_cap`` in the
JSON). At B = 200 they run all T (a whole segment is one ``predict``, a batch one ``partial_fit``).
VW decides and learns one row at a time at any B, so it costs the same at B = 1 and is not
capped (0.1 ms a step at 10 arms, 0.5-0.65 ms at 100).

A full run (T = 20,000, seeds 0-2, B = 200 and 1) with ``--portfolio`` took 52 minutes on one
core before robust learning (2026-11-29) and 2 hours on a busy machine with it (2026-11-30,
beside other runs): 70 minutes of it ours (the default portfolio, each row scored by every
member before it is learned, 30 at B = 1) and its members alone, the Fourier member the slowest;
22 VW's four explorers (one text example per row), 13 the capped peers and 12 our single
policies; ``--quick`` (T = 2,000, seed 0, nothing capped) about 80 s. BLAS is limited to one
thread: every product here is small, and threads only fight each other on a shared machine.
``--jobs N`` runs the cells (environment, seed, batch size, learner) in N processes, one per CPU
with 0; each cell is seeded and its outcome is recorded in the same order as one process would,
so the tables, JSON and plot are the same bit for bit (checked on a small run: 83 s with one
process, 42 s with two, on this two-CPU machine on 2026-11-30).

Run from the repository root::

    .venv/bin/python benchmarks/regret.py --quick
    .venv/bin/python benchmarks/regret.py                      # T=20,000, seeds 0,1,2, B=200 and 1
    .venv/bin/python benchmarks/regret.py --portfolio --jobs 0   # the README's run, one process per CPU
    .venv/bin/python benchmarks/regret.py --envs linear,digits --peers vw --batch-sizes 200
    # with contextualbandits, installed outside the venv:
    .venv/bin/pip install --target /tmp/cb --no-deps contextualbandits
    PYTHONPATH=/tmp/cb .venv/bin/python benchmarks/regret.py --quick

Progress goes to stderr; a table per batch size to stdout, the cumulative-regret curves (B = 200,
mean over seeds, one panel per environment) to ``OUT/regret-curves.png``, and the last line of
stdout is one JSON object: ``{"envs": {env: {"B200": {"ours", "best_peer", "best_peer_name",
"ratio", "ratio_by_seed", "floor_bound", "floor_bound_ratio", "variants"}, "B1": {...}}}, "T",
"seeds", "held_out", ...}``. ``ratio`` is ours' mean regret over the best peer's (the peer with
the least mean regret); ``ratio_by_seed`` is each seed's ours over the least regret any peer had
on that seed. ``floor_bound`` bounds ours' expected regret from below whatever it learns: its
first batch is decided before any feedback (uniformly: every arm starts at the same prior), and
every decision after mixes in ``eps0`` of a uniform choice (the exploration floor that keeps its
log useful for off-policy evaluation), so it expects at least the uniform choice's regret over
the first batch plus ``eps0`` times it over the rest. Where ``floor_bound_ratio`` is above a
target ratio, no learning reaches that target with this floor.

``--portfolio [JSON]`` runs each member of a portfolio alone (columns ``m0``, ``m1``, ...) and
reports under ``portfolio`` in the JSON who the portfolio ended with per seed, its switches,
``picked_over_best`` (that member's regret alone over the best member's), the same over the
last quarter of the steps (``picked_over_best_late``), ``over_best_member`` (the portfolio's
regret over the best member's alone) and ``picked_vs_best`` (``_late``): whether the member it
ended with is the best one within its interval (paired over seeds; a table shows it too).
Without a value those are the default members, and the portfolio is "ours" itself; with other
members (a JSON list) it adds the column "ours portfolio": a domain declared ``policy:
portfolio`` with them, learning and choosing as "ours" does, its regret and ratio under
``variants``.

``--variant NAME:key=value,...`` adds a column of ours with those policy parameters over the
defaults (JSON values), e.g. ``--variant 'ours+detect:detect=true'``; its regret and ratio to
the best peer go under ``variants`` in the JSON. The headline stays the defaults.
"""

from __future__ import annotations

import argparse
import bisect
import concurrent.futures
import functools
import itertools
import json
import multiprocessing
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# Run as a script, this file's folder is sys.path[0], and benchmarks/learner.py would shadow the
# `learner` package benchmarked here; put the repository root there instead.
_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn  # noqa: E402
from rich.table import Table  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from benchmarks._regret_envs import HELD_OUT, Stream, available, generate  # noqa: E402
from learner.domain import DomainSettings  # noqa: E402
from learner.policies import Portfolio, make_policy  # noqa: E402
from learner.policies.base import Choice  # noqa: E402
from learner.policies.portfolio import DEFAULT_MEMBERS  # noqa: E402

PEER_FAMILIES = ("mabwiser", "vw", "contextualbandits")
#: The portfolio of ``--portfolio`` without a value: ``policy: portfolio``'s default members.
PORTFOLIO = list(DEFAULT_MEMBERS)
#: The batch size whose curves are plotted (the first requested one if it is not run).
PLOT_BATCH = 200


# --------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class SuiteConfig:
    """What to run; ``--quick`` shrinks it to T = 2,000 and one seed."""

    steps: int = 20_000
    seeds: tuple[int, ...] = (0, 1, 2)
    batch_sizes: tuple[int, ...] = (200, 1)
    envs: tuple[str, ...] = ()
    peers: tuple[str, ...] = PEER_FAMILIES
    #: Extra columns of ours: a name and policy parameters over the defaults (``--variant``).
    variants: tuple[tuple[str, dict[str, Any]], ...] = ()
    out: Path = _HERE / "out"
    #: Steps the slow per-row peers run at B = 1 (0: all T).
    b1_cap: int = 5_000
    #: ``--portfolio``'s members: each also runs alone, as the column ``m<i>``.
    members: tuple[dict[str, Any], ...] = ()
    #: Processes the cells run in (``--jobs``); the figures do not depend on it.
    jobs: int = 1

    def horizon(self, spec: LearnerSpec, batch: int) -> int:
        if batch == 1 and spec.slow_per_row and 0 < self.b1_cap < self.steps:
            return self.b1_cap
        return self.steps

    @property
    def capped(self) -> bool:
        return 1 in self.batch_sizes and 0 < self.b1_cap < self.steps


# --------------------------------------------------------------------------------------------------
# Learners behind one small interface, so that every environment runs the same loop for all of them


class Learner(Protocol):
    def decide(self, Z: np.ndarray, n_arms: int) -> tuple[np.ndarray, np.ndarray]:
        """Choose one of arms ``0 .. n_arms - 1`` for every row of Z with the model frozen;
        return (arms, the probability each was drawn with)."""

    def learn(
        self, Z: np.ndarray, n_arms: np.ndarray, arms: np.ndarray, rewards: np.ndarray, probabilities: np.ndarray
    ) -> None:
        """Learn from a batch of rows: context, arms available, arm played, reward, its probability."""


def _with_intercept(Z: np.ndarray) -> np.ndarray:
    return np.hstack([np.ones((Z.shape[0], 1)), Z])


class _ArmIds:
    """String arm ids and SDK action lists, built once per arm count (the policies cache the
    candidate slots of the last id tuple, so the same tuple object comes back every step)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._ids: dict[int, tuple[str, ...]] = {}
        self._actions: dict[int, list[dict[str, str]]] = {}

    def ids(self, n: int) -> tuple[str, ...]:
        if n not in self._ids:
            self.names.extend(str(k) for k in range(len(self.names), n))
            self._ids[n] = tuple(self.names[:n])
            self._actions[n] = [{"id": arm} for arm in self._ids[n]]
        return self._ids[n]

    def actions(self, n: int) -> list[dict[str, str]]:
        self.ids(n)
        return self._actions[n]


class DomainLearner:
    """Ours as a user gets it: ``DomainSettings()``'s policy and feature encoder (see the module
    docstring); the SDK's decide path, the join's encode-then-observe and one ``update_batch``.
    ``params`` override the policy's defaults (a ``--variant``)."""

    def __init__(self, stream: Stream, seed: int, params: dict[str, Any] | None = None, policy: str | None = None) -> None:
        settings = DomainSettings() if policy is None else DomainSettings(policy=policy, params=params or {})
        self.policy = settings.make_policy(seed=seed, **(params or {} if policy is None else {}))
        self.encoder = settings.encoder()
        self.names = [f"x{j}" for j in range(stream.dim)]
        self.arms = _ArmIds()
        self.step = 0  # event time: one step a second (``half_life_s`` counts in steps here)

    def _context(self, z: list[float]) -> dict[str, dict[str, float]]:
        return {"numeric": dict(zip(self.names, z))}

    def choice(self, z: list[float], n_arms: int) -> Choice:
        """The SDK's decision among arms ``0 .. n_arms - 1`` for the context ``z``."""
        actions = self.encoder.action_matrix(self._context(z), self.arms.actions(n_arms))
        return self.policy.probabilities(actions, self.arms.ids(n_arms))

    def decide(self, Z: np.ndarray, n_arms: int) -> tuple[np.ndarray, np.ndarray]:
        self.policy.age()  # what a snapshot does (scoring_view) when the policy forgets by time
        arms = np.empty(len(Z), dtype=np.intp)
        probabilities = np.empty(len(Z))
        for i, z in enumerate(Z.tolist()):
            choice = self.choice(z, n_arms)
            arms[i], probabilities[i] = choice.chosen, choice.probability
        return arms, probabilities

    def learn(
        self, Z: np.ndarray, n_arms: np.ndarray, arms: np.ndarray, rewards: np.ndarray, probabilities: np.ndarray
    ) -> None:
        rows = np.empty((len(Z), self.policy.dim))
        for i, z in enumerate(Z.tolist()):
            context = self._context(z)
            rows[i] = self.encoder.context_vector(context)
            self.encoder.observe(context)  # after encoding, so a value never normalises itself
        names = [self.arms.names[a] for a in arms.tolist()]
        if isinstance(self.policy, Portfolio):  # every member scores the rows before it learns them
            self.policy.judge(rows, [self.arms.ids(k) for k in n_arms.tolist()], arms.tolist(), probabilities, rewards)
        times = 1000 * np.arange(self.step, self.step + len(Z), dtype=np.int64)
        self.step += len(Z)
        self.policy.update_batch(rows, names, rewards, times=times)


class PolicyLearner:
    """One of our policies with default parameters on the dense row (1, z)."""

    def __init__(self, policy: str, stream: Stream, seed: int) -> None:
        self.policy = make_policy(policy, dim=stream.dim + 1, seed=seed)
        self.arms = _ArmIds()

    def decide(self, Z: np.ndarray, n_arms: int) -> tuple[np.ndarray, np.ndarray]:
        ids = self.arms.ids(n_arms)
        arms = np.empty(len(Z), dtype=np.intp)
        probabilities = np.empty(len(Z))
        for i, x in enumerate(_with_intercept(Z)):
            # per-arm models: every candidate's row is the context (a copy is cheaper than a view here)
            choice = self.policy.probabilities(x[None, :].repeat(n_arms, axis=0), ids)
            arms[i], probabilities[i] = choice.chosen, choice.probability
        return arms, probabilities

    def learn(
        self, Z: np.ndarray, n_arms: np.ndarray, arms: np.ndarray, rewards: np.ndarray, probabilities: np.ndarray
    ) -> None:
        self.policy.update_batch(_with_intercept(Z), [self.arms.names[a] for a in arms.tolist()], rewards)


class MabwiserLearner:
    """MABWiser LinUCB / LinTS with default parameters: one ridge regression per arm."""

    def __init__(self, policy: str, stream: Stream, seed: int) -> None:
        from mabwiser.mab import MAB, LearningPolicy

        self.mab = MAB(arms=list(range(stream.n_arms[0])), learning_policy=getattr(LearningPolicy, policy)(), seed=seed)
        # An empty fit sets every arm to its ridge prior, so the first batch decides like later ones.
        self.mab.fit(np.zeros(0, dtype=int), np.zeros(0), np.zeros((0, stream.dim + 1)))

    def decide(self, Z: np.ndarray, n_arms: int) -> tuple[np.ndarray, np.ndarray]:
        for arm in range(len(self.mab.arms), n_arms):
            self.mab.add_arm(arm)
        chosen = np.atleast_1d(np.asarray(self.mab.predict(_with_intercept(Z)), dtype=np.intp))
        return chosen, np.ones(len(chosen))  # it reports no probability, and learns without one

    def learn(
        self, Z: np.ndarray, n_arms: np.ndarray, arms: np.ndarray, rewards: np.ndarray, probabilities: np.ndarray
    ) -> None:
        self.mab.partial_fit(arms, rewards, _with_intercept(Z))


class VowpalWabbitLearner:
    """VW ``--cb_explore_adf -q sa`` with one explorer; text examples as in ``benchmarks/learner.py``."""

    def __init__(self, explorer: str, stream: Stream, seed: int) -> None:
        import vowpalwabbit

        self.ws = vowpalwabbit.Workspace(f"--cb_explore_adf -q sa --quiet --random_seed {seed} {explorer}")
        self._shared = "shared |s " + " ".join(f"{j}:%.9g" for j in range(stream.dim))
        self._actions = [f"|a a{k}" for k in range(stream.max_arms)]
        self._rng = np.random.default_rng(seed)

    def decide(self, Z: np.ndarray, n_arms: int) -> tuple[np.ndarray, np.ndarray]:
        actions = self._actions[:n_arms]
        arms = np.empty(len(Z), dtype=np.intp)
        probabilities = np.empty(len(Z))
        for i, (z, u) in enumerate(zip(Z.tolist(), self._rng.random(len(Z)).tolist())):
            pmf = self.ws.predict([self._shared % tuple(z), *actions])
            arm = min(bisect.bisect_right(list(itertools.accumulate(pmf)), u), n_arms - 1)
            arms[i], probabilities[i] = arm, pmf[arm]
        return arms, probabilities

    def learn(
        self, Z: np.ndarray, n_arms: np.ndarray, arms: np.ndarray, rewards: np.ndarray, probabilities: np.ndarray
    ) -> None:
        rows = zip(Z.tolist(), n_arms.tolist(), arms.tolist(), rewards.tolist(), probabilities.tolist())
        for z, n, arm, reward, p in rows:
            example = [self._shared % tuple(z), *self._actions[:n]]
            example[1 + arm] = f"{arm}:{-reward:.9g}:{p:.9g} {self._actions[arm]}"
            self.ws.learn(example)


class ContextualBanditsLearner:
    """contextualbandits LinUCB / LinTS (``contextualbandits.online``) with default parameters."""

    def __init__(self, policy: str, stream: Stream, seed: int) -> None:
        from contextualbandits import online

        # its random_state must be > 0
        self.model = getattr(online, policy)(nchoices=int(stream.n_arms[0]), random_state=seed + 1)

    def decide(self, Z: np.ndarray, n_arms: int) -> tuple[np.ndarray, np.ndarray]:
        while self.model.nchoices < n_arms:
            self.model.add_arm()
        chosen = np.atleast_1d(np.asarray(self.model.predict(Z), dtype=np.intp))
        return chosen, np.ones(len(chosen))  # as MABWiser: no probability reported, none needed

    def learn(
        self, Z: np.ndarray, n_arms: np.ndarray, arms: np.ndarray, rewards: np.ndarray, probabilities: np.ndarray
    ) -> None:
        self.model.partial_fit(Z, arms, rewards)


@dataclass(frozen=True)
class LearnerSpec:
    """One column of the tables: a name, its family, how to build it for a stream and seed, and
    whether it refits every arm per ``partial_fit`` (capped at B = 1)."""

    name: str
    family: str  # "ours" | "mabwiser" | "vw" | "contextualbandits"
    build: Callable[[Stream, int], Learner]
    slow_per_row: bool = False

    @property
    def is_peer(self) -> bool:
        return self.family != "ours"


def _variant_learner(params: dict[str, Any]) -> Callable[[Stream, int], Learner]:
    """A variant's learner: the default domain with these parameters, or another ``policy``."""
    rest = {k: v for k, v in params.items() if k != "policy"}
    return functools.partial(DomainLearner, params=rest, policy=params.get("policy"))


def _variant_settings(params: dict[str, Any]) -> DomainSettings:
    rest = {k: v for k, v in params.items() if k != "policy"}
    return DomainSettings(params=rest) if "policy" not in params else DomainSettings(policy=params["policy"], params=rest)


def _alone(member: dict[str, Any]) -> dict[str, Any]:
    """A member run alone, as a variant's params. A Fourier member exists only in a portfolio:
    it runs as the acting member of one that never switches (the other member learns beside it
    and is never asked). A member that takes another's alarms (``alarms_from``) runs its own
    change detector instead: alone, nobody else raises them."""
    member = {k: v for k, v in member.items() if k != "label"}
    if "alarms_from" in member:
        member = {**{k: v for k, v in member.items() if k != "alarms_from"}, "detect": True}
    if "fourier" not in member:
        return member
    return {"policy": "portfolio", "members": [member, {"policy": "lin_igw"}], "min_rows": 2**62}


def member_columns(members: Sequence[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(column ``m<i>``, label, the member as a variant's params) of each portfolio member."""
    labels = Portfolio(1, members=members).labels if members else []
    return [(f"m{i}", label, _alone(m)) for i, (label, m) in enumerate(zip(labels, members))]


def learner_specs(
    peers: Sequence[str], variants: Sequence[tuple[str, dict[str, Any]]] = (), members: Sequence[dict[str, Any]] = ()
) -> tuple[list[LearnerSpec], list[str]]:
    """The columns to run, ours first, and a note for every requested peer that cannot run."""
    specs = [
        LearnerSpec("ours", "ours", DomainLearner),
        *(LearnerSpec(name, "ours", _variant_learner(params)) for name, params in variants),
        *(LearnerSpec(column, "ours", _variant_learner(params)) for column, _, params in member_columns(members)),
        LearnerSpec("our LinUCB", "ours", functools.partial(PolicyLearner, "lin_ucb")),
        LearnerSpec("our LinTS", "ours", functools.partial(PolicyLearner, "lin_ts")),
        LearnerSpec("our IGW", "ours", functools.partial(PolicyLearner, "lin_igw")),
    ]
    notes = []
    if "mabwiser" in peers:
        specs += [
            LearnerSpec(f"MABWiser {p}", "mabwiser", functools.partial(MabwiserLearner, p), slow_per_row=True)
            for p in ("LinUCB", "LinTS")
        ]
    if "vw" in peers:
        explorers = {"SquareCB": "--squarecb", "RegCB": "--regcb", "bag 5": "--bag 5", "eps 0.05": "--epsilon 0.05"}
        specs += [
            LearnerSpec(f"VW {name}", "vw", functools.partial(VowpalWabbitLearner, args)) for name, args in explorers.items()
        ]
    if "contextualbandits" in peers:
        try:
            import contextualbandits.online  # noqa: F401
        except ImportError as exc:
            notes.append(f"contextualbandits skipped: `import contextualbandits` failed ({exc}); see the module docstring")
        else:
            specs += [
                LearnerSpec(f"cb {p}", "contextualbandits", functools.partial(ContextualBanditsLearner, p), slow_per_row=True)
                for p in ("LinUCB", "LinTS")
            ]
    return specs, notes


# --------------------------------------------------------------------------------------------------
# The loop


def run(learner: Learner, stream: Stream, best: np.ndarray, batch: int, steps: int) -> np.ndarray:
    """Per-step regret of ``learner`` over the first ``steps`` steps of ``stream``: decide
    ``batch`` steps frozen (piece by piece where the arm set changes), then learn from them."""
    regret = np.empty(steps)
    for lo in range(0, steps, batch):
        hi = min(lo + batch, steps)
        arms = np.empty(hi - lo, dtype=np.intp)
        probabilities = np.empty(hi - lo)
        for start, end, n_arms in stream.segments(lo, hi):
            arms[start - lo : end - lo], probabilities[start - lo : end - lo] = learner.decide(
                stream.contexts[start:end], n_arms
            )
        idx = np.arange(lo, hi)
        rewards = stream.rewards[idx, arms]
        learner.learn(stream.contexts[lo:hi], stream.n_arms[lo:hi], arms, rewards, probabilities)
        regret[lo:hi] = best[lo:hi] - stream.means[idx, arms]
    return regret


def floor_bound(stream: Stream, batch: int, eps0: float) -> float:
    """The least regret a learner with the floor ``eps0`` can expect on ``stream``, whatever it
    learns: its first batch is decided before any feedback (uniformly: every arm starts at the
    same prior), and every decision after mixes in ``eps0`` of a uniform choice."""
    gap = stream.best() - stream.uniform()
    return float(gap[:batch].sum() + eps0 * gap[batch:].sum())


#: One cell's per-step regret, its wall time, and for a portfolio who acts at the end and how
#: many switches it made.
CellResult = tuple[np.ndarray, float, "tuple[str, int] | None"]


@functools.lru_cache(maxsize=2)
def _stream(env: str, steps: int, seed: int) -> Stream:
    return generate(env, steps, seed)


def _run_cell(cfg: SuiteConfig, specs: Sequence[LearnerSpec], cell: tuple[str, int, int, int]) -> CellResult:
    """One learner on one (environment, seed, batch size)."""
    env, seed, batch, i = cell
    spec = specs[i]
    stream = _stream(env, cfg.steps, seed)
    t0 = time.perf_counter()
    learner = spec.build(stream, seed)
    regret = run(learner, stream, stream.best(), batch, cfg.horizon(spec, batch))
    seconds = time.perf_counter() - t0
    policy = getattr(learner, "policy", None)
    acting = (policy.acting_label, len(policy.switches)) if isinstance(policy, Portfolio) else None
    return regret, seconds, acting


#: (configuration, learner specs) of the run a forked worker belongs to (``Suite.run``).
_WORKER: tuple[SuiteConfig, list[LearnerSpec]] | None = None


def _init_worker() -> None:
    threadpool_limits(limits=1, user_api="blas")  # as in the parent: small products, shared cores


def _worker_cell(cell: tuple[str, int, int, int]) -> tuple[tuple[str, int, int, int], CellResult]:
    assert _WORKER is not None
    return cell, _run_cell(*_WORKER, cell)


@dataclass
class Outcome:
    """One learner's run on one (environment, seed, batch size)."""

    total: float
    at_cap: float  # regret over the first b1_cap steps (B = 1 only)
    late: float  # regret over the last quarter of the steps run
    steps: int
    seconds: float


class Suite:
    """Runs every (environment, seed, batch size, learner) and keeps what the report needs."""

    def __init__(self, cfg: SuiteConfig, specs: list[LearnerSpec], progress: Progress) -> None:
        self.cfg = cfg
        self.specs = specs
        self.progress = progress
        self.outcomes: dict[tuple[str, int, str], list[Outcome]] = defaultdict(list)
        self.uniform: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (total, at cap)
        #: (env, batch) -> per seed, the least regret ours can expect with its floor (floor_bound)
        self.floor_bounds: dict[tuple[str, int], list[float]] = defaultdict(list)
        #: the default's exploration floor: every decision mixes in eps0 / K
        self.eps0 = float(DomainSettings().make_policy(seed=0).eps0)
        self.curves: dict[str, dict[str, np.ndarray]] = defaultdict(dict)  # summed over seeds
        #: (env, batch) -> per seed, the portfolio's acting member at the end and its switches
        self.acting: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
        self.shapes: dict[str, str] = {}
        self.plot_batch = PLOT_BATCH if PLOT_BATCH in cfg.batch_sizes else cfg.batch_sizes[0]
        #: the column whose switches are kept: the default domain is itself the default portfolio
        self.portfolio_column = "ours portfolio" if any(name == "ours portfolio" for name, _ in cfg.variants) else "ours"

    def run(self, jobs: int = 1) -> None:
        """Every cell, in ``jobs`` processes (1: this one). Cells are independent and seeded, and
        their outcomes are recorded in the same order whatever the number of processes, so the
        figures, curves and JSON are the same bit for bit; only the wall times differ."""
        cfg = self.cfg
        cells = [
            (env, seed, batch, i)
            for env in cfg.envs for seed in cfg.seeds for batch in cfg.batch_sizes for i in range(len(self.specs))
        ]  # fmt: skip
        task = self.progress.add_task("regret", total=len(cells))
        for env in cfg.envs:
            for seed in cfg.seeds:
                stream = _stream(env, cfg.steps, seed)
                self.shapes[env] = stream.shape
                gap = stream.best() - stream.uniform()
                self.uniform[env].append((float(gap.sum()), float(gap[: cfg.b1_cap].sum())))
                for batch in cfg.batch_sizes:
                    self.floor_bounds[env, batch].append(floor_bound(stream, batch, self.eps0))
                self._add_curve(env, "uniform", gap)
        if jobs == 1:
            for cell in cells:
                env, seed, batch, i = cell
                self.progress.update(task, description=f"{env} seed {seed} B={batch} {self.specs[i].name}")
                self._record(cell, _run_cell(cfg, self.specs, cell))
                self.progress.advance(task)
            return
        done: dict[tuple[str, int, int, int], CellResult] = {}
        # Forked workers inherit the configuration and the learners' builders, and regenerate the
        # seeded streams; they take the longest cells first (B = 1: the batch sizes sort first).
        global _WORKER
        _WORKER = (cfg, self.specs)
        # A worker that dies (killed, out of memory) breaks the pool, which raises here rather
        # than waiting for its cell forever.
        order = sorted(cells, key=lambda cell: (cell[2], cell[3]))
        context = multiprocessing.get_context("fork")
        pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker)
        try:
            for future in concurrent.futures.as_completed([pool.submit(_worker_cell, cell) for cell in order]):
                cell, result = future.result()
                done[cell] = result
                env, seed, batch, i = cell
                self.progress.update(task, description=f"{env} seed {seed} B={batch} {self.specs[i].name}")
                self.progress.advance(task)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            _WORKER = None
        for cell in cells:
            self._record(cell, done[cell])

    def _record(self, cell: tuple[str, int, int, int], result: CellResult) -> None:
        env, seed, batch, i = cell
        spec = self.specs[i]
        regret, seconds, acting = result
        if acting is not None and spec.name == self.portfolio_column:
            self.acting[env, batch].append(acting)
        steps = len(regret)
        late = float(regret[steps - steps // 4 :].sum())
        self.outcomes[env, batch, spec.name].append(
            Outcome(float(regret.sum()), float(regret[: self.cfg.b1_cap].sum()), late, steps, seconds)
        )
        if batch == self.plot_batch:
            self._add_curve(env, spec.name, regret)

    def _add_curve(self, env: str, name: str, regret: np.ndarray) -> None:
        curve = np.cumsum(regret)
        previous = self.curves[env].get(name)
        self.curves[env][name] = curve if previous is None else previous + curve

    # figures ---------------------------------------------------------------------------------------

    def mean(self, env: str, batch: int, name: str, at_cap: bool = False) -> float:
        return float(np.mean([o.at_cap if at_cap else o.total for o in self.outcomes[env, batch, name]]))

    def full_length(self, env: str, batch: int, name: str) -> bool:
        return self.outcomes[env, batch, name][0].steps == self.cfg.steps

    def headline(self, env: str, batch: int, at_cap: bool = False) -> dict[str, Any]:
        """ours, the best peer (over T: among peers that ran all T; ``at_cap``: every peer over the
        first b1_cap steps) and their ratio."""
        peers = [s.name for s in self.specs if s.is_peer and (at_cap or self.full_length(env, batch, s.name))]
        ours = self.mean(env, batch, "ours", at_cap)
        figures: dict[str, Any] = {"ours": ours}
        if peers:
            best = min(peers, key=lambda name: self.mean(env, batch, name, at_cap))
            best_regret = self.mean(env, batch, best, at_cap)
            figures |= {"best_peer": best_regret, "best_peer_name": best, "ratio": ours / best_regret}

            def regret(name: str, i: int) -> float:
                outcome = self.outcomes[env, batch, name][i]
                return outcome.at_cap if at_cap else outcome.total

            # each seed against the best peer on that seed (the least regret of any peer there)
            figures["ratio_by_seed"] = [
                regret("ours", i) / max(min(regret(name, i) for name in peers), 1e-9) for i in range(len(self.cfg.seeds))
            ]
        if not at_cap:
            bound = float(np.mean(self.floor_bounds[env, batch]))
            figures["floor_bound"] = bound
            if peers:
                figures["floor_bound_ratio"] = bound / figures["best_peer"]
        if self.cfg.variants:
            figures["variants"] = {
                name: {"ours": regret, **({"ratio": regret / figures["best_peer"]} if peers else {})}
                for name in (name for name, _ in self.cfg.variants)
                for regret in [self.mean(env, batch, name, at_cap)]
            }
        if self.acting.get((env, batch)) and not at_cap:
            figures["portfolio"] = self.portfolio_figures(env, batch)
        return figures

    def portfolio_figures(self, env: str, batch: int) -> dict[str, Any]:
        """Who the portfolio ended with per seed, its switches, each member's regret alone, and
        per seed: ``picked_over_best``, the regret alone of the member it ended with over the best
        member's (1.0: it picked the best); ``picked_over_best_late``, the same over the last
        quarter of the steps (which member did best by the end); ``over_best_member``, the
        portfolio's own regret over the best member's alone (below 1: choosing online cost less
        than knowing the best member beforehand). ``picked_vs_best`` (and ``_late``) answers
        whether it picked the member the suite shows best, within its interval: the best member
        (least mean regret alone over the seeds), the mean over seeds of the ended-with member's
        regret alone less the best's on the same seed, that difference's 95 % t interval (paired
        by seed; None with one seed), and ``within``: the interval reaches zero or below, so the
        member picked is not shown worse than the best."""
        columns = member_columns(self.cfg.members)
        runs = {label: self.outcomes[env, batch, column] for column, label, _ in columns}
        ours = self.outcomes[env, batch, self.portfolio_column]

        def best_alone(i: int, late: bool = False) -> float:
            return max(min(o[i].late if late else o[i].total for o in runs.values()), 1e-9)

        def over_best(label: str, i: int, late: bool = False) -> float:
            outcome = runs[label][i]
            return (outcome.late if late else outcome.total) / best_alone(i, late)

        ended = [(i, label) for i, (label, _) in enumerate(self.acting[env, batch]) if label in runs]

        def picked_vs_best(late: bool = False) -> dict[str, Any] | None:
            if not runs or not ended:
                return None
            regret = {label: [o.late if late else o.total for o in outcomes] for label, outcomes in runs.items()}
            best = min(regret, key=lambda label: float(np.mean(regret[label])))
            diffs = np.array([regret[label][i] - regret[best][i] for i, label in ended])
            mean = float(diffs.mean())
            if len(diffs) < 2:
                return {"best": best, "picked_minus_best": mean, "interval": None, "within": None}
            from scipy.stats import t as student_t

            half = float(student_t.ppf(0.975, len(diffs) - 1) * diffs.std(ddof=1) / np.sqrt(len(diffs)))
            interval = [mean - half, mean + half]
            return {"best": best, "picked_minus_best": mean, "interval": interval, "within": interval[0] <= 0.0}

        return {
            "acting": [label for label, _ in self.acting[env, batch]],
            "switches": [n for _, n in self.acting[env, batch]],
            "members": {label: float(np.mean([o.total for o in outcomes])) for label, outcomes in runs.items()},
            "best_member": min(runs, key=lambda label: np.mean([o.total for o in runs[label]])) if runs else None,
            "picked_over_best": [over_best(label, i) for i, label in ended],
            "picked_over_best_late": [over_best(label, i, late=True) for i, label in ended],
            "over_best_member": [o.total / best_alone(i) for i, o in enumerate(ours)] if runs else [],
            "picked_vs_best": picked_vs_best(),
            "picked_vs_best_late": picked_vs_best(late=True),
        }

    def results(self) -> dict[str, Any]:
        envs: dict[str, Any] = {}
        for env in self.cfg.envs:
            envs[env] = {}
            for batch in self.cfg.batch_sizes:
                figures = self.headline(env, batch)
                if batch == 1 and self.cfg.capped:
                    figures["at_cap"] = {"steps": self.cfg.b1_cap, **self.headline(env, batch, at_cap=True)}
                envs[env][f"B{batch}"] = figures
        seconds = {
            f"B{batch}": {s.name: sum(o.seconds for env in self.cfg.envs for o in self.outcomes[env, batch, s.name])
                          for s in self.specs}
            for batch in self.cfg.batch_sizes
        }  # fmt: skip
        return {
            "envs": envs,
            "T": self.cfg.steps,
            "seeds": list(self.cfg.seeds),
            "held_out": [env for env in self.cfg.envs if env in HELD_OUT],
            "batch_sizes": list(self.cfg.batch_sizes),
            "b1_cap": {"steps": self.cfg.b1_cap, "learners": [s.name for s in self.specs if s.slow_per_row]}
            if self.cfg.capped
            else None,
            "seconds": seconds,
        }

    # report ----------------------------------------------------------------------------------------

    def table(self, batch: int, at_cap: bool = False) -> Table:
        cfg = self.cfg
        steps = cfg.b1_cap if at_cap else cfg.steps
        title = (
            f"Cumulative regret, B={batch}, first {steps:,} steps (every learner)"
            if at_cap
            else f"Cumulative regret, B={batch}, T={steps:,}"
        )
        table = Table(title=f"{title}, mean of {len(cfg.seeds)} seed(s); lower is better", title_justify="left")
        table.add_column("env")
        table.add_column("K, d")
        for column in ("uniform", *(s.name for s in self.specs), "best peer", "ratio", *(() if at_cap else ("floor bound",))):
            table.add_column(column, justify="right")
        for env in cfg.envs:
            figures = self.headline(env, batch, at_cap)
            cells = []
            regrets = {s.name: self.mean(env, batch, s.name, at_cap) for s in self.specs}
            lowest = min(regrets.values())
            for spec in self.specs:
                text = f"{regrets[spec.name]:,.0f}"
                if not at_cap and not self.full_length(env, batch, spec.name):
                    text += "*"
                cells.append(f"[bold]{text}[/]" if regrets[spec.name] == lowest else text)
            uniform = float(np.mean([u[1] if at_cap else u[0] for u in self.uniform[env]]))
            label = f"{env} (held-out)" if env in HELD_OUT else env
            if "ratio" in figures:
                colour = "green" if figures["ratio"] <= 1.0 else "red"
                tail = [figures["best_peer_name"], f"[{colour}]{figures['ratio']:.2f}[/]"]
            else:
                tail = ["", ""]
            if not at_cap:
                bound = f"{figures['floor_bound']:,.0f}"
                tail.append(f"{bound} ({figures['floor_bound_ratio']:.2f})" if "floor_bound_ratio" in figures else bound)
            table.add_row(label, self.shapes[env], f"{uniform:,.0f}", *cells, *tail)
        captions = []
        if not at_cap:
            captions.append(
                f"floor bound: the least regret ours can expect with its floor (its first batch is uniform, and every "
                f"decision after mixes in eps0 = {self.eps0:g} of uniform), and over the best peer's"
            )
        if not at_cap and batch == 1 and cfg.capped:
            captions.append(
                f"*: the first {cfg.b1_cap:,} steps only (per-row refits are slow), so not a candidate for best "
                "peer over T; the next table compares every learner over those steps"
            )
        table.caption = "\n".join(captions) or None
        return table

    def portfolio_table(self) -> Table | None:
        """Per environment and batch size: the best member alone, whom the portfolio ended with,
        and whether that is the best within its interval (``picked_vs_best``), over T and over
        the last quarter."""
        if not self.cfg.members:
            return None
        table = Table(title="Portfolio: the member it ends with against the best member alone (paired over seeds, 95 %)",
                      title_justify="left")  # fmt: skip
        for column in ("environment", "B", "best member (T)", "ended with, per seed", "picked - best (T)", "within",
                       "best member (last quarter)", "picked - best (last quarter)", "within"):  # fmt: skip
            table.add_column(column, justify="right" if column.startswith("picked") else "left")
        columns = {label: column for column, label, _ in member_columns(self.cfg.members)}

        def cells(verdict: dict[str, Any] | None) -> list[str]:
            if verdict is None:
                return ["-", "-", "-"]
            lo_hi = verdict["interval"]
            spread = "" if lo_hi is None else f" [{lo_hi[0]:,.0f}, {lo_hi[1]:,.0f}]"
            within = "-" if verdict["within"] is None else ("yes" if verdict["within"] else "NO")
            return [columns.get(verdict["best"], verdict["best"]), f"{verdict['picked_minus_best']:,.0f}{spread}", within]

        for env in self.cfg.envs:
            for batch in self.cfg.batch_sizes:
                if not self.acting.get((env, batch)):
                    continue
                figures = self.portfolio_figures(env, batch)
                total, late = cells(figures["picked_vs_best"]), cells(figures["picked_vs_best_late"])
                ended = ", ".join(columns.get(label, label) for label in figures["acting"])
                table.add_row(env, str(batch), total[0], ended, *total[1:], *late)
        return table

    def timing_table(self) -> Table:
        table = Table(title="Wall time per learner, all environments and seeds", title_justify="left")
        table.add_column("learner")
        for batch in self.cfg.batch_sizes:
            table.add_column(f"B={batch} s", justify="right")
            table.add_column(f"B={batch} us/step", justify="right")
        for spec in self.specs:
            cells = []
            for batch in self.cfg.batch_sizes:
                runs = [o for env in self.cfg.envs for o in self.outcomes[env, batch, spec.name]]
                seconds = sum(o.seconds for o in runs)
                cells += [f"{seconds:,.1f}", f"{1e6 * seconds / sum(o.steps for o in runs):,.0f}"]
            table.add_row(spec.name, *cells)
        return table

    def plot(self, path: Path) -> None:
        import matplotlib.pyplot as plt

        path.parent.mkdir(parents=True, exist_ok=True)
        envs = list(self.cfg.envs)
        columns = min(4, len(envs) + 1)
        rows = -(-(len(envs) + 1) // columns)  # one panel more, for the legend
        fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
        n_seeds = len(self.cfg.seeds)
        dashes = {"ours": "-", "mabwiser": "--", "vw": ":", "contextualbandits": "-."}
        colours = plt.get_cmap("tab10").colors
        names = {"ours": "ours (the default portfolio)"}
        names |= {column: f"{column}: {label} alone" for column, label, _ in member_columns(self.cfg.members)}
        for ax, env in zip(axes.flat, envs):
            for i, spec in enumerate(self.specs):
                curve = self.curves[env][spec.name] / n_seeds
                style = {"linewidth": 2.4, "color": "black"} if spec.name == "ours" else {"color": colours[i % 10]}
                label = names.get(spec.name, spec.name)
                ax.plot(np.arange(1, len(curve) + 1), curve, dashes[spec.family], label=label, **style)
            uniform = self.curves[env]["uniform"] / n_seeds
            ax.plot(np.arange(1, len(uniform) + 1), uniform, color="grey", linewidth=0.8, label="uniform random")
            ax.set_title(f"{env} ({self.shapes[env]})" + (", held-out" if env in HELD_OUT else ""), fontsize=9)
            ax.tick_params(labelsize=7)
            ax.grid(True, alpha=0.3)
        for ax in axes.flat[len(envs) :]:
            ax.axis("off")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        axes.flat[len(envs)].legend(handles, labels, loc="center", fontsize=8, frameon=False)
        fig.suptitle(
            f"Cumulative regret (mean of {n_seeds} seed(s)), B={self.plot_batch}, T={self.cfg.steps:,}; x: step",
            fontsize=10,
        )
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


# --------------------------------------------------------------------------------------------------
# CLI


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME:key=value,...`` (values are JSON, e.g. ``detect=true``) -> (NAME, params)."""
    name, _, pairs = text.partition(":")
    params = {}
    for pair in _names(pairs):
        key, eq, value = pair.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"{pair!r} is not key=value")
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            raise argparse.ArgumentTypeError(f"{value!r} (of {key.strip()}) is not a JSON value") from None
    if not name.strip():
        raise argparse.ArgumentTypeError(f"variant {text!r} has no name before ':'")
    return name.strip(), params


def parse_args(argv: Sequence[str] | None = None) -> tuple[SuiteConfig, list[str]]:
    """The configuration and a note for every requested environment that cannot run here."""
    runnable, unavailable = available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="T=2,000 and seed 0 (unless --steps / --seeds say otherwise)")
    parser.add_argument("--steps", type=int, help="steps per run (default 20,000; --quick 2,000)")
    parser.add_argument("--seeds", type=_ints, help="comma-separated seeds (default 0,1,2; --quick 0)")
    parser.add_argument("--batch-sizes", type=_ints, default=SuiteConfig.batch_sizes, help="default 200,1")
    parser.add_argument("--envs", type=_names, help=f"comma-separated; default all: {','.join([*runnable, *unavailable])}")
    parser.add_argument("--peers", type=_names, default=PEER_FAMILIES, help=f"default {','.join(PEER_FAMILIES)}")
    parser.add_argument(
        "--variant", type=_variant, action="append", default=[], metavar="NAME:KEY=VALUE,...",
        help="another column of ours with these policy parameters (JSON values), e.g. 'ours+detect:detect=true'; repeatable",
    )
    parser.add_argument(
        "--portfolio", nargs="?", const=json.dumps(PORTFOLIO), metavar="JSON",
        help="another column, 'ours portfolio': a portfolio domain of these members (a JSON list; default the README's)",
    )
    parser.add_argument("--out", type=Path, default=SuiteConfig.out, help="folder for regret-curves.png")
    parser.add_argument(
        "--b1-cap", type=int, default=SuiteConfig.b1_cap, help="steps MABWiser/contextualbandits run at B=1 (0: all)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1,
        help="processes to run the cells in (0: one per CPU); the figures are the same, the wall time shorter",
    )
    args = parser.parse_args(argv)
    known = [*runnable, *unavailable]
    envs = args.envs or tuple(known)
    for name in envs:
        if name not in known:
            parser.error(f"unknown environment {name!r}; known: {', '.join(known)}")
    for name in args.peers:
        if name not in PEER_FAMILIES:
            parser.error(f"unknown peer {name!r}; known: {', '.join(PEER_FAMILIES)}")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        parser.error("--batch-sizes needs positive integers")
    if args.jobs < 0:
        parser.error(f"--jobs needs 0 (one per CPU) or a positive number of processes, got {args.jobs}")
    if args.jobs != 1 and "fork" not in multiprocessing.get_all_start_methods():
        parser.error("--jobs other than 1 needs processes started by fork (Linux), which this platform lacks")
    members = json.loads(args.portfolio) if args.portfolio else []
    steps = args.steps or (2_000 if args.quick else SuiteConfig.steps)
    seeds = args.seeds or ((0,) if args.quick else SuiteConfig.seeds)
    notes = [f"{name} skipped: {unavailable[name]}" for name in envs if name in unavailable]
    cfg = SuiteConfig(
        steps=steps,
        seeds=seeds,
        batch_sizes=args.batch_sizes,
        envs=tuple(name for name in envs if name not in unavailable),
        peers=args.peers,
        variants=tuple(args.variant) + ((("ours portfolio", {"policy": "portfolio", "members": members}),) if members and members != PORTFOLIO else ()),
        members=tuple(members),
        out=args.out,
        b1_cap=args.b1_cap,
        jobs=args.jobs or os.cpu_count() or 1,
    )
    return cfg, notes


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, float):
        return round(value, 1) if abs(value) >= 100 else round(value, 3)
    return value


def main(argv: Sequence[str] | None = None) -> int:
    cfg, notes = parse_args(argv)
    for name, params in cfg.variants:
        try:
            _variant_settings(params)
        except ValueError as exc:
            print(f"variant {name!r}: {exc}", file=sys.stderr)
            return 2
    specs, peer_notes = learner_specs(cfg.peers, cfg.variants, cfg.members)
    notes += peer_notes
    out = Console(width=220)
    err = Console(stderr=True)
    for note in notes:
        err.print(f"[yellow]note:[/] {note}")
    t0 = time.perf_counter()
    load_start = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    with threadpool_limits(limits=1, user_api="blas"), Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=err,
    ) as progress:  # fmt: skip
        suite = Suite(cfg, specs, progress)
        suite.run(cfg.jobs)
    plot = cfg.out / "regret-curves.png"
    suite.plot(plot)
    for batch in cfg.batch_sizes:
        out.print(suite.table(batch))
        if batch == 1 and cfg.capped:
            out.print(suite.table(batch, at_cap=True))
    for column, label, _ in member_columns(cfg.members):
        out.print(f"{column}: portfolio member {label}, alone")
    if (portfolio := suite.portfolio_table()) is not None:
        out.print(portfolio)
    out.print(suite.timing_table())
    for note in notes:
        out.print(f"[yellow]note:[/] {note}")
    out.print(f"curves (B={suite.plot_batch}): {plot}")
    results = suite.results() | {
        "skipped": notes,
        "plot": str(plot),
        "seconds_total": time.perf_counter() - t0,
        "jobs": cfg.jobs,
        "load_avg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }
    sys.stdout.flush()
    print(json.dumps(_rounded(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

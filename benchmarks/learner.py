"""Learner benchmark: our policies and posterior store against MABWiser and Vowpal Wabbit.

Every peer runs in the same process, on the same seeded data, in the same run:

1. Update throughput: 20 arms, batches of 1,000 labelled rows at d=32 and d=128. Ours runs the
   worker's loop: ``update_batch`` (rank-k: A += X^T W X, b += X^T W r) per batch and, every
   5,000 rows, where the worker publishes, one ``Shard.apply`` through ``learner.store`` holding
   the state of every arm learned since the last and the consumed offset (one RocksDB write
   batch), then a flush: the learner's durability (no write-ahead log; before 2026-11-30 the
   worker wrote every block, flushing as often); the rate includes that write. BLAS is limited
   to one thread, as the learner worker limits it (``banditstream learn``), for ours and the
   peers alike. The default portfolio is measured again with the log on (``*_portfolio_wal``:
   ``learn.wal = true``), and LinUCB with BLAS's own threads (``*_blas_default``: a process that
   does not limit them), because small per-arm products can thrash a multi-threaded BLAS on a
   busy machine (at d=128 the portfolio learned 37,000-52,000 rows/s with them and
   50,000-54,000 with one, 2026-11-30). MABWiser gets
   the same batches through ``LinUCB.partial_fit``. VW gets the same rows through
   ``--cb_explore_adf -q sa`` on the Python API, one multi-line example per row (a shared line
   with the context, one line per arm, the logged arm's line labelled ``arm:cost:probability``
   with cost = -reward), the text built from the numpy rows with one %-template per row inside
   the timed loop and handed to ``Workspace.learn`` as a list of lines.
   That is the fastest path found that trains the same model: the example API
   (``Workspace.example`` from feature dicts) was about a third slower, and sending only the shared
   line and the logged arm's line is faster but trains a different model. Every throughput is
   the best of ``repeats`` runs (3): on a shared machine the best run is the least disturbed one.

2. Decide latency: 10 arms at d=64, each learner trained on the same 20,000 rows, then
   ``time.perf_counter_ns`` around each call, 20,000 calls after a warm-up, the learners taking
   turns in four rounds so that load from elsewhere falls on all of them. Ours: ``probabilities``
   (full distribution + the choice) on the scoring view the SDK decides from, default parameters.
   MABWiser: LinUCB ``predict`` on one context. VW: build the example text, ``predict`` the pmf,
   draw from it. p50 and p99 in us.

3. Shared-model updates: one model shared by every arm (``shared_lin_ucb``, ``shared_lin_ts``)
   at d=512 learning one row per ``update_batch`` (B=1), as a loop that learns every event and
   decides in between does. Each step is ``update_batch`` then ``posterior_mean`` of the shared
   model, so the rate includes keeping the posterior ready for the next decision (in place,
   O(d^2) per row, since issue #18; before, a refactorisation per row). 8,192 timed rows from
   the prior, so the one exact refactorisation due every ``EXACT_EVERY`` rows falls inside the
   timing. Best of ``repeats`` runs.

4. Regret: a seeded linear contextual environment (see ``LinearEnvironment``), 50,000 steps. Every
   learner follows the same protocol: it decides a mini-batch of 100 steps with its model frozen,
   then learns from those 100 (context, arm, reward, probability) rows. Ours and VW decide one
   context at a time, MABWiser predicts the 100 contexts in one vectorised call (its natural way;
   same frozen model, so the same decisions). Rewards use common random numbers: the noise an arm
   would get at a step is drawn once, so learners differ only by their choices. Regret is the sum
   over steps of max_k mu_k(x_t) - mu_{a_t}(x_t) (expected rewards, not the noisy ones). Each
   learner gets the same tuning effort, a six-point grid (``regret_grid``) printed with every
   point's regret; the best point of each is reported and plotted. Our best setting is then re-run
   with exploration floors (``FLOORS``) to show what the floor costs; that never enters the
   comparison.

The JSON records the 1-minute load average at the start and the end of the run, since timings on a
shared machine are only as good as the machine was quiet.

Run from the repository root::

    .venv/bin/python benchmarks/learner.py              # full run, a few minutes on 2 cores
    .venv/bin/python benchmarks/learner.py --quick      # smoke run, seconds
    .venv/bin/python benchmarks/learner.py --steps 20000 --seed 7 --plot /tmp/regret.png
    .venv/bin/python benchmarks/learner.py --profile    # where our update and decide time goes
    .venv/bin/python benchmarks/learner.py --only shared  # the shared models' B=1 updates alone

Progress goes to stderr; the results table goes to stdout, and the last line of stdout is one JSON
object with every figure (``update_per_s_d32``, ``decide_p99_us_lints_d64``,
``shared_updates_per_s_b1_d512``, ``regret_ours``, ...).
"""

from __future__ import annotations

import argparse
import bisect
import gc
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# Run as a script, this file's folder is sys.path[0], and this file (learner.py) would shadow the
# `learner` package it benchmarks; put the repository root there instead.
_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

TARGET_UPDATE_PER_S = {32: 200_000, 128: 50_000}
TARGET_DECIDE_P99_US = 100.0
TARGET_SHARED_UPDATES_PER_S = 10_000  # B=1, d=512 (issue #18)
#: Exploration floors re-run with our best grid setting, to show what the floor costs in regret.
FLOORS = (0.01, 0.05)


# --------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of every measurement; ``quick()`` shrinks them for a smoke run."""

    seed: int = 0
    steps: int = 50_000
    regret_arms: int = 10
    regret_dim: int = 12
    regret_noise: float = 0.5
    regret_batch: int = 100
    update_arms: int = 20
    update_batch_rows: int = 1_000
    update_batches: dict[int, int] = field(default_factory=lambda: {32: 200, 128: 60})
    mabwiser_update_batches: int = 100
    vw_update_rows: int = 20_000
    decide_arms: int = 10
    decide_dim: int = 64
    decide_train_rows: int = 20_000
    decide_calls: int = 20_000
    decide_warmup_calls: int = 1_000
    shared_dim: int = 512
    shared_rows: int = 8_192
    repeats: int = 3
    plot: Path = _HERE / "out" / "learner_regret.png"

    @classmethod
    def quick(cls, seed: int, steps: int | None, plot: Path) -> BenchConfig:
        return cls(
            seed=seed,
            steps=steps or 3_000,
            update_batches={32: 10, 128: 5},
            mabwiser_update_batches=5,
            vw_update_rows=1_000,
            decide_train_rows=2_000,
            decide_calls=1_000,
            decide_warmup_calls=100,
            shared_rows=500,
            repeats=1,
            plot=plot,
        )


# --------------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class LinearEnvironment:
    """A seeded contextual environment with a known optimum, precomputed for every step.

    Context x_t = (1, z_t) with z_t ~ N(0, I_{d-1}); arm k has theta_k ~ N(0, I/d), so its expected
    reward mu_k(x) = x . theta_k is about N(0, 1) across contexts. The observed reward of arm k at
    step t is mu_k(x_t) + noise[t, k] with noise ~ N(0, sigma^2), drawn once for every (step, arm)
    so that every learner faces the same reward for the same choice (common random numbers).
    """

    contexts: np.ndarray  # (T, d)
    means: np.ndarray  # (T, K): mu_k(x_t)
    noise: np.ndarray  # (T, K)

    @classmethod
    def generate(cls, steps: int, n_arms: int, dim: int, sigma: float, rng: np.random.Generator) -> LinearEnvironment:
        theta = rng.normal(0.0, 1.0 / np.sqrt(dim), size=(n_arms, dim))
        contexts = np.hstack([np.ones((steps, 1)), rng.normal(size=(steps, dim - 1))])
        noise = rng.normal(0.0, sigma, size=(steps, n_arms))
        return cls(contexts=contexts, means=contexts @ theta.T, noise=noise)

    @property
    def steps(self) -> int:
        return self.contexts.shape[0]

    @property
    def n_arms(self) -> int:
        return self.means.shape[1]

    @property
    def dim(self) -> int:
        return self.contexts.shape[1]


@dataclass(frozen=True)
class LabelledRows:
    """Logged (context, arm, reward) rows with arms drawn uniformly, as an update stream delivers them."""

    X: np.ndarray
    arms: np.ndarray
    rewards: np.ndarray

    @classmethod
    def generate(cls, rows: int, n_arms: int, dim: int, rng: np.random.Generator) -> LabelledRows:
        env = LinearEnvironment.generate(rows, n_arms, dim, 0.5, rng)
        arms = rng.integers(0, n_arms, size=rows)
        idx = np.arange(rows)
        rewards = env.means[idx, arms] + env.noise[idx, arms]
        return cls(X=env.contexts, arms=arms, rewards=rewards)

    def batches(self, size: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return [
            (self.X[i : i + size], self.arms[i : i + size], self.rewards[i : i + size])
            for i in range(0, len(self.arms), size)
        ]


# --------------------------------------------------------------------------------------------------
# Learners behind one small interface, so that every measurement runs the same code for all of them


class Learner(Protocol):
    def decide(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Choose an arm for every row of X with the model frozen; return (arms, probabilities)."""

    def update(self, X: np.ndarray, arms: np.ndarray, rewards: np.ndarray, probabilities: np.ndarray) -> None:
        """Learn from a batch of (context, arm, reward, probability of that arm) rows."""


class MabwiserLearner:
    """MABWiser LinUCB / LinTS: one ridge regression per arm, refit by ``partial_fit``."""

    def __init__(self, n_arms: int, dim: int, policy: str, alpha: float, seed: int):
        from mabwiser.mab import MAB, LearningPolicy

        learning_policy = {"LinUCB": LearningPolicy.LinUCB, "LinTS": LearningPolicy.LinTS}[policy](alpha=alpha)
        self.mab = MAB(arms=list(range(n_arms)), learning_policy=learning_policy, seed=seed)
        # An empty fit sets every arm to its ridge prior, so the first batch decides like later ones.
        self.mab.fit(np.zeros(0, dtype=int), np.zeros(0), np.zeros((0, dim)))

    def decide(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        chosen = np.atleast_1d(np.asarray(self.mab.predict(X), dtype=int))
        return chosen, np.ones(len(chosen))  # argmax of a score: deterministic given the draw

    def update(self, X: np.ndarray, arms: np.ndarray, rewards: np.ndarray, probabilities: np.ndarray) -> None:
        self.mab.partial_fit(arms, rewards, X)


class VowpalWabbitLearner:
    """VW ``--cb_explore_adf`` with per-arm linear models (shared context x arm indicator, ``-q sa``).

    Each row is one multi-line example: ``shared |s 0:x0 1:x1 ...`` then ``|a a<k>`` for every arm,
    the logged arm's line prefixed by ``k:cost:probability`` with cost = -reward.
    """

    def __init__(self, n_arms: int, dim: int, args: str, seed: int):
        import vowpalwabbit

        self.ws = vowpalwabbit.Workspace(f"--cb_explore_adf -q sa --quiet --random_seed {seed} {args}")
        self._shared = "shared |s " + " ".join(f"{j}:%.9g" for j in range(dim))
        self._actions = [f"|a a{k}" for k in range(n_arms)]
        self._rng = np.random.default_rng(seed)

    def pmf(self, x: Sequence[float]) -> list[float]:
        return self.ws.predict([self._shared % tuple(x), *self._actions])

    def choose(self, x: Sequence[float], u: float) -> tuple[int, float]:
        """Draw an arm from VW's pmf with the uniform number u; return (arm, its probability)."""
        pmf = self.pmf(x)
        arm = min(bisect.bisect_right(list(itertools.accumulate(pmf)), u), len(pmf) - 1)
        return arm, pmf[arm]

    def decide(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        picks = [self.choose(x, u) for x, u in zip(X.tolist(), self._rng.random(len(X)).tolist())]
        arms, probabilities = zip(*picks)
        return np.asarray(arms, dtype=int), np.asarray(probabilities)

    def learn_row(self, x: Sequence[float], arm: int, reward: float, probability: float) -> None:
        example = [self._shared % tuple(x), *self._actions]
        example[1 + arm] = f"{arm}:{-reward:.9g}:{probability:.9g} {self._actions[arm]}"
        self.ws.learn(example)

    def update(self, X: np.ndarray, arms: np.ndarray, rewards: np.ndarray, probabilities: np.ndarray) -> None:
        for x, arm, reward, p in zip(X.tolist(), arms.tolist(), rewards.tolist(), probabilities.tolist()):
            self.learn_row(x, arm, reward, p)


class OursLearner:
    """Ours: a ``learner.policies`` policy deciding one context at a time, as the SDK does.

    Disjoint policies take one candidate row per arm; every row is the context itself.
    """

    def __init__(self, n_arms: int, dim: int, policy: str, params: dict[str, float], seed: int):
        from learner.policies import make_policy

        self.policy = make_policy(policy, dim=dim, seed=seed, **params)
        self.arm_ids = tuple(str(k) for k in range(n_arms))
        self._rng = np.random.default_rng(seed)

    def choose(self, x: np.ndarray) -> tuple[int, float]:
        # The (K, d) matrix the SDK's encoder builds, one context row per arm; copying the row is
        # cheaper than the Python-level np.broadcast_to on this hot path.
        candidates = x[None, :].repeat(len(self.arm_ids), axis=0)
        choice = self.policy.probabilities(candidates, self.arm_ids, self._rng)
        return choice.chosen, choice.probability

    def decide(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        picks = [self.choose(x) for x in X]
        arms, probabilities = zip(*picks)
        return np.asarray(arms, dtype=int), np.asarray(probabilities)

    def update(self, X: np.ndarray, arms: np.ndarray, rewards: np.ndarray, probabilities: np.ndarray) -> None:
        self.policy.update_batch(X, [self.arm_ids[a] for a in arms.tolist()], rewards)


@dataclass(frozen=True)
class GridPoint:
    """One tuning setting of one learner family, buildable for any environment size and seed."""

    family: str  # "ours" | "mabwiser" | "vw"
    policy: str
    params: dict[str, Any]

    def build(self, n_arms: int, dim: int, seed: int) -> Learner:
        if self.family == "ours":
            return OursLearner(n_arms, dim, self.policy, self.params, seed)
        if self.family == "mabwiser":
            return MabwiserLearner(n_arms, dim, self.policy, self.params["alpha"], seed)
        return VowpalWabbitLearner(n_arms, dim, self.params["args"], seed)

    @property
    def setting(self) -> str:
        if self.family == "vw":
            return self.params["args"]
        return f"{self.policy}(" + ", ".join(f"{k}={v:g}" for k, v in self.params.items()) + ")"


def regret_grid() -> dict[str, list[GridPoint]]:
    """Six points per family, each around the knob that matters most for it (and ours with defaults).

    Ours and MABWiser mirror each other: the UCB width alpha and the Thompson-sampling posterior
    scale over the same three values. Ours runs without its exploration floor (eps0=0), as the
    peers have none (MABWiser's epsilon defaults to 0); what the floor costs is measured apart,
    outside the grid (``FLOORS``). VW learns by SGD, and its learning rate matters more here than
    its explorer: at the default -l 0.5, --epsilon 0.01..0.1, SquareCB gamma_scale 1..1000, regcb
    and cover 4 all ended between 4,800 and 53,000 regret. So VW's grid is SquareCB (default
    gamma_scale 10) over the learning rate -l and its decay --power_t.
    """
    scales = (0.1, 0.3, 1.0)
    return {
        "ours": [GridPoint("ours", "lin_ucb", {"alpha": a, "eps0": 0.0}) for a in scales]
        + [GridPoint("ours", "lin_ts", {"v": v, "eps0": 0.0}) for v in scales]
        + [GridPoint("ours", "lin_igw", {})],  # with its defaults: the default portfolio's acting member
        "mabwiser": [GridPoint("mabwiser", "LinUCB", {"alpha": a}) for a in scales]
        + [GridPoint("mabwiser", "LinTS", {"alpha": a}) for a in scales],
        "vw": [
            GridPoint("vw", "SquareCB", {"args": f"--squarecb -l {lr} --power_t {pt}"})
            for pt in (0.5, 0.7)
            for lr in (2, 5, 10)
        ],
    }


# --------------------------------------------------------------------------------------------------
# Measurements


def run_regret(learner: Learner, env: LinearEnvironment, batch: int) -> np.ndarray:
    """Per-step regret of ``learner`` over ``env``: decide ``batch`` steps frozen, then learn from them."""
    regret = np.empty(env.steps)
    best = env.means.max(axis=1)
    for start in range(0, env.steps, batch):
        idx = np.arange(start, min(start + batch, env.steps))
        X = env.contexts[idx]
        arms, probabilities = learner.decide(X)
        rewards = env.means[idx, arms] + env.noise[idx, arms]
        learner.update(X, arms, rewards, probabilities)
        regret[idx] = best[idx] - env.means[idx, arms]
    return regret


def uniform_regret(env: LinearEnvironment, seed: int) -> np.ndarray:
    arms = np.random.default_rng(seed).integers(0, env.n_arms, size=env.steps)
    return env.means.max(axis=1) - env.means[np.arange(env.steps), arms]


def percentiles_us(samples_ns: Sequence[int]) -> tuple[float, float]:
    p50, p99 = np.percentile(np.asarray(samples_ns, dtype=np.float64), [50, 99]) / 1_000.0
    return float(p50), float(p99)


def time_interleaved(
    calls: dict[str, Callable[[int], object]], n: int, warmup: int, rounds: int = 4
) -> dict[str, tuple[float, float]]:
    """p50 and p99 (us) of each ``call(i)`` over ``n`` timed calls, after ``warmup`` untimed ones.

    The learners take turns in ``rounds`` chunks of n / rounds calls, so that a burst of load
    from elsewhere on the machine falls on all of them rather than on whichever ran then.
    """
    for call in calls.values():
        for i in range(warmup):
            call(i)
    samples: dict[str, list[int]] = {name: [] for name in calls}
    clock = time.perf_counter_ns
    chunk = max(1, n // rounds)
    for start in range(0, n, chunk):
        for name, call in calls.items():
            gc.collect()
            timed = [0] * min(chunk, n - start)
            for j in range(len(timed)):
                t0 = clock()
                call(start + j)
                timed[j] = clock() - t0
            samples[name].extend(timed)
    return {name: percentiles_us(values) for name, values in samples.items()}


def best_rate(measure: Callable[[], float], repeats: int) -> float:
    """The best of ``repeats`` throughput runs: on a shared machine, the least disturbed one."""
    return max(measure() for _ in range(repeats))


def ours_update_rate(rows: LabelledRows, cfg: BenchConfig, batches: int, policy: str, wal: bool | None = None) -> float:
    """Rows/s of the worker's loop: ``update_batch`` per batch, with the learner's default
    durability: no write-ahead log, and every ``emit_every_updates`` rows, where the worker
    publishes (at these rates it publishes by count, not by time), one ``Shard.apply`` holding
    the state of every arm learned since the last and the consumed offset (one RocksDB write
    batch), then a flush of the shard. The worker starts that flush in the background and waits
    for it before it commits, while its records go to Kafka; without Kafka here, the whole flush
    is waited for. ``wal=True``: the store's own default instead, the log on, one ``Shard.apply``
    per batch and no flushes (the learner's ``learn.wal = true``)."""
    from learner.policies import make_policy
    from learner.store import ArmKey, ArmState, PosteriorStore
    from streams.learn import LearnerOptions

    dim = rows.X.shape[1]
    ids = [f"arm-{k:02d}" for k in range(cfg.update_arms)]
    # Arm ids arrive as strings from the decoded events; converting them is not the learner's work.
    todo = [(X, [ids[a] for a in arms.tolist()], r) for X, arms, r in rows.batches(cfg.update_batch_rows)]
    warmup, todo = todo[:2], todo[2 : 2 + batches]
    learner = make_policy(policy, dim=dim)
    source = ("bandit.updates", 0)
    options = LearnerOptions() if wal is None else LearnerOptions(wal=wal)
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp, PosteriorStore(tmp, wal=options.wal) as store:
        shard = store.shard(0)
        offset = 0

        unsaved: set[str] = set()

        def write() -> None:
            arms = sorted(unsaved)
            blobs = learner.arm_states_bytes(arms)  # as the worker encodes a write's arms
            shard.apply(
                {
                    ArmKey("bench", "main", "route", arm): ArmState(policy, dim, learner.update_count(arm), blob)
                    for arm, blob in zip(arms, blobs)
                },
                {source: offset},
            )
            unsaved.clear()

        def step(X: np.ndarray, arms: list[str], rewards: np.ndarray) -> None:
            nonlocal offset
            unsaved.update(learner.update_batch(X, arms, rewards))
            published = offset // options.emit_every_updates
            offset += len(arms)
            if options.wal:
                write()  # every block as it is folded
            elif offset // options.emit_every_updates > published:
                write()  # the blocks since the last publication, as the worker writes them when it publishes,
                shard.flush(wait=True)  # and flushes them by the time its publication commits

        for batch in warmup:
            step(*batch)
        gc.collect()
        t0 = time.perf_counter()
        for batch in todo:
            step(*batch)
        elapsed = time.perf_counter() - t0
    return sum(len(b[1]) for b in todo) / elapsed


def shared_update_rate(policy: str, rows: LabelledRows, warmup: int = 20) -> float:
    """Rows/s of a shared model learning one row per ``update_batch`` from its prior, each
    followed by ``posterior_mean``: the posterior ready for the next decision."""
    from learner.policies import make_policy

    model = make_policy(policy, dim=rows.X.shape[1], seed=0)
    ids = [str(a) for a in rows.arms.tolist()]
    steps = [(rows.X[i : i + 1], ids[i : i + 1], rows.rewards[i : i + 1]) for i in range(len(ids))]

    def step(X: np.ndarray, arms: list[str], rewards: np.ndarray) -> None:
        model.update_batch(X, arms, rewards)
        model.posterior_mean("")

    for batch in steps[:warmup]:
        step(*batch)
    gc.collect()
    t0 = time.perf_counter()
    for batch in steps[warmup:]:
        step(*batch)
    return (len(steps) - warmup) / (time.perf_counter() - t0)


#: Logged rows judged per run of the judging measurement.
JUDGE_ROWS = 5_000


def judge_rate(scorer: Any, X: np.ndarray, cfg: BenchConfig) -> float:
    """Rows/s of ``Portfolio.judge`` as the publisher runs it: rows scored by the previous
    snapshot's members (``scorer``), observed by the next snapshot's portfolio."""
    from learner.policies import make_policy

    rng = np.random.default_rng(cfg.seed)
    arms = [str(k) for k in range(cfg.decide_arms)]
    chosen = rng.integers(0, cfg.decide_arms, len(X)).tolist()
    propensities = rng.uniform(0.01, 1.0, len(X))
    rewards = rng.normal(size=len(X))
    target = make_policy("portfolio", dim=X.shape[1], seed=cfg.seed)
    started = time.perf_counter()
    target.judge(X, [arms] * len(X), chosen, propensities, rewards, scored_by=scorer, rng=cfg.seed)
    return len(X) / (time.perf_counter() - started)


def trained_scoring_view(policy: str, rows: LabelledRows, cfg: BenchConfig, acting: int | None = None) -> OursLearner:
    """Ours trained on ``rows``, then swapped for its scoring view: what the SDK decides from
    (a portfolio's member ``acting`` acting, as after a switch to it)."""
    learner = OursLearner(cfg.decide_arms, rows.X.shape[1], policy, {}, cfg.seed)
    for X, arms, rewards in rows.batches(1_000):
        learner.update(X, arms, rewards, np.ones(len(arms)))
    if acting is not None:
        learner.policy.acting = acting
    learner.policy = learner.policy.scoring_view()
    return learner


def profile_ours(cfg: BenchConfig, out: Console, top: int = 15) -> None:
    """cProfile of our hot paths, for whoever makes them faster: the update loop at d=128 (with
    the store write) and 20,000 decide calls of each linear policy at d=64."""
    import cProfile
    import io
    import pstats

    def show(title: str, profile: cProfile.Profile) -> None:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
        out.rule(title)
        out.print(text.getvalue().strip(), markup=False, highlight=False)

    rng = np.random.default_rng([cfg.seed, 128])
    batches = cfg.update_batches[128]
    rows = LabelledRows.generate((batches + 2) * cfg.update_batch_rows, cfg.update_arms, 128, rng)
    profile = cProfile.Profile()
    rate = profile.runcall(ours_update_rate, rows, cfg, batches, "lin_ucb")
    show(f"update d=128, lin_ucb + store write: {rate:,.0f} rows/s under the profiler", profile)

    rows = LabelledRows.generate(cfg.decide_train_rows, cfg.decide_arms, cfg.decide_dim, np.random.default_rng([cfg.seed, 64]))
    queries = np.random.default_rng([cfg.seed, 65]).normal(size=(cfg.decide_calls, cfg.decide_dim))
    for policy in ("lin_ts", "lin_ucb"):
        learner = trained_scoring_view(policy, rows, cfg)
        for q in queries[: cfg.decide_warmup_calls]:
            learner.choose(q)
        profile = cProfile.Profile()
        profile.runcall(lambda: [learner.choose(q) for q in queries])
        show(f"decide d={cfg.decide_dim}, {cfg.decide_arms} arms, {policy}: {len(queries):,} calls", profile)


def mabwiser_update_rate(rows: LabelledRows, cfg: BenchConfig) -> float:
    learner = MabwiserLearner(cfg.update_arms, rows.X.shape[1], "LinUCB", 1.0, cfg.seed)
    todo = rows.batches(cfg.update_batch_rows)
    warmup, todo = todo[:2], todo[2 : 2 + cfg.mabwiser_update_batches]
    for X, arms, rewards in warmup:
        learner.mab.partial_fit(arms, rewards, X)
    gc.collect()
    t0 = time.perf_counter()
    for X, arms, rewards in todo:
        learner.mab.partial_fit(arms, rewards, X)
    return sum(len(b[1]) for b in todo) / (time.perf_counter() - t0)


def vw_update_rate(rows: LabelledRows, cfg: BenchConfig) -> float:
    learner = VowpalWabbitLearner(cfg.update_arms, rows.X.shape[1], "--epsilon 0.05", cfg.seed)
    n = cfg.vw_update_rows
    X = rows.X[: n + 100].tolist()
    arms = rows.arms[: n + 100].tolist()
    rewards = rows.rewards[: n + 100].tolist()
    logged_p = 1.0 / cfg.update_arms  # the rows were logged by a uniform policy
    for i in range(n, n + 100):  # warm-up rows, not timed
        learner.learn_row(X[i], arms[i], rewards[i], logged_p)
    gc.collect()
    t0 = time.perf_counter()
    for i in range(n):
        learner.learn_row(X[i], arms[i], rewards[i], logged_p)
    return n / (time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------------
# Orchestration and report


@dataclass
class RegretResult:
    point: GridPoint
    total: float
    curve: np.ndarray  # cumulative regret per step
    seconds: float


class Bench:
    """Runs the three measurements and collects every figure in ``self.results``."""

    def __init__(self, cfg: BenchConfig, progress: Progress):
        self.cfg = cfg
        self.progress = progress
        self.results: dict[str, Any] = {"seed": cfg.seed}
        self.regret: dict[str, list[RegretResult]] = {}
        self.uniform_curve = np.zeros(0)

    def _rng(self, salt: int) -> np.random.Generator:
        return np.random.default_rng([self.cfg.seed, salt])

    # 1. update throughput ------------------------------------------------------------------------
    def update_throughput(self) -> None:
        from streams.learn import LearnerOptions

        cfg = self.cfg
        task = self.progress.add_task("update throughput", total=3 * len(cfg.update_batches) + 2)
        for dim, batches in cfg.update_batches.items():
            rows = LabelledRows.generate((batches + 2) * cfg.update_batch_rows, cfg.update_arms, dim, self._rng(dim))
            # As the learner worker runs (`banditstream learn` limits BLAS to one thread: its
            # products are small and per arm), and so every peer too.
            with _single_blas_thread():
                self.results[f"update_per_s_d{dim}"] = best_rate(
                    lambda: ours_update_rate(rows, cfg, batches, "lin_ucb"), cfg.repeats
                )
                self.progress.advance(task)
                # The default policy: a portfolio of three members that learn apart (the third on 129 Fourier features)
                self.results[f"update_per_s_d{dim}_portfolio"] = best_rate(
                    lambda: ours_update_rate(rows, cfg, batches, "portfolio"), cfg.repeats
                )
                # ... and with RocksDB's write-ahead log, what learn.wal = true costs
                self.results[f"update_per_s_d{dim}_portfolio_wal"] = best_rate(
                    lambda: ours_update_rate(rows, cfg, batches, "portfolio", wal=True), cfg.repeats
                )
                self.progress.advance(task)
                if dim == 32:
                    self.results["mabwiser_update_per_s_d32"] = best_rate(lambda: mabwiser_update_rate(rows, cfg), cfg.repeats)
                    self.progress.advance(task)
                    self.results["vw_update_per_s_d32"] = best_rate(lambda: vw_update_rate(rows, cfg), cfg.repeats)
                    self.progress.advance(task)
            # The same loop with BLAS's own threads (a process that does not limit them): small
            # per-arm products can thrash a multi-threaded BLAS when the cores are busy.
            self.results[f"update_per_s_d{dim}_blas_default"] = best_rate(
                lambda: ours_update_rate(rows, cfg, batches, "lin_ucb"), cfg.repeats
            )
            self.progress.advance(task)
        self.results["update_method"] = (
            f"lin_ucb (lin_ts shares its update), {cfg.update_arms} arms, {cfg.update_batch_rows:,}-row batches, "
            f"update_batch per batch, every {LearnerOptions().emit_every_updates:,} rows one Shard.apply (the arms "
            f"learned since + offset) and a flush, waited for: the learner's durability (no WAL); one BLAS thread as "
            f"the worker runs (peers too); best of {cfg.repeats} runs"
        )
        self.results["vw_update_method"] = (
            f"Workspace.learn(list of text lines) per row, all {cfg.update_arms} ADF arms, -q sa, "
            "text built from numpy inside the timed loop"
        )

    # 2. decide latency ---------------------------------------------------------------------------
    def decide_latency(self) -> None:
        cfg = self.cfg
        task = self.progress.add_task("decide latency", total=2)
        rows = LabelledRows.generate(cfg.decide_train_rows, cfg.decide_arms, cfg.decide_dim, self._rng(64))
        queries = self._rng(65).normal(size=(cfg.decide_calls, cfg.decide_dim))
        calls: dict[str, Callable[[int], object]] = {}
        for policy, key in (("lin_ts", "lints"), ("lin_ucb", "linucb"), ("lin_igw", "linigw"), ("portfolio", "portfolio")):
            learner = trained_scoring_view(policy, rows, cfg)
            calls[f"decide_{{}}_us_{key}_d64"] = lambda i, learner=learner: learner.choose(queries[i])
        # the default portfolio once its Fourier member acts: the map, then SquareCB over 129 entries
        fourier = trained_scoring_view("portfolio", rows, cfg, acting=2)
        calls["decide_{}_us_portfolio_fourier_d64"] = lambda i: fourier.choose(queries[i])

        mab = MabwiserLearner(cfg.decide_arms, cfg.decide_dim, "LinUCB", 1.0, cfg.seed)
        mab.mab.partial_fit(rows.arms, rows.rewards, rows.X)
        single = [q[None, :] for q in queries]
        calls["mabwiser_decide_{}_us_d64"] = lambda i: mab.mab.predict(single[i])

        vw = VowpalWabbitLearner(cfg.decide_arms, cfg.decide_dim, "--epsilon 0.05", cfg.seed)
        vw.update(rows.X, rows.arms, rows.rewards, np.full(len(rows.arms), 1.0 / cfg.decide_arms))
        lists = queries.tolist()
        uniforms = self._rng(66).random(len(lists)).tolist()
        calls["vw_decide_{}_us_d64"] = lambda i: vw.choose(lists[i], uniforms[i])
        self.progress.advance(task)

        for key, (p50, p99) in time_interleaved(calls, cfg.decide_calls, cfg.decide_warmup_calls).items():
            self.results[key.format("p50")] = p50
            self.results[key.format("p99")] = p99
        scorer = trained_scoring_view("portfolio", rows, cfg).policy  # trained once: the runs time the judging alone
        self.results["judge_rows_per_s_portfolio_d64"] = best_rate(
            lambda: judge_rate(scorer, queries[:JUDGE_ROWS], cfg), cfg.repeats
        )
        self.results["judge_method"] = (
            f"the publisher's judging of the default portfolio: {JUDGE_ROWS:,} logged rows, {cfg.decide_arms} candidates "
            "each, scored by a trained scoring view (every member's predictions and the greedy choice it is rated as) and observed; "
            f"best of {cfg.repeats} runs"
        )
        self.results["decide_method"] = (
            f"{cfg.decide_arms} arms, d={cfg.decide_dim}, trained on {cfg.decide_train_rows:,} rows; "
            f"{cfg.decide_calls:,} timed calls each, interleaved in 4 rounds; ours: scoring view, default "
            "alpha/v, n_draws and eps0; MABWiser: LinUCB predict(1 context); VW: --cb_explore_adf "
            "predict(text) + sampling the pmf"
        )
        self.progress.advance(task)

    # 3. shared-model updates at B=1 -------------------------------------------------------------
    def shared_updates(self) -> None:
        cfg = self.cfg
        task = self.progress.add_task("shared updates (B=1)", total=2)
        rows = LabelledRows.generate(cfg.shared_rows + 20, 10, cfg.shared_dim, self._rng(cfg.shared_dim))
        for policy, key in (("shared_lin_ucb", ""), ("shared_lin_ts", "_ts")):
            self.results[f"shared_updates_per_s_b1_d{cfg.shared_dim}{key}"] = best_rate(
                lambda: shared_update_rate(policy, rows), cfg.repeats
            )
            self.progress.advance(task)
        self.results["shared_update_method"] = (
            f"d={cfg.shared_dim}, {cfg.shared_rows:,} rows from the prior, one update_batch(1 row) + posterior_mean "
            f"per row; best of {cfg.repeats} runs"
        )

    # 4. regret -----------------------------------------------------------------------------------
    def regret_curves(self) -> None:
        cfg = self.cfg
        env = LinearEnvironment.generate(cfg.steps, cfg.regret_arms, cfg.regret_dim, cfg.regret_noise, self._rng(7))
        grid = regret_grid()
        task = self.progress.add_task("regret grid", total=sum(map(len, grid.values())))
        for family, points in grid.items():
            self.regret[family] = []
            for point in points:
                t0 = time.perf_counter()
                curve = np.cumsum(run_regret(point.build(env.n_arms, env.dim, cfg.seed), env, cfg.regret_batch))
                self.regret[family].append(RegretResult(point, float(curve[-1]), curve, time.perf_counter() - t0))
                self.progress.advance(task)
        self.uniform_curve = np.cumsum(uniform_regret(env, cfg.seed))
        best = self.best("ours").point
        task = self.progress.add_task("regret of the floor", total=len(FLOORS))
        for eps0 in FLOORS:
            point = GridPoint("ours", best.policy, {**best.params, "eps0": eps0})
            regret = run_regret(point.build(env.n_arms, env.dim, cfg.seed), env, cfg.regret_batch)
            self.results[f"regret_ours_eps0_{eps0:g}"] = float(regret.sum())
            self.progress.advance(task)
        for family, key in (("ours", "regret_ours"), ("mabwiser", "regret_mabwiser"), ("vw", "regret_vw")):
            best = self.best(family)
            self.results[key] = best.total
            self.results[f"{key}_policy"] = best.point.setting
        self.results["regret_uniform"] = float(self.uniform_curve[-1])
        self.results["regret_steps"] = cfg.steps
        self.results["regret_env"] = (
            f"{cfg.regret_arms} arms, d={cfg.regret_dim} (intercept + N(0,1)), theta~N(0,I/d), noise sd {cfg.regret_noise}"
        )
        self.results["regret_protocol"] = f"decide {cfg.regret_batch} steps frozen, then learn them; best of 6-point grid"

    def best(self, family: str) -> RegretResult:
        return min(self.regret[family], key=lambda r: r.total)

    # report --------------------------------------------------------------------------------------
    def tables(self) -> list[Table]:
        r = self.results
        perf = Table(title="Learner benchmark: ours vs peers (same data, same run)")
        for column in ("measurement", "ours", "MABWiser", "VW", "target"):
            perf.add_column(column, justify="right" if column != "measurement" else "left")

        def rate(key: str) -> str:
            return f"{r[key]:,.0f}/s" if key in r else ""

        def us(key: str) -> str:
            return f"{r[key]:,.1f} us" if key in r else ""

        update_target = {d: f">= {t:,}/s" for d, t in TARGET_UPDATE_PER_S.items()}
        decide_target = f"<= {TARGET_DECIDE_P99_US:g} us"
        rows = [
            ("update_per_s_d32", "update d=32, LinUCB (+store write)", rate, "mabwiser_update_per_s_d32", "vw_update_per_s_d32", update_target[32]),
            ("update_per_s_d32_blas_default", "  same, BLAS's own threads", rate, "", "", ""),
            ("update_per_s_d32_portfolio", "update d=32, portfolio (the default)", rate, "", "", update_target[32]),
            ("update_per_s_d32_portfolio_wal", "  same, learn.wal = true", rate, "", "", ""),
            ("update_per_s_d128", "update d=128, LinUCB (+store write)", rate, "", "", update_target[128]),
            ("update_per_s_d128_blas_default", "  same, BLAS's own threads", rate, "", "", ""),
            ("update_per_s_d128_portfolio", "update d=128, portfolio (the default)", rate, "", "", update_target[128]),
            ("update_per_s_d128_portfolio_wal", "  same, learn.wal = true", rate, "", "", ""),
            ("shared_updates_per_s_b1_d512", "shared update B=1 d=512, SharedLinUCB", rate, "", "", f">= {TARGET_SHARED_UPDATES_PER_S:,}/s"),
            ("shared_updates_per_s_b1_d512_ts", "shared update B=1 d=512, SharedLinTS", rate, "", "", f">= {TARGET_SHARED_UPDATES_PER_S:,}/s"),
            ("decide_p50_us_lints_d64", "decide p50 d=64, LinTS", us, "", "", ""),
            ("decide_p99_us_lints_d64", "decide p99 d=64, LinTS", us, "", "", decide_target),
            ("decide_p50_us_linigw_d64", "decide p50 d=64, LinIGW", us, "", "", ""),
            ("decide_p99_us_linigw_d64", "decide p99 d=64, LinIGW", us, "", "", decide_target),
            ("decide_p50_us_portfolio_d64", "decide p50 d=64, portfolio (the default)", us, "", "", ""),
            ("decide_p99_us_portfolio_d64", "decide p99 d=64, portfolio (the default)", us, "", "", decide_target),
            ("decide_p50_us_portfolio_fourier_d64", "decide p50 d=64, portfolio, Fourier member acting", us, "", "", ""),
            ("decide_p99_us_portfolio_fourier_d64", "decide p99 d=64, portfolio, Fourier member acting", us, "", "", decide_target),
            ("judge_rows_per_s_portfolio_d64", "publisher judging d=64, portfolio (rows)", rate, "", "", ""),
            ("decide_p50_us_linucb_d64", "decide p50 d=64, LinUCB (peers: predict)", us, "mabwiser_decide_p50_us_d64", "vw_decide_p50_us_d64", ""),
            ("decide_p99_us_linucb_d64", "decide p99 d=64, LinUCB (peers: predict)", us, "mabwiser_decide_p99_us_d64", "vw_decide_p99_us_d64", decide_target),
        ]
        for ours, label, fmt, mabwiser, vw, target in rows:
            if ours in r:
                perf.add_row(label, fmt(ours), fmt(mabwiser), fmt(vw), target)
        if self.regret:
            perf.add_row(
                f"regret after {self.cfg.steps:,} steps (best of grid)",
                f"{r['regret_ours']:,.1f}",
                f"{r['regret_mabwiser']:,.1f}",
                f"{r['regret_vw']:,.1f}",
                "ours <= best peer",
            )
            perf.add_row("  setting", r["regret_ours_policy"], r["regret_mabwiser_policy"], r["regret_vw_policy"], "")
            for eps0 in FLOORS:
                perf.add_row(f"  ours with floor eps0={eps0:g}", f"{r[f'regret_ours_eps0_{eps0:g}']:,.1f}", "", "", "")

        grid = Table(title=f"Regret tuning grid ({self.cfg.steps:,} steps; uniform random: {r.get('regret_uniform', 0):,.1f})")
        for column in ("learner", "setting", "regret", "seconds"):
            grid.add_column(column, justify="right" if column in ("regret", "seconds") else "left")
        for family, results in self.regret.items():
            best = self.best(family)
            for res in results:
                mark = " *" if res is best else ""
                grid.add_row(family, res.point.setting, f"{res.total:,.1f}{mark}", f"{res.seconds:.1f}")
        return [perf, grid] if self.regret else [perf]

    def plot(self, path: Path) -> None:
        import matplotlib.pyplot as plt

        path.parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(8, 5))
        steps = np.arange(1, self.cfg.steps + 1)
        for family, name in (("ours", "ours"), ("mabwiser", "MABWiser"), ("vw", "VW")):
            best = self.best(family)
            ax.plot(steps, best.curve, label=f"{name}: {best.point.setting} ({best.total:,.0f})")
        ax.plot(steps, self.uniform_curve, "--", color="grey", label=f"uniform random ({self.uniform_curve[-1]:,.0f})")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("cumulative regret (log scale)")
        ax.set_title(f"{self.results['regret_env']}; seed {self.cfg.seed}", fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        self.results["plot"] = str(path)

    def verdict(self) -> list[str]:
        r = self.results
        missed = []
        for dim, target in TARGET_UPDATE_PER_S.items():
            for key in (f"update_per_s_d{dim}", f"update_per_s_d{dim}_portfolio"):
                if key in r and r[key] < target:
                    missed.append(f"{key} = {r[key]:,.0f}/s < {target:,}/s")
        for key in ("shared_updates_per_s_b1_d512", "shared_updates_per_s_b1_d512_ts"):
            if key in r and r[key] < TARGET_SHARED_UPDATES_PER_S:
                missed.append(f"{key} = {r[key]:,.0f}/s < {TARGET_SHARED_UPDATES_PER_S:,}/s")
        for key in ("decide_p99_us_lints_d64", "decide_p99_us_linucb_d64", "decide_p99_us_linigw_d64", "decide_p99_us_portfolio_d64",
                    "decide_p99_us_portfolio_fourier_d64"):
            if key in r and r[key] > TARGET_DECIDE_P99_US:
                missed.append(f"{key} = {r[key]:.1f} us > {TARGET_DECIDE_P99_US:g} us")
        if "regret_ours" in r:
            best_peer = min(r["regret_mabwiser"], r["regret_vw"])
            if r["regret_ours"] > best_peer:
                missed.append(f"regret_ours = {r['regret_ours']:,.1f} > best peer {best_peer:,.1f}")
        return missed


def _single_blas_thread() -> Any:
    """A context limiting BLAS to one thread, as the workers do (``threadpoolctl``, which the
    project installs)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def parse_args(argv: Sequence[str] | None = None) -> tuple[BenchConfig, set[str], bool]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="regret steps (default 50,000; --quick: 3,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="short smoke run of every measurement")
    parser.add_argument("--plot", type=Path, default=BenchConfig.plot, help="cumulative-regret PNG path")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of benchmarking, print cProfile tables of our update (d=128) and decide paths",
    )
    parser.add_argument(
        "--only",
        choices=("update", "shared", "decide", "regret"),
        action="append",
        help="run only these measurements (repeatable); default all",
    )
    args = parser.parse_args(argv)
    if args.quick:
        cfg = BenchConfig.quick(args.seed, args.steps, args.plot)
    else:
        cfg = BenchConfig(seed=args.seed, steps=args.steps or BenchConfig.steps, plot=args.plot)
    return cfg, set(args.only or ("update", "shared", "decide", "regret")), args.profile


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 1) if abs(value) >= 100 else round(value, 3)
    return value


def main(argv: Sequence[str] | None = None) -> int:
    cfg, only, profile = parse_args(argv)
    out = Console(width=150)
    if profile:
        profile_ours(cfg, out)
        return 0
    err = Console(stderr=True)
    t0 = time.perf_counter()
    load_start = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=err,
    ) as progress:
        bench = Bench(cfg, progress)
        if "update" in only:
            bench.update_throughput()
        if "shared" in only:
            bench.shared_updates()
        if "decide" in only:
            bench.decide_latency()
        if "regret" in only:
            bench.regret_curves()
            bench.plot(cfg.plot)
    bench.results["seconds"] = time.perf_counter() - t0
    bench.results["load_avg_1m"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    for table in bench.tables():
        out.print(table)
    missed = bench.verdict()
    bench.results["targets_missed"] = missed
    for line in missed:
        out.print(f"[bold red]target missed:[/] {line}")
    if not missed:
        out.print("[bold green]all targets met[/]")
    sys.stdout.flush()
    print(json.dumps({k: _rounded(v) for k, v in bench.results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

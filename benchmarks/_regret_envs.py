"""The environments of the regret suite (``benchmarks/regret.py``), each a seeded stream of steps.

A step is a context vector z_t (raw features, no intercept), the arm set (ids ``0 .. n_t - 1``),
the expected reward mu_t(k) of every arm and the reward r_t(k) that arm would realise. Every
array is drawn up front from one generator seeded by ``(seed, crc32(name))``, so a stream does not
depend on which other environments run, and every learner meets the same reward for the same
choice at the same step (common random numbers): learners differ only by their choices.

Synthetic (K arms, d features z ~ N(0, I_d), noise N(0, 0.5^2) unless said):

- ``linear``: K=10, d=10; mu_k(z) = (1, z) . theta_k with theta_k ~ N(0, I/(d+1)), so mu is
  about N(0, 1) across contexts.
- ``nonlinear``: K=8, d=6; mu_k(z) = c_k + s_k 1[z_{p_k} > t_k] + u_k z_{q_k} z_{r_k}: a threshold
  and a product per arm, which no linear model holds.
- ``drift_abrupt``: ``linear`` whose coefficients are redrawn at T/2.
- ``drift_gradual``: ``linear`` with theta_k(t) = cos(phi_t) theta_k + sin(phi_t) theta'_k,
  phi_t = (pi / 2) t / (T - 1): by the end every arm's coefficients have turned into new ones.
- ``heavy_tail``: ``linear`` with Student-t noise of 2 degrees of freedom (infinite variance),
  scale 0.5.
- ``many_arms``: ``linear`` with K=100, d=5.
- ``fifty_arms``: ``linear`` with K=50, d=10: a second world with many arms, added after
  ``lin_igw``'s ``alpha`` was made to grow with the number of candidates (chosen on ``linear``,
  ``many_arms`` and linear worlds with K = 30-300 run outside the suite, this one among them).
- ``new_arms``: ``linear`` with 10 arms, and 10 more (ids 10..19, coefficients from the same
  prior) from T/2 on.

Datasets shipped inside scikit-learn (no download), turned into bandits as in the contextual
bandit bake-off (Bietti, Agarwal, Langford 2021, "A contextual bandit bake-off", JMLR 22): one arm
per class, reward 1 for the true class and 0 otherwise (so mu = r). Features are z-scored with
the dataset's own statistics; the stream cycles through the rows in a fresh random order per pass
and adds N(0, 0.1^2) noise to each copy, so T steps never repeat a context exactly.

- ``iris`` (K=3, d=4), ``wine`` (K=3, d=13), ``breast_cancer`` (K=2, d=30);
- ``digits`` (K=10, d=64) is **held out** (:data:`HELD_OUT`): nothing is tuned on it, it checks
  that what holds on the others carries over.

The dataset environments need scikit-learn; :func:`available` says which environments can run
here and why the others cannot.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: Environments never tuned on: a check that conclusions carry over.
HELD_OUT = ("digits",)

NOISE_SD = 0.5
#: Noise added to every cycled copy of a dataset row, in standard deviations of the feature.
DATASET_JITTER = 0.1


@dataclass(frozen=True)
class Stream:
    """T precomputed steps of one environment.

    ``contexts`` (T, d) raw features; ``means`` and ``rewards`` (T, K) for the K arms that ever
    exist (columns past ``n_arms[t]`` are not available at step t and never read there);
    ``n_arms`` (T,) the number of arms available at each step, ids ``0 .. n_arms[t] - 1``.
    """

    name: str
    contexts: np.ndarray
    means: np.ndarray
    rewards: np.ndarray
    n_arms: np.ndarray
    held_out: bool = False

    @property
    def steps(self) -> int:
        return self.contexts.shape[0]

    @property
    def dim(self) -> int:
        return self.contexts.shape[1]

    @property
    def max_arms(self) -> int:
        return self.means.shape[1]

    @property
    def shape(self) -> str:
        grows = f"{self.n_arms[0]}->{self.max_arms}" if self.n_arms[0] != self.max_arms else f"{self.max_arms}"
        return f"K={grows}, d={self.dim}"

    def best(self) -> np.ndarray:
        """max_k mu_t(k) over the arms available at each step, (T,)."""
        available = np.arange(self.max_arms) < self.n_arms[:, None]
        return np.where(available, self.means, -np.inf).max(axis=1)

    def uniform(self) -> np.ndarray:
        """Expected reward of a uniformly random available arm at each step, (T,)."""
        available = np.arange(self.max_arms) < self.n_arms[:, None]
        return np.where(available, self.means, 0.0).sum(axis=1) / self.n_arms

    def segments(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """Steps ``lo:hi`` cut where the arm set changes: ``(start, end, n_arms)`` per piece."""
        cuts = [lo, *(lo + 1 + np.flatnonzero(np.diff(self.n_arms[lo:hi]))).tolist(), hi]
        return [(a, b, int(self.n_arms[a])) for a, b in zip(cuts, cuts[1:])]


# --------------------------------------------------------------------------------------------------
# Synthetic environments


def _with_intercept(z: np.ndarray) -> np.ndarray:
    return np.hstack([np.ones((z.shape[0], 1)), z])


def _linear_stream(
    name: str, steps: int, rng: np.random.Generator, *, n_arms: int, dim: int, drift: str = "", heavy_tail: bool = False
) -> Stream:
    z = rng.normal(size=(steps, dim))
    x = _with_intercept(z)
    theta = rng.normal(0.0, 1.0 / np.sqrt(dim + 1), size=(n_arms, dim + 1))
    if drift == "abrupt":
        after = rng.normal(0.0, 1.0 / np.sqrt(dim + 1), size=theta.shape)
        half = steps // 2
        means = np.vstack([x[:half] @ theta.T, x[half:] @ after.T])
    elif drift == "gradual":
        after = rng.normal(0.0, 1.0 / np.sqrt(dim + 1), size=theta.shape)
        phi = (np.pi / 2) * np.arange(steps) / max(steps - 1, 1)
        means = np.cos(phi)[:, None] * (x @ theta.T) + np.sin(phi)[:, None] * (x @ after.T)
    else:
        means = x @ theta.T
    if heavy_tail:
        noise = NOISE_SD * rng.standard_t(2.0, size=means.shape)
    else:
        noise = rng.normal(0.0, NOISE_SD, size=means.shape)
    return Stream(name, z, means, means + noise, np.full(steps, n_arms))


def linear(steps: int, rng: np.random.Generator) -> Stream:
    return _linear_stream("linear", steps, rng, n_arms=10, dim=10)


def drift_abrupt(steps: int, rng: np.random.Generator) -> Stream:
    return _linear_stream("drift_abrupt", steps, rng, n_arms=10, dim=10, drift="abrupt")


def drift_gradual(steps: int, rng: np.random.Generator) -> Stream:
    return _linear_stream("drift_gradual", steps, rng, n_arms=10, dim=10, drift="gradual")


def heavy_tail(steps: int, rng: np.random.Generator) -> Stream:
    return _linear_stream("heavy_tail", steps, rng, n_arms=10, dim=10, heavy_tail=True)


def many_arms(steps: int, rng: np.random.Generator) -> Stream:
    return _linear_stream("many_arms", steps, rng, n_arms=100, dim=5)


def fifty_arms(steps: int, rng: np.random.Generator) -> Stream:
    return _linear_stream("fifty_arms", steps, rng, n_arms=50, dim=10)


def new_arms(steps: int, rng: np.random.Generator) -> Stream:
    stream = _linear_stream("new_arms", steps, rng, n_arms=20, dim=10)
    n_arms = np.where(np.arange(steps) < steps // 2, 10, 20)
    return Stream(stream.name, stream.contexts, stream.means, stream.rewards, n_arms)


def nonlinear(steps: int, rng: np.random.Generator) -> Stream:
    n_arms, dim = 8, 6
    z = rng.normal(size=(steps, dim))
    base = rng.normal(0.0, 0.5, size=n_arms)
    step_height = rng.normal(size=n_arms)
    step_at = rng.uniform(-0.5, 0.5, size=n_arms)
    step_on = rng.integers(0, dim, size=n_arms)
    pairs = np.array([rng.choice(dim, size=2, replace=False) for _ in range(n_arms)])
    product_weight = rng.normal(size=n_arms)
    means = (
        base
        + step_height * (z[:, step_on] > step_at)
        + product_weight * z[:, pairs[:, 0]] * z[:, pairs[:, 1]]
    )
    noise = rng.normal(0.0, NOISE_SD, size=means.shape)
    return Stream("nonlinear", z, means, means + noise, np.full(steps, n_arms))


# --------------------------------------------------------------------------------------------------
# Multiclass datasets as bandits (Bietti et al. 2021)


def _dataset_stream(name: str, steps: int, rng: np.random.Generator) -> Stream:
    from sklearn import datasets

    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    spread = X.std(axis=0)
    X = (X - X.mean(axis=0)) / np.where(spread > 0, spread, 1.0)
    passes = -(-steps // len(y))
    order = np.concatenate([rng.permutation(len(y)) for _ in range(passes)])[:steps]
    z = X[order] + rng.normal(0.0, DATASET_JITTER, size=(steps, X.shape[1]))
    n_classes = int(y.max()) + 1
    means = (y[order, None] == np.arange(n_classes)).astype(np.float64)
    return Stream(name, z, means, means, np.full(steps, n_classes), held_out=name in HELD_OUT)


#: Datasets shipped inside scikit-learn, turned into bandits (they need scikit-learn).
DATASETS = ("iris", "wine", "breast_cancer", "digits")

#: Every environment, in the order the suite reports them.
ENVIRONMENTS: dict[str, Callable[[int, np.random.Generator], Stream]] = {
    "linear": linear,
    "nonlinear": nonlinear,
    **{name: functools.partial(_dataset_stream, name) for name in DATASETS},
    "drift_abrupt": drift_abrupt,
    "drift_gradual": drift_gradual,
    "heavy_tail": heavy_tail,
    "many_arms": many_arms,
    "fifty_arms": fifty_arms,
    "new_arms": new_arms,
}


def available() -> tuple[list[str], dict[str, str]]:
    """(environments that can run here, {environment: why not} for the others)."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return [name for name in ENVIRONMENTS if name not in DATASETS], dict.fromkeys(DATASETS, "scikit-learn is not installed")
    return list(ENVIRONMENTS), {}


def generate(name: str, steps: int, seed: int) -> Stream:
    """Environment ``name`` for ``steps`` steps, seeded by ``(seed, crc32(name))``."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return ENVIRONMENTS[name](steps, rng)

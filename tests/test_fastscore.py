"""The compiled decision step (``learner._fastscore``) against the numpy path it replaces.

With the extension built, LinTS and LinUCB decide in one C call and per-arm candidate rows
are built in C. These tests hold both to the numpy code that stays the fallback: the same
distribution and choice from the same seed (so the same draws of the rng, in the same
order), mean and width within 1e-12 relative, over trained and untrained policies, several
sizes and floors, and every way the candidates can sit in the per-arm arrays (a block in
order, a permuted block, a subset). Then: bad input is refused without a crash, and the
Decider works, with the same choices, when the extension is missing.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from banditstream.decider import ActivePolicy, Decider
from learner import _fastscore, features  # built by pip install; a missing build fails here
from learner.domain import DomainSettings
from learner.features import FeatureConfig, FeatureEncoder, Normalizer
from learner.policies import _fourier, _linear, base, make_policy


@pytest.fixture
def numpy_only(monkeypatch):
    """Run as if learner._fastscore were not built."""
    for module in (base, _linear, features):
        monkeypatch.setattr(module, "_fastscore", None)


def _numpy_path(monkeypatch, fn, *args, **kwargs):
    with monkeypatch.context() as m:
        for module in (base, _linear, features):
            m.setattr(module, "_fastscore", None)
        return fn(*args, **kwargs)


def _policy(name: str, K: int, d: int, eps0: float, *, seed: int, trained: bool = True, **params):
    policy = make_policy(name, dim=d, eps0=eps0, seed=0, **params)
    arms = [f"arm{i:03d}" for i in range(K)]
    policy.probabilities(np.ones((K, d)), arms, rng=0)  # registers the arms in order: arms[i] in slot i
    if trained:
        rng = np.random.default_rng(seed)
        n = 20 * K
        X = rng.standard_normal((n, d))
        X[:, 0] = 1.0
        policy.update_batch(X, rng.choice(arms, n), rng.standard_normal(n))
    return policy, arms


def _candidate_sets(arms: list[str], rng: np.random.Generator):
    """(kind, candidates): every way the candidates' slots can sit in the per-arm arrays."""
    K = len(arms)
    yield "block", arms
    if K > 1:
        yield "permuted block", [arms[i] for i in rng.permutation(K)]
        yield "block of a subset", arms[1:]
    if K > 2:
        yield "subset", [arms[i] for i in rng.permutation(K) if i != 1]  # slots with a gap


def _rows(K: int, d: int, rng: np.random.Generator, density: float) -> np.ndarray:
    """Candidate rows with an intercept, a ``density`` share of the other terms nonzero (the
    compiled scores skip zeros, and take another kernel for dense rows)."""
    X = rng.standard_normal((K, d)) * (rng.random((K, d)) < density)
    X[:, 0] = 1.0
    return X


POLICY_CASES = [
    ("lin_ts", {"v": 0.7}),
    ("lin_ts", {"v": 0.7, "n_draws": 5}),
    ("lin_ts", {"v": 2.0, "n_draws": 1}),
    ("lin_ucb", {"alpha": 0.8}),
    ("lin_igw", {}),
    ("lin_igw", {"alpha": 0.0, "gamma_scale": 10.0}),
    ("lin_igw", {"new_arm_rows": 25, "new_arm_share": 1.0, "gamma_scale": 1e4}),  # new arms raised
]


@pytest.mark.parametrize(("name", "params"), POLICY_CASES, ids=lambda c: str(c))
@pytest.mark.parametrize(("K", "d"), [(1, 4), (3, 1), (10, 64), (12, 7), (70, 9)])
@pytest.mark.parametrize("eps0", [0.0, 0.1, 1.0])
def test_compiled_choice_is_the_numpy_distribution_and_choice(monkeypatch, name, params, K, d, eps0):
    for trained in (True, False):
        policy, arms = _policy(name, K, d, eps0, seed=K * d, trained=trained, **params)
        rng = np.random.default_rng(K + d)
        for kind, candidates in _candidate_sets(arms, rng):
            for density in (0.1, 1.0):
                X = _rows(len(candidates), d, rng, density)
                seed = int(rng.integers(1 << 30))
                compiled = policy.probabilities(X, candidates, rng=seed)
                reference = _numpy_path(monkeypatch, policy.probabilities, X, candidates, rng=seed)
                what = f"{kind}, trained={trained}, density={density}"
                if name == "lin_igw":
                    # p is a continuous function of the scores, whose last bits differ between
                    # the two summation orders: equal to rounding, and the same choice
                    np.testing.assert_allclose(compiled.probabilities, reference.probabilities, rtol=1e-12, atol=1e-15)
                    assert compiled.chosen == reference.chosen, what
                    continue
                assert np.array_equal(compiled.probabilities, reference.probabilities), what
                assert (compiled.chosen, compiled.probability) == (reference.chosen, reference.probability), what


@pytest.mark.parametrize("name", ["lin_ts", "lin_ucb"])
@pytest.mark.parametrize(("K", "d"), [(1, 1), (4, 3), (10, 64), (33, 17)])
def test_compiled_mean_and_width_match_numpy_within_1e_12(name, K, d):
    policy, arms = _policy(name, K, d, 0.05, seed=7 * K + d)
    rng = np.random.default_rng(d)
    for kind, candidates in _candidate_sets(arms, rng):
        for density in (0.1, 0.5, 1.0):
            X = _rows(len(candidates), d, rng, density) * 10.0 ** rng.integers(-3, 4)
            slots, block = policy._candidate_slots(candidates)
            ref_mean, ref_width = policy._mean_width(X, slots, block)  # first: brings the factors up to date
            mean, width = np.empty(len(candidates)), np.empty(len(candidates))
            _fastscore.mean_width(policy._arrays["factor"], slots, X, mean, width)
            # relative to the terms' magnitudes: x . theta may cancel to near zero
            size = np.einsum("kij,kj->ki", np.abs(policy._arrays["factor"][slots]), np.abs(X))
            np.testing.assert_allclose(mean, ref_mean, rtol=1e-12, atol=1e-12 * size[:, 0].max(), err_msg=kind)
            np.testing.assert_allclose(width, ref_width, rtol=1e-12, atol=1e-12 * np.linalg.norm(size[:, 1:], axis=1).max())


def test_the_candidate_sets_cover_every_layout():
    policy, arms = _policy("lin_ts", 6, 3, 0.1, seed=1)
    kinds = {}
    for kind, candidates in _candidate_sets(arms, np.random.default_rng(0)):
        policy._candidates = None
        _, block = policy._candidate_slots(candidates)
        kinds[kind] = "none" if block is None else ("in order" if block.perm is None else "permuted")
    assert kinds == {"block": "in order", "permuted block": "permuted", "block of a subset": "in order", "subset": "none"}


@pytest.mark.parametrize(("name", "params"), POLICY_CASES, ids=lambda c: str(c))
def test_a_seed_gives_the_same_choices_twice_and_the_numpy_paths_choices(monkeypatch, name, params):
    policy, arms = _policy(name, 10, 16, 0.05, seed=3, **params)
    view = policy.scoring_view()  # what the SDK decides with
    contexts = _rows(200, 16, np.random.default_rng(1), 0.3)

    def run(p):
        rng = np.random.default_rng(11)
        return [p.probabilities(np.tile(x, (10, 1)), arms, rng=rng).chosen for x in contexts]

    first = run(view)
    assert run(view) == first == run(policy)
    assert _numpy_path(monkeypatch, run, view) == first  # same draws of the rng, in the same order
    assert len(set(first)) > 1


def test_non_finite_rows_are_refused_on_both_paths(monkeypatch):
    policy, arms = _policy("lin_ts", 3, 4, 0.1, seed=0)
    X = np.ones((3, 4))
    X[1, 2] = np.nan
    with pytest.raises(ValueError, match="finite"):
        policy.probabilities(X, arms)
    with pytest.raises(ValueError, match="finite"):
        _numpy_path(monkeypatch, policy.probabilities, X, arms)
    assert _fastscore.all_finite(np.ones((2, 3))) and not _fastscore.all_finite(np.array([1.0, np.inf]))
    assert _fastscore.all_finite(np.empty((0, 3)))


def test_the_compiled_calls_refuse_bad_arrays_rather_than_read_past_them():
    F = np.zeros((4, 5, 4))
    slots = np.arange(2, dtype=np.intp)
    X = np.ones((2, 4))
    out = np.empty(2)
    with pytest.raises(IndexError):
        _fastscore.mean_width(F, np.array([0, 4], dtype=np.intp), X, out, np.empty(2))
    with pytest.raises(TypeError):
        _fastscore.mean_width(F, slots.astype(np.int32), X, out, np.empty(2))
    with pytest.raises(TypeError):
        _fastscore.mean_width(F, slots, X.astype(np.float32), out, np.empty(2))
    with pytest.raises((TypeError, ValueError, BufferError)):
        _fastscore.mean_width(F, slots, np.ones((4, 2)).T, out, np.empty(2))  # not C-contiguous
    with pytest.raises(ValueError):
        _fastscore.mean_width(F, slots, np.ones((2, 3)), out, np.empty(2))
    with pytest.raises(ValueError):
        _fastscore.choose(F, slots, X, 1.0, np.zeros((3, 2)), 4, 0.0, 0.1, 0.5, out)  # 2 rows of normals for 4 draws
    with pytest.raises(ValueError):
        _fastscore.repeated_row(np.empty((2, 3)), [0, 1], [1.0], True)
    with pytest.raises(IndexError):
        _fastscore.repeated_row(np.empty((2, 3)), [3], [1.0], True)


@pytest.mark.parametrize("intercept", [True, False])
def test_per_arm_candidate_rows_are_the_python_rows_bit_for_bit(monkeypatch, intercept):
    normalizer = Normalizer()
    for x in (1.0, 3.0, 8.0):
        normalizer.observe("c:tokens", x)
    config = FeatureConfig(dimension=8, intercept=intercept, vector_dim=3)
    encoder = FeatureEncoder(config, normalizer.freeze())
    actions = [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    for context in (
        {"numeric": {"tokens": 2.5, "other": 1.0}, "categorical": {"intent": "code"}, "vector": [0.1, -2.0, 3.0]},
        {"numeric": {}, "categorical": {}, "vector": []},
        {"numeric": {f"f{i}": float(i) for i in range(30)}, "categorical": {}, "vector": []},  # collisions add
    ):
        compiled = encoder.action_matrix(context, actions)
        reference = _numpy_path(monkeypatch, encoder.action_matrix, context, actions)
        assert compiled.shape == (3, 8) and compiled.tobytes() == reference.tobytes()


def test_the_decider_decides_the_same_without_the_extension(numpy_only):
    settings = DomainSettings(policy="lin_ts", params={"v": 0.5, "eps0": 0.1}, features={"dimension": 16, "normalize": False})
    arms = ["small", "large", "huge"]
    policy = settings.make_policy(seed=0)
    encoder = settings.encoder()
    rows = np.tile(encoder.context_vector({"numeric": {"tokens": 1.0}, "categorical": {}, "vector": []}), (300, 1))
    policy.update_batch(rows, [arms[i % 3] for i in range(300)], [float(i % 3 == 1) for i in range(300)])

    def run():
        decider = Decider("routing", settings=settings, seed=4)
        decider.use(ActivePolicy("1", policy.scoring_view(), encoder))
        return [decider.decide({"tokens": float(i % 5)}, arms) for i in range(100)]

    without = run()
    assert base._fastscore is None and all(d.fallback is None for d in without)
    with pytest.MonkeyPatch.context() as m:
        for module in (base, _linear, features):
            m.setattr(module, "_fastscore", _fastscore)
        compiled = run()
    assert [(d.action, d.probabilities) for d in compiled] == [(d.action, d.probabilities) for d in without]


def test_the_draw_never_picks_an_index_of_probability_zero():
    # LinUCB with no floor puts probability 1 on its best candidate and 0 on the rest: whatever
    # the uniform, the draw lands on the best, for K on both sides of 64 (two draw rules)
    for K in (5, 64, 65, 130):
        policy, arms = _policy("lin_ucb", K, 3, 0.0, seed=K, alpha=0.1)
        X = _rows(K, 3, np.random.default_rng(K), 1.0)
        p = np.empty(K)
        slots, _ = policy._candidate_slots(arms)
        for u in itertools.chain((0.0, 1.0 - 2**-53), np.random.default_rng(0).random(50)):
            chosen = _fastscore.choose(policy._arrays["factor"], slots, X, 0.1, None, 0, 0.0, 0.0, float(u), p)
            assert p[chosen] == 1.0 and chosen == base.draw_index(p, float(u))


def _arguments(rng: np.random.Generator) -> np.ndarray:
    """Cosine arguments a Fourier map meets and its edges: z-scored rows' (a few units), wide
    ones, tiny ones, the multiples of pi/4 where the quadrant turns, the reduction's limit, and
    the far, infinite and nan ones libm takes."""
    edge = _fourier.COS_REDUCED
    return np.concatenate(
        [
            rng.standard_normal(50_000) * 5.0,
            rng.uniform(-1e5, 1e5, 20_000),
            rng.uniform(-1e-6, 1e-6, 1_000),
            np.arange(-400, 401) * (np.pi / 4),
            np.nextafter(np.pi / 4 * np.arange(-8, 9), np.inf),
            [0.0, -0.0, edge, -edge, np.nextafter(edge, np.inf), 2e6, -1e12, 1e300, np.inf, -np.inf, np.nan],
        ]
    )


def test_the_fourier_cosine_is_the_same_bits_compiled_and_in_numpy_and_within_two_ulps_of_libm():
    t = _arguments(np.random.default_rng(0))
    ours = _fourier.fourier_cos(t)
    out = np.empty((1, len(t) + 1))
    _fastscore.fourier(t[None, :].copy(), np.ones(1), np.zeros(len(t)), 1.0, out)
    assert out[0, 0] == 1.0
    assert np.array_equal(out[0, 1:].view(np.int64), ours.view(np.int64))  # nan's bits too
    finite = np.isfinite(t)
    assert np.isnan(ours[~finite]).all()
    libm = np.cos(t[finite])
    ulps = np.abs(ours[finite] - libm) / np.spacing(np.maximum(np.abs(libm), 1e-300))
    assert ulps.max() <= 2.0, t[finite][ulps.argmax()]
    assert np.mean(ulps) < 0.25  # mostly the correctly rounded value


def test_the_compiled_fourier_map_is_the_numpy_map_bit_for_bit(monkeypatch):
    rng = np.random.default_rng(1)
    for dim, n, scale in ((3, 1, 1.0), (8, 7, 0.5), (33, 128, 2.0)):
        fmap = _fourier.FourierFeatures(dim, n, scale)
        X = rng.standard_normal((40, dim)) * 3.0
        X[:, 0] = 1.0
        X[5, 1:] = 0.0  # only the intercept: m = 1
        X[7] = X[6]
        X[9, 1] = 1e7  # past the reduction: libm's cos on both paths
        compiled = fmap(X)
        with monkeypatch.context() as m:
            m.setattr(_fourier, "_fastscore", None)
            numpy = fmap(X)
        assert compiled.shape == (40, n + 1) and (compiled[:, 0] == 1.0).all()
        assert np.array_equal(compiled.view(np.int64), numpy.view(np.int64)), (dim, n)
        phi = np.cos((X @ fmap.W) / (scale * np.sqrt(np.maximum(np.count_nonzero(X[:, 1:], axis=1), 1)))[:, None] + fmap.c)
        assert np.allclose(compiled[:, 1:], _fourier.AMPLITUDE * phi, rtol=0, atol=1e-15)


def test_the_compiled_fourier_map_refuses_arrays_that_disagree():
    inner, out = np.zeros((2, 3)), np.empty((2, 4))
    with pytest.raises(ValueError, match="disagree"):
        _fastscore.fourier(inner, np.ones(3), np.zeros(3), 1.0, out)
    with pytest.raises(ValueError, match="disagree"):
        _fastscore.fourier(inner, np.ones(2), np.zeros(3), 1.0, np.empty((2, 3)))
    with pytest.raises(TypeError, match="float64"):
        _fastscore.fourier(inner.astype(np.float32), np.ones(2), np.zeros(3), 1.0, out)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _fastscore.fourier(np.zeros((3, 2)).T, np.ones(2), np.zeros(3), 1.0, out)

"""The compiled feature encoding (``_fastscore.hash_record`` and ``assemble``) against the
Python path it replaces, which stays the reference and the fallback.

Two encoders of one config, one encoding in C and one in Python (``features._fastscore`` set to
None), are fed the same random records: numbers of every type the SDK and the decoder hand
over, names that hit and miss the caches, categorical values of every width of character,
action ids, dense vectors, normalisation on and off. They must give the same records (same
values, same types, same bits), the same matrices bit for bit, the same caches, the same
normaliser statistics, and the same exceptions with the same messages for bad values.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from learner import _fastscore, features  # built by pip install; a missing build fails here
from learner.features import FeatureConfig, FeatureEncoder, Normalizer, _Record

CONFIGS = [
    FeatureConfig(dimension=16, normalize=False),
    FeatureConfig(dimension=32, normalize=True, clip=2),  # an int clip
    FeatureConfig(dimension=64, shared=True, interactions=True, normalize=True, clip=1.5, vector_dim=3, action_vector_dim=2, seed=5),
    FeatureConfig(dimension=24, shared=True, normalize=False, action_id=False, intercept=False),
    FeatureConfig(dimension=3, shared=True, interactions=True, normalize=True),  # every feature collides
]

NAMES = ["tokens", "temperature", "f0", "f1", "prix", "größe", "名前"]
CATEGORIES = ["billing", "", "é", "日本語", "🙂", 3, 2.5, True, None]


def _number(rng: np.random.Generator):
    """A finite value of one of the types a numeric feature arrives as."""
    x = float(rng.standard_normal() * 10.0 ** rng.integers(-3, 5))
    return [x, int(x), x > 0, np.float64(x), np.float32(x), np.int64(int(x)), -0.0, repr(x), 0][rng.integers(9)]


def _features(rng: np.random.Generator, vector_dim: int, *, fresh: int) -> dict:
    """A Features record: known names (cache hits) and ``fresh`` new ones (misses)."""
    numeric = {NAMES[i]: _number(rng) for i in rng.permutation(len(NAMES))[: rng.integers(len(NAMES) + 1)]}
    numeric.update({f"new{rng.integers(1 << 30)}": _number(rng) for _ in range(fresh)})
    categorical = {f"k{i}": CATEGORIES[rng.integers(len(CATEGORIES))] for i in range(rng.integers(4))}
    record: dict = {"numeric": numeric, "categorical": categorical}
    shape = rng.integers(5)
    if shape == 1:
        record["vector"] = []
    elif shape == 2 and vector_dim:
        record["vector"] = rng.standard_normal(vector_dim).tolist()
    elif shape == 3 and vector_dim:
        record["vector"] = tuple(_number(rng) for _ in range(vector_dim))
    elif shape == 4 and vector_dim:
        record["vector"] = rng.standard_normal(vector_dim)
    return record


def _event(rng: np.random.Generator, config: FeatureConfig, *, fresh: int = 1) -> dict:
    actions = []
    for k in range(1 + rng.integers(4)):
        action: dict = {"id": [f"arm-{k}", k, f"模型{k}"][rng.integers(3)]}
        shape = rng.integers(4)
        if shape == 1:
            action["features"] = None
        elif shape == 2:
            action["features"] = {"numeric": {}, "categorical": {}, "vector": []}
        elif shape == 3:
            action["features"] = _features(rng, config.action_vector_dim, fresh=fresh)
        actions.append(action)
    context = _features(rng, config.vector_dim, fresh=fresh)
    return {"context": context, "actions": actions, "chosen": int(rng.integers(len(actions)))}


def _python(monkeypatch, fn, *args):
    with monkeypatch.context() as m:
        m.setattr(features, "_fastscore", None)
        return fn(*args)


def _exactly(values: list) -> list:
    """Values with their types; repr tells every float apart (-0.0 from 0.0 too)."""
    return [(type(v), repr(v)) for v in values]


def _assert_same_record(fast: _Record, slow: _Record) -> None:
    assert type(fast) is _Record
    for a, b in zip(fast, slow):
        assert _exactly(a) == _exactly(b)


def _encoders(config: FeatureConfig, stats: dict | None = None) -> tuple[FeatureEncoder, FeatureEncoder]:
    return FeatureEncoder(config, Normalizer(stats)), FeatureEncoder(config, Normalizer(stats))


def _compare(monkeypatch, fast: FeatureEncoder, slow: FeatureEncoder, batch: list[dict]) -> None:
    """Every encoding of the batch, then the encoders' state, alike on both paths."""
    assert fast.acted_matrix(batch).tobytes() == _python(monkeypatch, slow.acted_matrix, batch).tobytes()
    contexts = [event["context"] for event in batch]
    assert fast.context_matrix(contexts).tobytes() == _python(monkeypatch, slow.context_matrix, contexts).tobytes()
    for event in batch:
        context, actions = event["context"], event["actions"]
        assert fast.action_matrix(context, actions).tobytes() == _python(monkeypatch, slow.action_matrix, context, actions).tobytes()
        assert fast.context_vector(context).tobytes() == _python(monkeypatch, slow.context_vector, context).tobytes()
        _assert_same_record(fast._hash_record(context, "c"), _python(monkeypatch, slow._hash_record, context, "c"))
        for action in actions:
            record = (action.get("features"), "a", str(action["id"]))
            _assert_same_record(fast._hash_record(*record), _python(monkeypatch, slow._hash_record, *record))
    assert fast._cache == slow._cache and fast._numeric == slow._numeric


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"d{c.dimension}-shared{c.shared}-norm{c.normalize}")
def test_compiled_encoding_is_the_python_encoding_bit_for_bit(monkeypatch, config):
    rng = np.random.default_rng(config.dimension)
    fast, slow = _encoders(config)
    for step in range(8):
        batch = [_event(rng, config) for _ in range(40)]
        _compare(monkeypatch, fast, slow, batch)
        fast.observe_events(batch)  # the statistics grow: values without, then with, then clipped
        slow.observe_events(batch)
        assert fast.normalizer.export() == slow.normalizer.export()


def test_bounded_caches_are_cleared_alike_on_both_paths(monkeypatch):
    monkeypatch.setattr(features, "_CACHE_LIMIT", 16)
    config = FeatureConfig(dimension=32, shared=True, interactions=True, normalize=True)
    rng = np.random.default_rng(1)
    fast, slow = _encoders(config)
    for _ in range(6):
        batch = [_event(rng, config, fresh=5) for _ in range(10)]
        _compare(monkeypatch, fast, slow, batch)
        assert 0 < len(fast._cache) <= 16 and 0 < len(fast._numeric["c"]) <= 16
        fast.observe_events(batch)
        slow.observe_events(batch)


def test_z_scores_match_in_every_state_of_the_statistics(monkeypatch):
    stats = {
        "c:unseen_spread": [1.0, 4.0, 0.0],  # no spread: 0
        "c:big": [3.0, 1.0, 2.0],
        "c:tiny": [7.0, 1e-3, 1e-12],  # clipped both ways
        "c:huge": [2.0, -1e300, 1e308],  # z overflows to +-inf: clipped
        "a:cost": [5.0, 0.5, 0.3],
    }
    context = {"numeric": {"unseen_spread": 4.0, "big": -3.0, "tiny": 2.0, "huge": 1e308, "nan": 1.0, "never": 9.0}}
    for clip in (5.0, 1, 1e-9):
        config = FeatureConfig(dimension=32, shared=True, normalize=True, clip=clip)
        for frozen in (False, True):
            fast, slow = FeatureEncoder(config, Normalizer(stats, frozen=frozen)), FeatureEncoder(config, Normalizer(stats, frozen=frozen))
            if not frozen:  # mean inf, m2 NaN (a frozen copy refuses them): every z is NaN, which clips to +clip
                fast.normalizer.observe("c:nan", float("inf"))
                slow.normalizer.observe("c:nan", float("inf"))
            _assert_same_record(fast._hash_record(context, "c"), _python(monkeypatch, slow._hash_record, context, "c"))
            action = {"numeric": {"cost": 100.0}}
            _assert_same_record(fast._hash_record(action, "a", "x"), _python(monkeypatch, slow._hash_record, action, "a", "x"))
        assert fast.normalizer.transform("c:tiny", -5.0, 1.0) == -1.0
    fast.normalizer = Normalizer(stats)
    fast.normalizer.observe("c:nan", float("inf"))
    assert fast._hash_record(context, "c").value[4] == 1e-9  # the NaN z-score, clipped


class _Shifted(Normalizer):
    def transform(self, name: str, value: float, clip: float = float("inf")) -> float:
        return super().transform(name, value, clip) + 0.25


def test_a_normaliser_of_another_class_is_asked_through_its_transform(monkeypatch):
    config = FeatureConfig(dimension=16, normalize=True)
    fast, slow = FeatureEncoder(config, _Shifted({"c:x": [2.0, 1.0, 2.0]})), FeatureEncoder(config, _Shifted({"c:x": [2.0, 1.0, 2.0]}))
    context = {"numeric": {"x": 3.0, "y": 1.0}}
    record = fast._hash_record(context, "c")
    _assert_same_record(record, _python(monkeypatch, slow._hash_record, context, "c"))
    assert record.value == [2.25, 0.25]  # z = (3 - 1) / 1, shifted


def _error(fn, *args) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        fn(*args)
    return type(info.value), str(info.value)


BAD_CONTEXTS = [
    {"numeric": {"x": float("nan")}},
    {"numeric": {"ok": 1.0, "x": float("inf")}},
    {"numeric": {"x": -np.inf}},
    {"numeric": {"x": "nan"}},
    {"numeric": {7: float("nan")}},
    {"numeric": {"x": "abc"}},
    {"numeric": {"x": None}},
    {"numeric": {"x": 10**400}},
    {"numeric": {"x": [1.0]}},
    {"vector": [1.0, 2.0]},
    {"vector": [1.0, float("nan"), 2.0]},
    {"vector": [1.0, "x", 2.0]},
    {"vector": 5},
    {"numeric": {"x": 1.0}, "categorical": {"k": "v"}, "vector": np.array([1.0, np.inf, 0.0])},
]


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("context", BAD_CONTEXTS, ids=repr)
def test_bad_values_raise_the_same_errors_on_both_paths(monkeypatch, context, normalize):
    fast, slow = _encoders(FeatureConfig(dimension=16, normalize=normalize, vector_dim=3), {"c:x": [2.0, 0.0, 2.0]})
    error = _error(fast.context_vector, context)
    assert error == _error(_python, monkeypatch, slow.context_vector, context)
    assert error[0] in (ValueError, TypeError, OverflowError)
    assert fast._cache == slow._cache and fast._numeric == slow._numeric  # what was hashed before the error
    if context.get("numeric", {}).get("x") is not None and "nan" in str(context["numeric"]["x"]).lower():
        assert error == (ValueError, "numeric feature 'x' is nan; features must be finite")


@pytest.mark.parametrize("stat", [[0.0, 0.0, 1.0], [1e300, 0.0, 1e-300]], ids=["zero count", "spread underflows"])
def test_statistics_python_would_divide_by_zero_with_raise_alike(monkeypatch, stat):
    fast, slow = _encoders(FeatureConfig(dimension=16, normalize=True), {"c:x": stat})
    context = {"numeric": {"x": 1.0}}
    assert _error(fast.context_vector, context) == _error(_python, monkeypatch, slow.context_vector, context)
    assert _error(fast.context_vector, context)[0] is ZeroDivisionError


class _Features(dict):
    def get(self, key, default=None):
        return {"numeric": {"x": 2.0}}.get(key, default)


@pytest.mark.parametrize(
    "context",
    [
        types.MappingProxyType({"numeric": {"x": 1.0}, "categorical": {"k": "v"}}),
        {"numeric": types.MappingProxyType({"x": 1.0})},
        {"numeric": [], "categorical": ()},  # falsy: no features
        _Features(),  # a dict that is not one: its own get() counts
        {},
        None,
    ],
    ids=["mapping", "numeric mapping", "falsy parts", "dict subclass", "empty", "none"],
)
def test_records_of_other_mappings_take_the_python_path(monkeypatch, context):
    fast, slow = _encoders(FeatureConfig(dimension=16, normalize=False))
    _assert_same_record(fast._hash_record(context, "c"), _python(monkeypatch, slow._hash_record, context, "c"))


def test_the_compiled_calls_refuse_bad_plans_and_records_rather_than_crash():
    encoder = FeatureEncoder(FeatureConfig(dimension=8))
    with pytest.raises(TypeError, match="plan"):
        _fastscore.hash_record((1, 2), {}, None, None)
    with pytest.raises(TypeError):
        _fastscore.hash_record(encoder._plans["c"], {})
    with pytest.raises(IndexError, match="out of range"):
        _fastscore.assemble(np.zeros((1, 8)), [(_Record([1], [8], [1.0], [1.0]), None)], False, 1, 7, True)
    with pytest.raises(TypeError, match="aligned"):
        _fastscore.assemble(np.zeros((1, 8)), [(_Record([1], [2, 3], [1.0], [1.0]), None)], False, 1, 7, True)
    with pytest.raises(ValueError, match="one row per pair"):
        _fastscore.assemble(np.zeros((2, 8)), [(_Record([], [], [], []), None)], False, 1, 7, True)
    with pytest.raises(TypeError, match="float64"):
        _fastscore.assemble(np.zeros((1, 8), dtype=np.float32), [(_Record([], [], [], []), None)], False, 1, 7, True)

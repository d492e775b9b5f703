"""Feature hashing, normalisation and interactions: deterministic, unbiased, asked-for only."""

from __future__ import annotations

import dataclasses
import doctest
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import learner.features
from learner.features import FeatureConfig, FeatureEncoder, FrozenNormalizerError, Normalizer
from learner.policies import make_policy

ROOT = Path(__file__).resolve().parents[1]

CONFIG = FeatureConfig(dimension=48, shared=True, interactions=True, vector_dim=3, action_vector_dim=2, seed=17)


def events(n: int, seed: int = 0) -> list[dict]:
    """DecisionEvents as fastavro decodes them (only the fields the encoder reads)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        actions = [
            {
                "id": f"model-{k}",
                "features": {
                    "numeric": {"cost": float(rng.uniform(0, 2)), "latency_ms": float(rng.uniform(50, 900))},
                    "categorical": {"family": ["gpt", "claude", "llama"][k % 3]},
                    "vector": rng.normal(size=2).tolist(),
                },
            }
            for k in range(1 + i % 4)
        ]
        out.append(
            {
                "context": {
                    "numeric": {"tokens": float(rng.integers(10, 4000)), "temperature": float(rng.random())},
                    "categorical": {"intent": ["billing", "tech", "sales"][i % 3], "tier": "gold" if i % 2 else "free"},
                    "vector": rng.normal(size=3).tolist(),
                },
                "actions": actions,
                "chosen": i % len(actions),
            }
        )
    return out


def encode_all(config: FeatureConfig, normalizer_export: dict, evts: list[dict]) -> bytes:
    encoder = FeatureEncoder(config, Normalizer.from_export(normalizer_export, frozen=True))
    parts = [encoder.acted_matrix(evts)]
    parts += [np.ascontiguousarray(encoder.action_matrix(e["context"], e["actions"])) for e in evts]
    parts += [encoder.context_matrix([e["context"] for e in evts])]
    return b"".join(part.astype("<f8").tobytes() for part in parts)


def trained_normalizer(evts: list[dict]) -> dict:
    encoder = FeatureEncoder(CONFIG)
    encoder.observe_events(evts)
    return encoder.normalizer.export()


# --- determinism -----------------------------------------------------------------------------------


def test_vectors_are_byte_identical_in_another_process_with_another_hash_seed():
    evts = events(40)
    export = trained_normalizer(evts)
    here = encode_all(CONFIG, export, evts)
    script = (
        "import sys, json, hashlib\n"
        "from learner.features import FeatureConfig\n"
        "from tests.test_features import encode_all\n"
        "data = json.load(sys.stdin)\n"
        "blob = encode_all(FeatureConfig(**data['config']), data['normalizer'], data['events'])\n"
        "print(hashlib.sha256(blob).hexdigest(), len(blob))\n"
    )
    payload = json.dumps({"config": CONFIG.to_dict(), "normalizer": export, "events": evts})
    for hash_seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", script], input=payload, capture_output=True, text=True, cwd=ROOT, env=env, check=True
        )
        assert done.stdout.split() == [hashlib.sha256(here).hexdigest(), str(len(here))]


def test_seed_gives_an_independent_hashing():
    context = {"numeric": {f"f{i}": 1.0 for i in range(20)}}
    first = FeatureEncoder(FeatureConfig(dimension=64, normalize=False, seed=1)).context_vector(context)
    again = FeatureEncoder(FeatureConfig(dimension=64, normalize=False, seed=1)).context_vector(context)
    other = FeatureEncoder(FeatureConfig(dimension=64, normalize=False, seed=2)).context_vector(context)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


# --- signed hashing --------------------------------------------------------------------------------


def test_hashed_slots_are_uniform_and_signs_balanced():
    d = 65  # 64 hashed slots after the intercept
    encoder = FeatureEncoder(FeatureConfig(dimension=d, normalize=False))
    n = 20_000
    matrix = encoder.context_matrix([{"categorical": {"user": f"u{i}"}} for i in range(n)])
    assert (matrix[:, 0] == 1.0).all()
    hashed = matrix[:, 1:]
    assert (np.count_nonzero(hashed, axis=1) == 1).all()  # one indicator, one slot, value +-1
    signs = hashed.sum(axis=1)
    assert set(np.unique(signs)) == {-1.0, 1.0}
    assert abs((signs > 0).mean() - 0.5) < 0.02  # 4 standard errors
    counts = np.count_nonzero(hashed, axis=0)
    expected = n / 64
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 130  # 63 degrees of freedom: mean 63, this is far in the tail


def test_collisions_cancel_in_expectation_through_the_signs():
    """With far more features than slots, inner products of hashed vectors stay unbiased over
    independent hashings (seeds), and colliding unit features cancel instead of piling up."""
    x = {f"f{i}": float(v) for i, v in enumerate(np.random.default_rng(0).normal(size=200))}
    y = {name: value + 0.5 for name, value in list(x.items())[:120]}  # overlaps x on 120 names
    exact = sum(x[name] * y[name] for name in y)
    dots, norms = [], []
    for seed in range(400):
        encoder = FeatureEncoder(FeatureConfig(dimension=17, normalize=False, intercept=False, seed=seed))
        hx, hy = encoder.context_vector({"numeric": x}), encoder.context_vector({"numeric": y})
        dots.append(hx @ hy)
        norms.append(hx @ hx)
    dots, norms = np.array(dots), np.array(norms)
    assert abs(dots.mean() - exact) < 4 * dots.std() / np.sqrt(len(dots))
    squared = sum(v * v for v in x.values())
    assert abs(norms.mean() - squared) < 4 * norms.std() / np.sqrt(len(norms))
    ones = FeatureEncoder(FeatureConfig(dimension=17, normalize=False, intercept=False)).context_vector(
        {"categorical": {f"c{i}": "on" for i in range(2000)}}
    )
    assert abs(ones.sum()) < 4 * np.sqrt(2000)  # without signs it would be exactly 2000



def test_the_encoder_warns_once_with_numbers_when_collisions_become_likely(caplog):
    """63 hashed slots: 11 keys give 55 / 63 = 0.87 expected colliding pairs, 12 give 66 / 63 =
    1.05, the first count at which a shared slot is more likely than not; 1024 slots hold 12
    keys at 66 / 1023 = 0.065 pairs, 512 would not (0.13)."""
    encoder = FeatureEncoder(FeatureConfig(dimension=64, normalize=False))
    with caplog.at_level("WARNING", logger="learner.features"):
        encoder.context_vector({"numeric": {f"x{i}": 1.0 for i in range(11)}})
        assert caplog.records == []
        encoder.context_vector({"numeric": {f"x{i}": 1.0 for i in range(12)}})
        encoder.context_vector({"numeric": {f"y{i}": 1.0 for i in range(40)}})  # more keys: no second warning
    [record] = caplog.records
    message = record.getMessage()
    assert "features.dimension 64 hashes 12 distinct feature keys" in message and "63 slots" in message
    assert "about 1.0 pairs" in message and "dimension 1024" in message
    assert learner.features.dimension_for(12) == 1024 and learner.features.expected_colliding_pairs(12, 511) > 0.1
    roomy = FeatureEncoder(FeatureConfig(dimension=1024, normalize=False))
    with caplog.at_level("WARNING", logger="learner.features"):
        roomy.context_vector({"numeric": {f"x{i}": 1.0 for i in range(12)}})
    assert len(caplog.records) == 1  # still only the first encoder's

# --- normalisation ---------------------------------------------------------------------------------


def test_normaliser_matches_numpy_mean_and_std_on_a_stream():
    rng = np.random.default_rng(3)
    stream = {"c:tokens": rng.lognormal(5, 1.5, size=5000), "c:temperature": rng.uniform(size=5000) + 1e6}
    normalizer = Normalizer()
    for i in range(5000):
        for name, values in stream.items():
            normalizer.observe(name, float(values[i]))
    for name, values in stream.items():
        assert normalizer.count(name) == 5000
        assert normalizer.mean(name) == pytest.approx(np.mean(values), rel=1e-12)
        assert normalizer.std(name) == pytest.approx(np.std(values), rel=1e-9)
        assert normalizer.transform(name, float(values[7])) == pytest.approx(
            (values[7] - np.mean(values)) / np.std(values), abs=1e-7
        )
    assert normalizer.transform("c:tokens", 1e12, clip=3.0) == 3.0
    assert normalizer.transform("c:unseen", 42.0) == 0.0
    restored = Normalizer.from_export(json.loads(json.dumps(normalizer.export())))
    assert restored.export() == normalizer.export()


def test_encoder_z_scores_numerics_with_frozen_statistics_and_never_learns_while_encoding():
    learning = FeatureEncoder(FeatureConfig(dimension=32))
    values = np.random.default_rng(1).normal(10, 3, size=500)
    for v in values:
        learning.observe({"numeric": {"x": float(v)}})
    frozen = learning.normalizer.freeze()
    scorer = FeatureEncoder(FeatureConfig(dimension=32), frozen)
    raw = FeatureEncoder(FeatureConfig(dimension=32, normalize=False))
    z = (12.5 - values.mean()) / values.std()
    np.testing.assert_allclose(
        scorer.context_vector({"numeric": {"x": 12.5}}), raw.context_vector({"numeric": {"x": z}}), rtol=1e-12
    )
    before = learning.normalizer.export()
    learning.context_vector({"numeric": {"x": 99.0}})
    assert learning.normalizer.export() == before
    with pytest.raises(FrozenNormalizerError):
        scorer.observe({"numeric": {"x": 1.0}})
    with pytest.raises(FrozenNormalizerError):
        frozen.observe("c:x", 1.0)
    learning.observe({"numeric": {"x": 1000.0}})  # the learner's copy moves on, the frozen one not
    assert frozen.count("c:x") == 500 and learning.normalizer.count("c:x") == 501


# --- rows per candidate ----------------------------------------------------------------------------


def test_interactions_appear_only_when_asked():
    base = dict(dimension=4096, shared=True, normalize=False, action_id=False)
    context = {"numeric": {"u": 2.0}}
    action = {"id": "x", "features": {"numeric": {"v": 3.0}}}
    plain = FeatureEncoder(FeatureConfig(**base))
    crossed = FeatureEncoder(FeatureConfig(**base, interactions=True))
    main_effects = plain.context_vector(context) + plain.action_matrix({}, [action])[0]
    main_effects[0] = 1.0
    np.testing.assert_array_equal(plain.action_matrix(context, [action])[0], main_effects)
    difference = crossed.action_matrix(context, [action])[0] - main_effects
    assert np.count_nonzero(difference) == 1
    assert abs(difference).max() == 6.0  # the one product u * v, with its sign
    with pytest.raises(ValueError, match="interactions need shared"):
        FeatureConfig(interactions=True)


def test_per_arm_rows_are_the_context_vector_whatever_the_actions():
    encoder = FeatureEncoder(FeatureConfig(dimension=32, normalize=False, vector_dim=3))
    evt = events(4)[3]
    matrix = encoder.action_matrix(evt["context"], evt["actions"])
    assert matrix.shape == (len(evt["actions"]), 32)
    for row in matrix:
        np.testing.assert_array_equal(row, encoder.context_vector(evt["context"]))


@pytest.mark.parametrize("shared", [False, True])
def test_acted_rows_are_the_chosen_rows_of_the_candidate_matrix(shared):
    config = dataclasses.replace(CONFIG, shared=shared, interactions=shared)
    encoder = FeatureEncoder(config)
    evts = events(30, seed=4)
    encoder.observe_events(evts[:10])
    acted = encoder.acted_matrix(evts)
    for i, evt in enumerate(evts):
        np.testing.assert_array_equal(acted[i], encoder.action_matrix(evt["context"], evt["actions"])[evt["chosen"]])
    if shared:
        # different actions of one decision get different rows
        evt = evts[3]
        matrix = encoder.action_matrix(evt["context"], evt["actions"])
        assert len({row.tobytes() for row in matrix}) == len(evt["actions"])


def test_malformed_features_are_refused_with_what_was_expected():
    encoder = FeatureEncoder(FeatureConfig(dimension=16, vector_dim=4))
    with pytest.raises(ValueError, match="context vector has 3 values, but the feature config expects 4"):
        encoder.context_vector({"vector": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match="finite"):
        encoder.context_vector({"numeric": {"x": float("nan")}})
    with pytest.raises(ValueError, match="out of range"):
        encoder.acted_matrix([{"context": {}, "actions": [{"id": "a"}], "chosen": 1}])
    assert encoder.context_vector({}).tolist() == [1.0] + [0.0] * 15  # no features: the intercept


def test_categorical_slots_give_beta_ts_its_segments():
    encoder = FeatureEncoder(FeatureConfig(dimension=1024, normalize=False))
    intents = ["billing", "tech", "sales"]
    slots = encoder.categorical_slots("intent", intents)
    policy = make_policy("beta_ts", dim=1024, segment_slots=slots)
    X = encoder.context_matrix([{"categorical": {"intent": i}, "numeric": {"n": 1.0}} for i in intents + ["other"]])
    assert policy.segments(X).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="collide"):  # 4 values, 3 hashed slots: two must share one
        FeatureEncoder(FeatureConfig(dimension=4)).categorical_slots("intent", ["a", "b", "c", "d"])


# --- configuration ---------------------------------------------------------------------------------


def test_config_hash_is_stable_and_changes_with_every_field():
    assert FeatureConfig().config_hash() == "781a8b8dab9f89c4"  # pinned: encoding changes must bump it
    base = FeatureConfig(shared=True)
    assert base.config_hash() == FeatureConfig(shared=True).config_hash()
    assert FeatureConfig.from_dict(base.to_dict()).config_hash() == base.config_hash()
    changed = {
        "dimension": 65,
        "shared": False,
        "interactions": True,
        "normalize": False,
        "intercept": False,
        "action_id": False,
        "vector_dim": 8,
        "action_vector_dim": 8,
        "vector_layout": "direct",
        "clip": 3.0,
        "seed": 1,
    }
    assert set(changed) == {f.name for f in dataclasses.fields(FeatureConfig)}  # a new field needs a case
    hashes = {dataclasses.replace(base, **{name: value}).config_hash() for name, value in changed.items()}
    assert len(hashes) == len(changed) and base.config_hash() not in hashes
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in hashes)


@pytest.mark.parametrize("shared", [False, True])
def test_a_direct_vector_passes_through_exactly_and_named_features_hash_after_it(shared):
    rng = np.random.default_rng(4)
    config = FeatureConfig(dimension=300, vector_dim=256, vector_layout="direct", shared=shared, normalize=False)
    encoder = FeatureEncoder(config)
    vectors = rng.normal(size=(50, 256))
    events = [{"context": {"numeric": {"x": float(rng.normal())}, "categorical": {"lang": str(rng.choice(["en", "de"]))},
                           "vector": v.tolist()},
               "actions": [{"id": "a", "features": {"categorical": {"k": "v"}}}], "chosen": 0} for v in vectors]  # fmt: skip
    rows = encoder.acted_matrix(events)
    np.testing.assert_array_equal(rows[:, 0], 1.0)
    np.testing.assert_array_equal(rows[:, 1:257], vectors)  # value i in slot 1 + i: no hashing, no sign
    named = rows[:, 257:]
    assert np.count_nonzero(named) >= 2 * len(events)  # x, lang (and the action's features when shared)
    python = encoder._assemble([(encoder._hash_record_python(e["context"], "c"),
                                 encoder._hash_record_python(e["actions"][0]["features"], "a", "a") if shared else None)
                                for e in events])  # fmt: skip
    np.testing.assert_array_equal(python, rows)  # the compiled path and the reference agree
    hashed = FeatureEncoder(dataclasses.replace(config, vector_layout="hashed")).acted_matrix(events)
    assert not np.array_equal(hashed[:, 1:257], vectors)


def test_a_direct_vector_needs_room_for_the_hashed_features():
    with pytest.raises(ValueError, match="give at least 258"):
        FeatureConfig(dimension=257, vector_dim=256, vector_layout="direct")
    with pytest.raises(ValueError, match="vector_layout must be"):
        FeatureConfig(vector_layout="dense")
    assert FeatureConfig(dimension=64).config_hash() == FeatureConfig(dimension=64, vector_layout="hashed").config_hash()


def test_a_declared_vector_that_fits_passes_through_unhashed_by_default():
    fits = FeatureConfig(dimension=64, vector_dim=32, normalize=False)
    assert fits.vector_layout == "direct"  # resolved when built: the dict and the hash name it
    assert fits.to_dict()["vector_layout"] == "direct"
    assert fits.config_hash() == FeatureConfig(dimension=64, vector_dim=32, normalize=False, vector_layout="direct").config_hash()
    vector = np.linspace(-1.0, 1.0, 32)
    row = FeatureEncoder(fits).context_vector({"vector": vector.tolist(), "numeric": {"x": 2.0}})
    np.testing.assert_array_equal(row[1:33], vector)  # no collisions, no signs
    assert np.count_nonzero(row[33:]) == 1  # the named feature hashed after it
    # no room for a hashed slot after the vector, or no vector: hashed, as before
    assert FeatureConfig(dimension=33, vector_dim=32).vector_layout == "hashed"
    assert FeatureConfig(dimension=64).vector_layout == "hashed"
    assert FeatureConfig(dimension=64).config_hash() == FeatureConfig.from_dict(FeatureConfig(dimension=64).to_dict()).config_hash()
    # a snapshot's feature dict from before layouts existed hashed its vector: it still does
    legacy = {k: v for k, v in fits.to_dict().items() if k != "vector_layout"}
    assert FeatureConfig.from_dict(legacy).vector_layout == "hashed"
    assert FeatureConfig.from_dict(fits.to_dict()) == fits


def test_docstring_examples_run():
    result = doctest.testmod(learner.features)
    assert result.attempted > 0
    assert result.failed == 0


def test_a_normalisers_observations_are_its_most_observed_features_count():
    normalizer = Normalizer()
    assert normalizer.observations() == 0
    for x in range(5):
        normalizer.observe("c:words", float(x))
    normalizer.observe("c:rare", 1.0)
    assert normalizer.observations() == 5 == normalizer.count("c:words")


def test_merged_normalizers_hold_the_statistics_of_all_their_values_whatever_the_split():
    rng = np.random.default_rng(11)
    values = {"c:tokens": rng.normal(300.0, 80.0, 500), "c:latency": rng.exponential(2.0, 500)}
    whole = Normalizer()
    parts = [Normalizer() for _ in range(4)]
    for i in range(500):
        for name, column in values.items():
            if name == "c:latency" and i % 3 == 0:
                continue  # features a partition did not always see
            whole.observe(name, float(column[i]))
            parts[int(rng.integers(4))].observe(name, float(column[i]))
    merged = Normalizer.merged(parts, frozen=True)
    assert merged.frozen and merged.names() == whole.names()
    for name in whole.names():
        assert merged.count(name) == whole.count(name)
        assert merged.mean(name) == pytest.approx(whole.mean(name), rel=1e-12)
        assert merged.std(name) == pytest.approx(whole.std(name), rel=1e-12)
    assert Normalizer.merged([]).names() == []

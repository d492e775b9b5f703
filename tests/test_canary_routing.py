"""Canary routing in the SDK: a stable hash of the unit sends a share of decisions to the canary
snapshot, every event logs the channel and version that decided, and the promotion settings
that drive it are validated like every other section."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from pydantic import ValidationError

from banditstream.config import ConfigError, load_settings
from banditstream.decider import ActivePolicy, Decider, stable_hash
from learner.domain import DomainSettings, PromotionSettings
from learner.evaluation import ESTIMATORS
from publisher import SnapshotClient
from publisher.cli_ops import generate_keys, load_keys
from publisher.publish import Publisher
from publisher.stores import open_store
from streams.serde import AvroSerde

ARMS = ["gpt-small", "gpt-large", "llama-70b", "haiku"]
SETTINGS = DomainSettings(policy="lin_ucb", params={"alpha": 0.2, "eps0": 0.1}, features={"dimension": 16, "normalize": False})
CONTEXT = {"tokens": 1.0}


def _active(version: str, best: str, **kwargs) -> ActivePolicy:
    """A snapshot whose policy learned that ``best`` earns 1 and the others 0."""
    policy = SETTINGS.make_policy(seed=0)
    encoder = SETTINGS.encoder()
    x = encoder.context_vector({"numeric": {"tokens": 1.0}, "categorical": {}, "vector": []})
    arms = [ARMS[i % len(ARMS)] for i in range(400)]
    policy.update_batch(np.tile(x, (400, 1)), arms, [1.0 if a == best else 0.0 for a in arms])
    return ActivePolicy(version, policy.scoring_view(), encoder, **kwargs)


STABLE = _active("1.0.0", best="llama-70b")
CANARY = _active("1.1.0", best="haiku")


class _Captured:
    """An emitter that keeps what decide() emits, decoded."""

    def __init__(self) -> None:
        self.serde = AvroSerde("decision", framing="single_object")
        self.events: list[dict] = []

    def emit(self, topic: str, key: str, payload: bytes) -> None:
        self.events.append(self.serde.decode(payload))

    def close(self, timeout: float = 0.0) -> None:
        return None


def _decider(share: float, *, stable=STABLE, canary=CANARY, **kwargs) -> Decider:
    decider = Decider("routing", settings=SETTINGS, canary_share=share, seed=1, **kwargs)
    decider.use(stable)
    decider.use(canary, channel="canary")
    decider._emitter = _Captured()
    return decider


def _counts(decider: Decider, metric: str, label: str) -> dict:
    return {
        (s.labels[label], s.labels["channel"]): s.value
        for m in decider.metrics.registry.collect() if m.name == metric
        for s in m.samples if s.name.endswith("_total") and s.value
    }  # fmt: skip


# -- the hash -------------------------------------------------------------------------------------


def test_stable_hash_is_blake2b_of_the_key_as_a_fraction_and_never_reaches_one():
    import hashlib

    digest = hashlib.blake2b("user-42".encode(), digest_size=8).digest()
    assert stable_hash("user-42") == (int.from_bytes(digest, "big") >> 11) / 2**53
    values = [stable_hash(f"k{i}") for i in range(20_000)]
    assert min(values) >= 0.0 and max(values) < 1.0
    assert abs(np.mean(values) - 0.5) < 0.01  # spread over [0, 1)


def test_a_unit_keeps_its_channel_in_another_process_with_another_hash_seed():
    keys = [f"user-{i}" for i in range(50)] + ["", "ünï-çødé"]
    code = "import sys, json; from banditstream.decider import stable_hash; print(json.dumps([stable_hash(k) for k in json.loads(sys.argv[1])]))"
    import json

    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(keys)], capture_output=True, text=True, env=env, timeout=60, check=True)
    assert json.loads(out.stdout) == [stable_hash(k) for k in keys]


# -- routing --------------------------------------------------------------------------------------


def test_share_zero_never_goes_to_the_canary():
    decider = _decider(0.0)
    decisions = [decider.decide(CONTEXT, ARMS, unit_key=f"user-{i}") for i in range(2000)]
    assert {(d.channel, d.policy_version) for d in decisions} == {("stable", "1.0.0")}
    assert {(e["channel"], e["policy_version"]) for e in decider._emitter.events} == {("stable", "1.0.0")}


def test_share_routes_that_share_of_units_and_every_repeat_of_a_unit_keeps_its_channel():
    n, share = 10_000, 0.3
    decider = _decider(share)
    first = {f"user-{i}": decider.decide(CONTEXT, ARMS, unit_key=f"user-{i}").channel for i in range(n)}
    canary = sum(channel == "canary" for channel in first.values())
    assert abs(canary - n * share) < 5 * math.sqrt(n * share * (1 - share))  # a binomial 5-sigma band
    again = {key: decider.decide(CONTEXT, ARMS, unit_key=key).channel for key in list(first)[::7] * 3}
    assert again == {key: first[key] for key in again}
    assert all((channel == "canary") == (stable_hash(key) < share) for key, channel in first.items())


def test_raising_the_share_only_adds_units_to_the_canary():
    keys = [f"session-{i}" for i in range(3000)]
    low = {k for k in keys if _decider(0.1).decide(CONTEXT, ARMS, unit_key=k).channel == "canary"}
    high = {k for k in keys if _decider(0.4).decide(CONTEXT, ARMS, unit_key=k).channel == "canary"}
    assert low < high


def test_without_a_unit_key_the_event_id_decides():
    decider = _decider(0.5)
    for i in range(500):
        event_id = f"evt-{i}"
        d = decider.decide(CONTEXT, ARMS, event_id)
        assert d.channel == ("canary" if stable_hash(event_id) < 0.5 else "stable")
    random_ids = [decider.decide(CONTEXT, ARMS) for _ in range(4000)]
    canary = sum(d.channel == "canary" for d in random_ids)
    assert abs(canary - 2000) < 5 * math.sqrt(4000 * 0.25)
    assert all((d.channel == "canary") == (stable_hash(d.event_id) < 0.5) for d in random_ids)


def test_a_canary_decision_uses_the_canary_policy_and_logs_its_version_and_channel():
    decider = _decider(0.5)
    keys = [f"user-{i}" for i in range(400)]
    decisions = {k: decider.decide(CONTEXT, ARMS, unit_key=k) for k in keys}
    events = {e["event_id"]: e for e in decider._emitter.events}
    canary = [d for d in decisions.values() if d.channel == "canary"]
    stable = [d for d in decisions.values() if d.channel == "stable"]
    assert canary and stable
    assert {d.policy_version for d in canary} == {"1.1.0"} and {d.policy_version for d in stable} == {"1.0.0"}
    assert sum(d.action == "haiku" for d in canary) > 0.7 * len(canary)  # the canary's policy chose
    assert sum(d.action == "llama-70b" for d in stable) > 0.7 * len(stable)
    for d in decisions.values():
        event = events[d.event_id]
        assert (event["channel"], event["policy_version"]) == (d.channel, d.policy_version)
        assert event["probabilities"] == list(d.probabilities) and abs(sum(d.probabilities) - 1) < 1e-12
    assert _counts(decider, "banditstream_sdk_decisions", "mode") == {
        ("live", "canary"): float(len(canary)), ("live", "stable"): float(len(stable))
    }


def test_without_a_canary_snapshot_or_with_the_stable_version_stable_decides_and_logs_stable():
    nothing = _decider(0.9, canary=None)
    same = _decider(0.9, canary=_active("1.0.0", best="haiku"))  # promoted: the canary is the stable
    for decider in (nothing, same):
        decisions = [decider.decide(CONTEXT, ARMS, unit_key=f"user-{i}") for i in range(300)]
        assert {(d.channel, d.policy_version) for d in decisions} == {("stable", "1.0.0")}
        assert {e["channel"] for e in decider._emitter.events} == {"stable"}
    assert same.canary_version == "1.0.0" and nothing.canary_version == ""


def test_a_canary_without_stable_still_decides_for_its_share():
    decider = _decider(0.5, stable=None)
    decisions = [decider.decide(CONTEXT, ARMS, unit_key=f"user-{i}") for i in range(200)]
    assert {(d.channel, d.policy_version, d.fallback) for d in decisions} == {
        ("canary", "1.1.0", None), ("stable", "", "no_snapshot")
    }


def test_modes_shadow_and_off_and_fallbacks_behave_the_same_on_the_canary():
    unit = next(f"user-{i}" for i in range(100) if stable_hash(f"user-{i}") < 0.5)
    shadow = _decider(0.5, mode="shadow")
    d = shadow.decide(CONTEXT, ARMS, unit_key=unit)
    assert (d.channel, d.policy_version, d.action, d.mode) == ("canary", "1.1.0", ARMS[0], "shadow")
    assert sum(shadow.decide(CONTEXT, ARMS, unit_key=unit).recommended == "haiku" for _ in range(50)) > 30

    off = _decider(0.5, mode="off")
    d = off.decide(CONTEXT, ARMS, unit_key=unit)
    assert (d.channel, d.policy_version, d.action, d.probabilities) == ("canary", "", ARMS[0], (1.0, 0.0, 0.0, 0.0))

    expired = _decider(0.5, canary=_active("1.1.0", best="haiku", expires_at=time.time() - 1))
    d = expired.decide(CONTEXT, ARMS, unit_key=unit)
    assert (d.channel, d.policy_version, d.fallback, d.action) == ("canary", "", "expired", ARMS[0])
    drifting = _decider(0.5, canary=_active("1.1.0", best="haiku", drift_flag=True))
    assert drifting.decide(CONTEXT, ARMS, unit_key=unit).fallback == "drift"
    assert _counts(expired, "banditstream_sdk_fallbacks", "reason") == {("expired", "canary"): 1.0}


def test_shields_apply_on_the_canary_too():
    decider = _decider(0.5)
    for _ in range(20):
        decider.observe("haiku", cost_usd=0.5)
    units = [f"user-{i}" for i in range(300) if stable_hash(f"user-{i}") < 0.5]
    decisions = [decider.decide(CONTEXT, ARMS, unit_key=u, max_cost=0.1) for u in units]
    assert {d.channel for d in decisions} == {"canary"}
    assert all(d.action != "haiku" and d.probabilities[ARMS.index("haiku")] == 0.0 for d in decisions)


def test_canary_share_defaults_to_the_domains_promotion_setting_and_is_validated():
    settings = SETTINGS.model_copy(update={"promotion": PromotionSettings(canary_share=0.25)})
    assert Decider("routing", settings=settings).canary_share == 0.25
    assert Decider("routing", settings=settings, canary_share=0.0).canary_share == 0.0
    for bad in (1.0, -0.1, math.nan, True, "0.2"):
        with pytest.raises(ValueError, match=r"canary_share must be a number in \[0, 1\)"):
            Decider("routing", settings=SETTINGS, canary_share=bad)
    decider = _decider(0.0)
    decider.canary_share = 0.99  # a ramp at run time
    assert sum(decider.decide(CONTEXT, ARMS).channel == "canary" for _ in range(200)) > 150
    with pytest.raises(TypeError, match="unit_key must be a str"):
        decider.decide(CONTEXT, ARMS, unit_key=42)


# -- the promotion settings -----------------------------------------------------------------------


def test_promotion_settings_default_to_no_canary_traffic():
    promotion = DomainSettings().promotion
    assert promotion == PromotionSettings(
        canary_share=0.0, min_events=1000, estimator="snips", level=0.95, margin=0.0,
        tolerated_regression=0.02, interval="gaussian", every_s=60.0,
    )  # fmt: skip
    for name in ESTIMATORS:
        assert PromotionSettings(estimator=name).estimator == name


def test_promotion_settings_load_from_the_environment():
    env = {
        "BANDITSTREAM_DOMAINS__ROUTING__PROMOTION__CANARY_SHARE": "0.1",
        "BANDITSTREAM_DOMAINS__ROUTING__PROMOTION__ESTIMATOR": "dr",
        "BANDITSTREAM_DOMAINS__ROUTING__PROMOTION__INTERVAL": "bootstrap",
        "BANDITSTREAM_DOMAINS__ROUTING__PROMOTION__MIN_EVENTS": "250",
    }
    promotion = load_settings(env=env).domains["routing"].promotion
    assert (promotion.canary_share, promotion.estimator, promotion.interval, promotion.min_events) == (0.1, "dr", "bootstrap", 250)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("canary_share", "1", "domains.r.promotion.canary_share: Input should be less than 1"),
        ("canary_share", "-0.5", "domains.r.promotion.canary_share: Input should be greater than or equal to 0"),
        ("min_events", "0", "domains.r.promotion.min_events: Input should be greater than or equal to 1"),
        ("min_events", "many", "domains.r.promotion.min_events"),
        ("estimator", "magic", "domains.r.promotion.estimator: must be one of dm, dr, dros, ips, on_policy, sndr, snips, switch_dr (got 'magic')"),
        ("level", "1.5", "domains.r.promotion.level: Input should be less than 1"),
        ("level", "0", "domains.r.promotion.level: Input should be greater than 0"),
        ("margin", "-0.1", "domains.r.promotion.margin: Input should be greater than or equal to 0"),
        ("margin", "inf", "domains.r.promotion.margin: Input should be a finite number"),
        ("tolerated_regression", "-1", "domains.r.promotion.tolerated_regression"),
        ("interval", "wilson", "domains.r.promotion.interval: Input should be 'gaussian' or 'bootstrap'"),
        ("every_s", "0", "domains.r.promotion.every_s: Input should be greater than 0"),
        ("cadence", "1", "domains.r.promotion.cadence: unknown field"),
    ],
)
def test_invalid_promotion_settings_give_one_line_naming_the_field(field, value, expected):
    name = f"BANDITSTREAM_DOMAINS__R__PROMOTION__{field.upper()}"
    with pytest.raises(ConfigError) as info:
        load_settings(env={name: value})
    message = str(info.value)
    assert expected in message and f"from {name}" in message
    assert "\n" not in message


def test_a_boolean_is_not_a_count_of_events():
    with pytest.raises(ConfigError, match=r"domains.r.promotion.min_events: must be an integer, not a boolean"):
        load_settings(env={}, overrides={"domains.r.promotion.min_events": True})
    with pytest.raises(ValidationError, match="estimator"):
        DomainSettings(promotion={"estimator": "ipw"})


# -- against a real signed repository -------------------------------------------------------------

REPO_ARMS = ["small", "large", "agent"]
REPO_SETTINGS = DomainSettings(policy="lin_ucb", params={"alpha": 0.1, "eps0": 0.03}, features={"dimension": 8, "normalize": False})


@pytest.fixture
def repo(tmp_path):
    generate_keys(tmp_path / "keys")
    keys, root = load_keys(tmp_path / "keys")
    publisher = Publisher(open_store(tmp_path / "snapshots"), keys, root, domains={"route": REPO_SETTINGS})

    def client(channel: str) -> SnapshotClient:  # one cache per channel: the cache holds one blob
        return SnapshotClient(
            tmp_path / "snapshots", tmp_path / f"cache-{channel}", tmp_path / "keys" / "root.json", domain="route", channel=channel
        )

    return publisher, client


def _policy_preferring(best: str, seed: int):
    policy = REPO_SETTINGS.make_policy(seed=seed)
    x = REPO_SETTINGS.encoder().context_vector({"numeric": {"load": 1.0}, "categorical": {}, "vector": []})
    arms = [REPO_ARMS[i % 3] for i in range(300)]
    policy.update_batch(np.tile(x, (300, 1)), arms, [1.0 if a == best else 0.0 for a in arms])
    return policy


def _until(predicate, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_the_refresh_thread_swaps_the_canary_in_and_follows_a_promotion(repo):
    publisher, client = repo
    stable = publisher.publish("route", _policy_preferring("large", 1), channels=("stable",)).version
    interval = 0.3
    with Decider(
        "route", repository=client("stable"), canary_repository=client("canary"), settings=REPO_SETTINGS,
        canary_share=0.5, refresh_interval_s=interval, seed=2,
    ) as decider:  # fmt: skip
        decider._emitter = _Captured()
        # The canary channel holds nothing yet: everyone decides with stable, and it is counted.
        decisions = [decider.decide({"load": 1.0}, REPO_ARMS, unit_key=f"u{i}") for i in range(100)]
        assert {(d.channel, d.policy_version) for d in decisions} == {("stable", stable)}
        assert _counts(decider, "banditstream_sdk_verification_failures", "kind").get(("not_found", "canary"), 0) >= 1

        canary = publisher.publish("route", _policy_preferring("agent", 2), channels=("canary",)).version
        assert canary != stable
        _until(lambda: decider.canary_version == canary, interval + 2.0, "the canary was not swapped in within one interval")
        decisions = {f"u{i}": decider.decide({"load": 1.0}, REPO_ARMS, unit_key=f"u{i}") for i in range(400)}
        routed = {k: d for k, d in decisions.items() if stable_hash(k) < 0.5}
        assert routed and {(d.channel, d.policy_version) for d in routed.values()} == {("canary", canary)}
        assert {(d.channel, d.policy_version) for k, d in decisions.items() if k not in routed} == {("stable", stable)}
        assert sum(d.action == "agent" for d in routed.values()) > 0.8 * len(routed)
        logged = {(e["channel"], e["policy_version"]) for e in decider._emitter.events}
        assert logged == {("stable", stable), ("canary", canary)}
        assert decider.policy_version == stable  # the stable snapshot is untouched

        publisher.promote("route")  # canary's head becomes stable's: one policy for everyone again
        _until(lambda: decider.policy_version == canary, interval + 2.0, "the promotion was not followed within one interval")
        decisions = [decider.decide({"load": 1.0}, REPO_ARMS, unit_key=f"u{i}") for i in range(200)]
        assert {(d.channel, d.policy_version) for d in decisions} == {("stable", canary)}


def test_a_canary_client_on_the_stable_channel_is_refused(repo):
    _, client = repo
    with pytest.raises(ValueError, match="canary_repository follows the 'stable' channel"):
        Decider("route", canary_repository=client("stable"), settings=REPO_SETTINGS)

"""A shadow policy as a candidate with no live traffic: the SDK logs the distribution it would
have drawn from beside every decision (in shadow mode, or from a shadow snapshot while another
policy acts), the join carries it into the update, and evaluation scores it on those rows."""

from __future__ import annotations

import time

import numpy as np
import pytest
from rich.console import Console

from banditstream.decider import ActivePolicy, Decider
from banditstream.evaluate import parse_candidates, results_table
from learner.domain import DomainSettings
from learner.evaluation import InvalidInputError, LoggedBandit, Logging, Recommended
from learner.evaluation.run import evaluate_candidates
from publisher.guards import GuardConfig
from publisher.publish import Publisher, PublisherConfig
from publisher.pull import SnapshotClient
from publisher.stores import DirectoryStore
from streams.evaluation_log import read_updates
from streams.topics import ensure_topics
from tests import join_helpers as H
from tests.test_canary_routing import _Captured
from tests.test_gate_worker import ARMS as ROUTE_ARMS
from tests.test_gate_worker import domain, trained, truth

ARMS = ["gpt-small", "gpt-large", "llama-70b", "haiku"]
# Thompson sampling: its probabilities are a seeded Monte Carlo estimate, so they are equal
# only when the draws behind them are.
SETTINGS = DomainSettings(policy="lin_ts", params={"v": 0.5, "eps0": 0.1}, features={"dimension": 16, "normalize": False})


def _active(version: str, best: str, **kwargs) -> ActivePolicy:
    """A snapshot whose policy learned that ``best`` earns 1 and the others 0 (more so for more tokens)."""
    policy, encoder = SETTINGS.make_policy(seed=0), SETTINGS.encoder()
    rng = np.random.default_rng(0)
    tokens = rng.uniform(0.0, 2.0, 400)
    rows = np.stack([encoder.context_vector({"numeric": {"tokens": t}, "categorical": {}, "vector": []}) for t in tokens])
    arms = [ARMS[i % len(ARMS)] for i in range(400)]
    policy.update_batch(rows, arms, [t if a == best else 0.0 for a, t in zip(arms, tokens)])
    return ActivePolicy(version, policy.scoring_view(), encoder, **kwargs)


STABLE = _active("1.0.0", best="llama-70b")
SHADOW = _active("2.0.0", best="haiku")


def _decider(active: ActivePolicy, *, shadow: ActivePolicy | None = None, **kwargs) -> Decider:
    decider = Decider("routing", settings=SETTINGS, seed=4, **kwargs)
    decider.use(active)
    if shadow is not None:
        decider.use(shadow, channel="shadow")
    decider._emitter = _Captured()
    decider.observe("gpt-large", cost_usd=5.0)  # over the budget of the shielded half of the calls
    return decider


def _calls(n: int = 200):
    """(context, event id, shields) for ``n`` decisions; every other one drops gpt-large."""
    rng = np.random.default_rng(11)
    return [({"tokens": float(rng.uniform(0, 2))}, f"e{i}", {"max_cost": 1.0} if i % 2 else {}) for i in range(n)]


# -- (a) the SDK logs the distribution ----------------------------------------------------------


def test_shadow_mode_logs_the_policys_whole_distribution_as_a_live_decider_on_it_would_draw_from():
    shadow, live = _decider(STABLE, mode="shadow"), _decider(STABLE, mode="live")

    lived = []
    for context, event_id, shields in _calls():
        s = shadow.decide(context, ARMS, event_id, **shields)
        d = live.decide(context, ARMS, event_id, **shields)
        lived.append(d)

        assert s.recommended_probabilities == d.probabilities  # bit-exact: same seed, same draws
        assert (s.recommended, s.recommended_version) == (d.action, "1.0.0")
        assert (s.action, s.probabilities) == (ARMS[0], (1.0, 0.0, 0.0, 0.0))  # the baseline acted
        if shields:
            assert s.recommended_probabilities[ARMS.index("gpt-large")] == 0.0
    logged = shadow._emitter.events
    assert [tuple(e["recommended_probabilities"]) for e in logged] == [d.probabilities for d in lived]
    assert {(e["mode"], e["recommended_version"]) for e in logged} == {("shadow", "1.0.0")}


def test_a_shadow_snapshot_logs_its_distribution_beside_live_decisions_and_leaves_them_unchanged():
    with_shadow = _decider(STABLE, shadow=SHADOW)
    without = _decider(STABLE)
    shadow_alone = _decider(SHADOW)  # the shadow snapshot deciding live, with the same seed

    for context, event_id, shields in _calls():
        d = with_shadow.decide(context, ARMS, event_id, **shields)
        plain = without.decide(context, ARMS, event_id, **shields)
        alone = shadow_alone.decide(context, ARMS, event_id, **shields)

        assert (d.action, d.probabilities, d.policy_version, d.recommended) == (
            plain.action, plain.probabilities, "1.0.0", None
        )  # fmt: skip
        assert d.recommended_probabilities == alone.probabilities  # bit-exact
        assert d.recommended_version == "2.0.0"
    events = with_shadow._emitter.events
    assert all(e["probabilities"] != e["recommended_probabilities"] for e in events)
    assert {(e["mode"], e["policy_version"], e["recommended_version"]) for e in events} == {("live", "1.0.0", "2.0.0")}
    assert [e["recommended_probabilities"] for e in without._emitter.events] == [[]] * len(events)
    assert with_shadow.shadow_version == "2.0.0" and without.shadow_version == ""


def test_a_shadow_snapshot_recommends_in_shadow_and_off_mode_too_and_takes_precedence():
    for mode in ("shadow", "off"):
        decider = _decider(STABLE, shadow=SHADOW, mode=mode)
        alone = _decider(SHADOW)
        for context, event_id, shields in _calls(20):
            d = decider.decide(context, ARMS, event_id, **shields)
            assert d.recommended_probabilities == alone.decide(context, ARMS, event_id, **shields).probabilities
            assert (d.action, d.recommended_version) == (ARMS[0], "2.0.0")
            assert (d.recommended is not None) == (mode == "shadow")  # the acting policy's pick, as before


def test_an_expired_or_drifting_shadow_recommends_nothing():
    for shadow in (_active("2.0.1", "haiku", expires_at=time.time() - 1), _active("2.0.2", "haiku", drift_flag=True)):
        d = _decider(STABLE, shadow=shadow).decide({"tokens": 1.0}, ARMS)
        assert (d.recommended_probabilities, d.recommended_version, d.policy_version) == ((), "", "1.0.0")


def test_the_refresh_thread_takes_the_shadow_from_its_own_source_and_counts_its_failures():
    class Source:
        def __init__(self, held):
            self.held = held

        def latest(self):
            if isinstance(self.held, Exception):
                raise self.held
            return self.held

    source = Source(SHADOW)
    with Decider("routing", Source(STABLE), settings=SETTINGS, shadow_repository=source, refresh_interval_s=0.05) as decider:
        assert (decider.policy_version, decider.shadow_version) == ("1.0.0", "2.0.0")  # the first refresh is synchronous
        assert decider.decide({"tokens": 1.0}, ARMS).recommended_version == "2.0.0"
        source.held = ConnectionError("unreachable")
        time.sleep(0.3)
        assert decider.shadow_version == "2.0.0"  # the last good one is kept
    samples = {
        (s.labels["channel"], s.labels.get("version") or s.labels.get("kind")): s.value
        for m in decider.metrics.registry.collect()
        if m.name in ("banditstream_sdk_snapshot_info", "banditstream_sdk_verification_failures")
        for s in m.samples if not s.name.endswith("_created")
    }  # fmt: skip
    assert samples[("shadow", "2.0.0")] == 1.0 and samples[("shadow", "connection_error")] >= 1
    with pytest.raises(ValueError, match="stable, canary, shadow"):
        decider.use(SHADOW, channel="candidate")


# -- (b) the candidate, on a log worked out by hand ---------------------------------------------


def _update(i: int, actions, probabilities, arm_index: int, reward: float, shadow=None, version: str = "") -> dict:
    return {
        "event_id": f"e{i}", "tenant": "default", "workspace": "main", "domain": "d", "actions": actions,
        "probabilities": probabilities, "arm_index": arm_index, "reward": reward, "features": [1.0, float(i)],
        "decision_time": i, "policy_version": "1.0.0", "mode": "live", "join_status": "rewarded",
        "recommended_probabilities": shadow or [], "recommended_version": version,
    }  # fmt: skip


HAND = [
    _update(1, ["a", "b"], [0.5, 0.5], 0, 1.0, [0.8, 0.2], "2.0.0"),   # w = 0.8 / 0.5 = 1.6
    _update(2, ["a", "b"], [0.25, 0.75], 1, 0.0, [0.4, 0.6], "2.0.0"),  # w = 0.6 / 0.75 = 0.8
    _update(3, ["a", "b"], [0.5, 0.5], 1, 1.0),                         # no recommendation
    _update(4, ["b", "a"], [0.2, 0.8], 0, 0.5, [1.0, 0.0], "2.1.0"),   # b acted: w = 1.0 / 0.2 = 5
    _update(5, ["a", "b"], [0.5, 0.5], 0, 0.0, [0.1, 0.9], "2.0.0"),   # w = 0.1 / 0.5 = 0.2
]


def test_the_logged_recommendation_lines_up_with_the_action_index_and_is_marked_per_row():
    log = LoggedBandit.from_updates(HAND)

    assert log.actions == ["a", "b"]
    assert log.has_recommendation.tolist() == [True, True, False, True, True]
    assert log.recommended_dist.tolist() == [[0.8, 0.2], [0.4, 0.6], [0.0, 0.0], [0.0, 1.0], [0.1, 0.9]]
    assert log.recommended_version.tolist() == ["2.0.0", "2.0.0", "", "2.1.0", "2.0.0"]
    kept = log.select(log.has_recommendation)
    assert (len(kept), kept.recommended_version.tolist()) == (4, ["2.0.0", "2.0.0", "2.1.0", "2.0.0"])


def test_the_shadow_candidate_gives_the_ips_and_snips_values_worked_out_by_hand_on_its_rows():
    log = LoggedBandit.from_updates(HAND)
    candidates = parse_candidates("shadow,shadow:2.0.0,logging", snapshots=None)
    assert [type(c) for c in candidates] == [Recommended, Recommended, Logging]

    run = evaluate_candidates(log, candidates, estimators=("ips", "snips"))
    by_name = {r.name: r for r in run.results}

    every, one = by_name["shadow"], by_name["shadow:2.0.0"]
    assert (every.rows, one.rows, by_name["logging"].rows, run.rows) == (4, 3, 5, 5)
    assert every.estimates["ips"].estimate == pytest.approx((1.6 * 1.0 + 0.8 * 0.0 + 5.0 * 0.5 + 0.2 * 0.0) / 4, abs=1e-12)
    assert every.estimates["snips"].estimate == pytest.approx(4.1 / (1.6 + 0.8 + 5.0 + 0.2), abs=1e-12)
    assert one.estimates["ips"].estimate == pytest.approx(1.6 / 3, abs=1e-12)
    assert one.estimates["snips"].estimate == pytest.approx(1.6 / (1.6 + 0.8 + 0.2), abs=1e-12)
    assert {e.n for e in every.estimates.values()} == {4} and {e.n for e in one.estimates.values()} == {3}
    assert {c["name"]: c["rows"] for c in run.to_dict()["candidates"]} == {"shadow": 4, "shadow:2.0.0": 3, "logging": 5}
    console = Console(record=True, width=200)
    console.print(results_table(run))
    assert "shadow (4 of 5 rows)" in console.export_text() and "logging (" not in console.export_text()


def test_a_shadow_version_no_row_recommends_is_refused_naming_those_that_do():
    log = LoggedBandit.from_updates(HAND)
    with pytest.raises(InvalidInputError, match=r"of snapshot 9\.9\.9 \(versions recommending: 2\.0\.0, 2\.1\.0\)"):
        evaluate_candidates(log, [Recommended("9.9.9")], estimators=("ips",))
    with pytest.raises(InvalidInputError, match="1 of 5 rows carry no recommendation of 'shadow'"):
        Recommended().action_dist(log)  # rows without one are never scored as zeros


# -- (c) end to end on the real broker ----------------------------------------------------------

def test_a_shadow_snapshot_is_rated_from_the_joined_log_as_the_snapshot_itself_and_above_the_logging_policy(
    kafka, topics, tmp_path, keys, root
):
    ensure_topics(kafka, topics)
    store = DirectoryStore(tmp_path / "snapshots")
    publisher = Publisher(store, keys, root, domains={"route": domain(promotion=None)},
                          config=PublisherConfig(guards=GuardConfig(min_samples=1)))
    stable = publisher.publish("route", trained(1.0, use_x1=False, seed=1), channels=("stable",))  # mostly c: ~0.28
    shadow = publisher.publish("route", trained(1.0, use_x1=True, seed=2), channels=("canary",))  # follows x1: ~0.49

    def client(channel: str, cache: str) -> SnapshotClient:
        return SnapshotClient(store, tmp_path / cache, root, domain="route", channel=channel)

    config = H.settings(kafka, topics, tmp_path / "state", domains={"route": domain(promotion=None).model_dump(mode="json")}).worker_config()
    rng = np.random.default_rng(7)
    n = 1500
    with H.JoinThread(config) as join:
        with Decider("route", client("stable", "cache-stable"), kafka=kafka, topics=topics, settings=domain(promotion=None), seed=3,
                     shadow_repository=client("canary", "cache-shadow"), spool_path=tmp_path / "spool") as sdk:
            assert (sdk.policy_version, sdk.shadow_version) == (stable.version, shadow.version)
            decided = set()
            for _ in range(n):
                x1 = float(rng.normal())
                d = sdk.decide({"numeric": {"bias": 1.0, "x1": x1}}, ROUTE_ARMS)
                sdk.reward(d.event_id, value=truth(d.action, x1) + float(rng.normal(0, 0.1)))
                decided.add(d.event_id)
            assert sdk.flush(30)
        serde = config.serde("update", topic=topics.updates)
        deadline = time.monotonic() + 120
        while True:
            updates, report = read_updates(kafka, topics.updates, serde)
            if {u["event_id"] for u in updates} >= decided:
                break
            assert time.monotonic() < deadline, f"{len(updates)} of {n} updates joined within 120 s"
            join.check()
            time.sleep(0.5)
    assert report.undecodable == 0

    log = LoggedBandit.from_updates(updates, domain="route")
    assert len(log) == n and log.has_recommendation.all()
    assert set(log.recommended_version) == {shadow.version} and set(log.policy_version) == {stable.version}
    policy = client("canary", "cache-evaluate").refresh().policy
    candidates = parse_candidates(f"shadow:{shadow.version},snapshot:canary,logging", snapshots=lambda _: (policy, shadow.version))
    scored = candidates[1].action_dist(log)
    np.testing.assert_allclose(log.recommended_dist, scored, rtol=0, atol=1e-12)  # the same distributions

    run = evaluate_candidates(log, candidates, estimators=("ips", "snips", "dr"))
    by_name = {r.name: r for r in run.results}
    logged, as_snapshot = by_name[f"shadow:{shadow.version}"], by_name[f"snapshot:{shadow.version}"]
    assert logged.rows == as_snapshot.rows == n
    for name in ("ips", "snips", "dr"):
        a, b = logged.estimates[name], as_snapshot.estimates[name]
        assert (a.estimate, a.lower, a.upper) == pytest.approx((b.estimate, b.lower, b.upper), abs=1e-12)
        assert a.lower > run.on_policy_value, (name, a, run.on_policy_value)  # excludes the logging policy's value
    assert [r.name for r in run.ranked("snips")][-1] == "logging"

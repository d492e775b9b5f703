"""The SDK's Decider: modes and switches, shields, fallbacks, seeded choices, hot swaps."""

from __future__ import annotations

import gc
import sys
import threading
import time

import numpy as np
import pytest

from banditstream.decider import ActivePolicy, Decider
from learner.domain import DomainSettings
from streams.errors import EmptyActions, FieldTooLarge, NonFiniteFeature, TooManyActions, WrongDimension

ARMS = ["gpt-small", "gpt-large", "llama-70b", "haiku"]
SETTINGS = DomainSettings(policy="lin_ucb", params={"alpha": 0.2, "eps0": 0.1}, features={"dimension": 16, "normalize": False})


def _active(version: str, best: str = "llama-70b", **kwargs) -> ActivePolicy:
    """A snapshot whose policy learned that ``best`` earns 1 and the others 0."""
    policy = SETTINGS.make_policy(seed=0)
    encoder = SETTINGS.encoder()
    x = encoder.context_vector({"numeric": {"tokens": 1.0}, "categorical": {}, "vector": []})
    rows = np.tile(x, (400, 1))
    arms = [ARMS[i % len(ARMS)] for i in range(400)]
    policy.update_batch(rows, arms, [1.0 if a == best else 0.0 for a in arms])
    return ActivePolicy(version, policy.scoring_view(), encoder, **kwargs)


def test_live_decisions_follow_the_snapshot_and_report_the_full_distribution():
    decider = Decider("routing", settings=SETTINGS, seed=1)
    decider.use(_active("1.0.1"))
    d = decider.decide({"tokens": 1.0}, ARMS)
    assert d.mode == "live" and d.policy_version == "1.0.1" and d.fallback is None
    assert abs(sum(d.probabilities) - 1.0) < 1e-12
    assert min(d.probabilities) >= 0.1 / len(ARMS) - 1e-12  # the exploration floor
    assert d.probabilities[ARMS.index("llama-70b")] == max(d.probabilities)
    picks = [decider.decide({"tokens": 1.0}, ARMS).action for _ in range(300)]
    assert picks.count("llama-70b") > 200


def test_same_seed_same_choices():
    def run(seed):
        decider = Decider("routing", settings=SETTINGS, seed=seed)
        decider.use(_active("1"))
        return [decider.decide({"tokens": 1.0}, ARMS, event_id=f"e{i}").action for i in range(200)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_no_snapshot_expired_or_drifting_falls_back_to_the_baseline_and_counts_why():
    decider = Decider("routing", settings=SETTINGS, seed=1)
    assert decider.decide({"tokens": 1.0}, ARMS).fallback == "no_snapshot"
    decider.use(_active("2", expires_at=time.time() - 1))
    d = decider.decide({"tokens": 1.0}, ARMS)
    assert (d.fallback, d.action, d.probabilities[0], d.policy_version) == ("expired", ARMS[0], 1.0, "")
    decider.use(_active("3", drift_flag=True))
    assert decider.decide({"tokens": 1.0}, ARMS).fallback == "drift"
    counts = {
        s.labels["reason"]: s.value
        for m in decider.metrics.registry.collect() if m.name == "banditstream_sdk_fallbacks"
        for s in m.samples if s.name.endswith("_total")
    }  # fmt: skip
    assert counts == {"no_snapshot": 1.0, "expired": 1.0, "drift": 1.0}


class _Queue:
    """A snapshot source that hands out the snapshots given, one per refresh."""

    def __init__(self, *snapshots: ActivePolicy) -> None:
        self.snapshots = list(snapshots)

    def latest(self) -> ActivePolicy | None:
        return self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]


def test_a_drift_flagged_snapshot_is_declined_while_a_good_one_is_held(caplog):
    good, flagged = _active("1.0.3"), _active("1.0.4", best="haiku", drift_flag=True, drift_reason="feature 'c:tokens' moved")
    decider = Decider("routing", settings=SETTINGS, seed=1, repository=_Queue(good, flagged))  # refreshes once
    assert decider.policy_version == "1.0.3"
    with caplog.at_level("WARNING"):
        assert not decider.refresh() and not decider.refresh()
    d = decider.decide({"tokens": 1.0}, ARMS)
    # the last good snapshot keeps deciding, exploring as it did: no baseline, no fallback
    assert (d.policy_version, d.fallback) == ("1.0.3", None) and d.probabilities[ARMS.index("llama-70b")] == max(d.probabilities)
    assert caplog.text.count("1.0.4 of routing is flagged for drift (feature 'c:tokens' moved): keeping 1.0.3") == 1
    # with nothing good held, a flagged snapshot is used only as far as the baseline goes
    alone = Decider("routing", settings=SETTINGS, seed=1, repository=_Queue(flagged))
    assert alone.policy_version == "1.0.4" and alone.decide({"tokens": 1.0}, ARMS).fallback == "drift"


def test_modes_off_and_shadow_act_on_the_baseline():
    off = Decider("routing", settings=SETTINGS, mode="off")
    off.use(_active("1"))
    d = off.decide({"tokens": 1.0}, ARMS)
    assert (d.action, d.mode, d.probabilities) == (ARMS[0], "off", (1.0, 0.0, 0.0, 0.0))

    shadow = Decider("routing", settings=SETTINGS, mode="shadow", seed=2)
    shadow.use(_active("1"))
    recs = [shadow.decide({"tokens": 1.0}, ARMS) for _ in range(50)]
    assert all(r.action == ARMS[0] and r.mode == "shadow" for r in recs)
    assert sum(r.recommended == "llama-70b" for r in recs) > 30  # the policy's pick is logged


@pytest.mark.parametrize(
    ("env", "mode", "expected"),
    [
        ({"ENABLE_RL_GLOBAL": "false"}, "live", "off"),
        ({"ENABLE_RL_ROUTING_V2": "0"}, "live", "off"),
        ({"ENABLE_RL_ROUTING_V2": "shadow"}, "live", "shadow"),
        ({"ENABLE_RL_ROUTING_V2": "true"}, "off", "live"),
        ({"ENABLE_RL_GLOBAL": "true"}, "shadow", "shadow"),
        ({}, None, "live"),
    ],
)
def test_global_and_per_domain_switches(env, mode, expected):
    decider = Decider("routing-v2", settings=SETTINGS, mode=mode, env=env)
    assert decider.mode == expected


def test_shields_drop_candidates_over_budget_before_choosing():
    decider = Decider("routing", settings=SETTINGS, seed=3)
    decider.use(_active("1", best="llama-70b"))
    for _ in range(50):
        decider.observe("llama-70b", cost_usd=0.05, latency_ms=900)
        decider.observe("gpt-large", cost_usd=0.002, latency_ms=4000)
        decider.observe("gpt-small", cost_usd=0.001, latency_ms=300)
    picks = {decider.decide({"tokens": 1.0}, ARMS, max_cost=0.01, max_latency_ms=2000).action for _ in range(200)}
    assert picks <= {"gpt-small", "haiku"} and "llama-70b" not in picks
    d = decider.decide({"tokens": 1.0}, ARMS, max_cost=0.01, max_latency_ms=2000)
    assert d.probabilities[ARMS.index("llama-70b")] == 0.0 and d.probabilities[ARMS.index("gpt-large")] == 0.0


def test_shields_learn_costs_from_rewards():
    decider = Decider("routing", settings=SETTINGS, seed=3)
    decider.use(_active("1", best="llama-70b"))
    for i in range(30):
        d = decider.decide({"tokens": 1.0}, ARMS, event_id=f"e{i}")
        decider.reward(d.event_id, {"success": 1.0, "cost_usd": 0.5 if d.action == "llama-70b" else 0.001})
    assert all(decider.decide({"tokens": 1.0}, ARMS, max_cost=0.1).action != "llama-70b" for _ in range(100))


def test_bad_input_is_refused_with_the_field_named():
    decider = Decider("routing", settings=DomainSettings(features={"dimension": 16, "vector_dim": 3}))
    with pytest.raises(NonFiniteFeature, match=r"context.numeric\['tokens'\]"):
        decider.decide({"tokens": float("nan")}, ARMS)
    with pytest.raises(WrongDimension, match="context.vector"):
        decider.decide({"embedding": [0.1, 0.2]}, ARMS)
    with pytest.raises(EmptyActions):
        decider.decide({"tokens": 1.0}, [])


def test_input_over_the_size_limits_is_refused_and_nothing_is_emitted(tmp_path):
    from streams.validation import ValidationLimits

    limits = ValidationLimits(max_id_bytes=64, max_string_bytes=100, max_actions=5, max_features=8)
    decider = Decider(
        "routing", kafka="127.0.0.1:1", settings=SETTINGS, limits=limits, spool_path=tmp_path / "spool", seed=1
    )  # an unreachable broker: what decide emits waits in the spool
    try:
        with pytest.raises(FieldTooLarge, match=r"^actions\[1\]\.id is 65 bytes, the limit is 64 \(limits\.max_id_bytes\)"):
            decider.decide({"tokens": 1.0}, ["a", "b" * 65])
        with pytest.raises(FieldTooLarge, match=r"^actions\[0\]\.id is 66 bytes"):
            decider.decide({"tokens": 1.0}, [{"id": "é" * 33, "features": {"cost": 1.0}}])
        with pytest.raises(FieldTooLarge, match=r"^event_id is 65 bytes"):
            decider.decide({"tokens": 1.0}, ARMS, event_id="e" * 65)
        with pytest.raises(TooManyActions, match=r"^len\(actions\) is 6"):
            decider.decide({"tokens": 1.0}, [f"a{i}" for i in range(6)])
        with pytest.raises(FieldTooLarge, match=r"^context.categorical\['task'\] is 101 bytes, the limit is 100"):
            decider.decide({"tokens": 1.0, "task": "t" * 101}, ARMS)
        with pytest.raises(FieldTooLarge, match=r"^len\(context.numeric\) \+ len\(context.categorical\) is 9"):
            decider.decide({f"f{i}": 1.0 for i in range(9)}, ARMS)
        with pytest.raises(FieldTooLarge, match=r"^actions\[1\].features.numeric key 'nnn"):
            decider.decide({"tokens": 1.0}, [{"id": "a"}, {"id": "b", "features": {"n" * 101: 1.0}}])
        with pytest.raises(FieldTooLarge, match=r"^signals key 'sss"):
            decider.reward("e1", {"s" * 101: 1.0})
        stats = decider._emitter.stats
        assert stats.sent + stats.spooled == 0  # nothing refused was emitted

        decider.decide({"tokens": 1.0, "task": "t" * 100}, ["a", "b" * 64], event_id="e" * 64)  # at the limits
        assert stats.sent + stats.spooled == 1
    finally:
        decider.close(timeout=0.5)


class _SlowSource:
    """A repository whose verification takes as long as the test wants."""

    def __init__(self, active):
        self.active = active
        self.release = threading.Event()
        self.entered = threading.Event()

    def latest(self):
        self.entered.set()
        self.release.wait(30)
        return self.active


def test_decide_never_waits_for_a_refresh_in_progress():
    decider = Decider("routing", settings=SETTINGS, seed=4)
    decider.use(_active("1.0.0"))
    source = _SlowSource(_active("1.0.1", best="haiku"))
    decider._repository = source  # a refresh now stalls inside pull + verify
    refresher = threading.Thread(target=decider.refresh)
    refresher.start()
    assert source.entered.wait(5)
    durations = []
    for _ in range(2000):  # while the refresh is stuck mid-way
        t0 = time.perf_counter_ns()
        assert decider.decide({"tokens": 1.0}, ARMS).policy_version == "1.0.0"
        durations.append(time.perf_counter_ns() - t0)
    assert np.median(durations) < 1_000_000
    source.release.set()
    refresher.join(10)
    assert decider.decide({"tokens": 1.0}, ARMS).policy_version == "1.0.1"


def test_hot_swap_under_hammering_threads_has_no_error_and_no_pause():
    """40 swaps while three threads decide: no error, every call sees one whole snapshot,
    and the calls that start right after a swap are fast.

    Calls are chosen by their start (within 2 ms after a swap), not by whether they span one:
    a slow call is more likely to span any instant, whatever its cause. A call's wall time
    also holds what the OS and the hypervisor do to the thread (on a loaded 2-core VM, whole
    4 ms slices), which no library can prevent; so the bounds are on their 90th percentile
    (1 ms) and median (0.2 ms).
    """
    previous = sys.getswitchinterval()
    gc.disable()  # the collector's pauses are the interpreter's, not the swap's
    sys.setswitchinterval(1e-4)  # bound how long a thread can wait for the GIL
    decider = Decider("routing", settings=SETTINGS, seed=4)
    snapshots = [_active(f"1.0.{i}", best=ARMS[i % len(ARMS)]) for i in range(40)]
    decider.use(snapshots[0])
    stop = threading.Event()
    errors: list[BaseException] = []
    calls: list[list[tuple[int, int, str, str]]] = [[] for _ in range(3)]

    def hammer(log):
        try:
            while not stop.is_set():
                t0 = time.perf_counter_ns()
                d = decider.decide({"tokens": 1.0}, ARMS)
                log.append((t0, time.perf_counter_ns(), d.policy_version, d.action))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(log,)) for log in calls]
    try:
        for t in threads:
            t.start()
        swaps = []
        for snap in snapshots[1:]:
            time.sleep(0.01)
            swaps.append(time.perf_counter_ns())
            decider.use(snap)
        time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
        sys.setswitchinterval(previous)
        gc.enable()
    assert errors == []
    everything = [c for log in calls for c in log]
    assert len(everything) > 1000
    after = [end - start for start, end, *_ in everything if any(s <= start <= s + 2_000_000 for s in swaps)]
    assert len(after) >= 20, "calls must start right after the swaps"
    # 0.4-1.3% of these calls, and as many elsewhere, took over 1 ms in trials here: the VM's
    # and the GIL's, not the swap's
    assert np.percentile(after, 90) < 1_000_000, f"p90 {np.percentile(after, 90) / 1e6:.2f} ms over {len(after)} calls"
    assert np.median(after) < 200_000, f"median {np.median(after) / 1e6:.2f} ms over {len(after)} calls"
    assert {v for _, _, v, _ in everything} == {s.version for s in snapshots}  # every snapshot was used


def test_the_spool_overflow_policy_is_the_callers_choice(tmp_path):
    from banditstream.decider import Decider

    decider = Decider("routing", kafka="127.0.0.1:1", spool_path=tmp_path / "d.spool", spool_max_bytes=4096,
                      spool_overflow="drop_oldest")
    try:
        assert decider._emitter.spool.overflow == "drop_oldest"
    finally:
        decider.close(timeout=0.5)
    with pytest.raises(ValueError, match="overflow"):
        Decider("routing", kafka="127.0.0.1:1", spool_path=tmp_path / "e.spool", spool_overflow="drop_all")


def test_without_a_canary_every_decision_is_stable_and_counted_by_mode_and_channel():
    decider = Decider("routing", settings=SETTINGS, seed=1, canary_share=0.5)  # a share, but no canary held
    decider.use(_active("1.0.1"))
    decisions = [decider.decide({"tokens": 1.0}, ARMS, unit_key=f"user-{i}") for i in range(50)]
    assert {(d.channel, d.policy_version) for d in decisions} == {("stable", "1.0.1")}
    assert decider.canary_version == ""
    counts = {
        (s.labels["mode"], s.labels["channel"]): s.value
        for m in decider.metrics.registry.collect() if m.name == "banditstream_sdk_decisions"
        for s in m.samples if s.name.endswith("_total") and s.value
    }  # fmt: skip
    assert counts == {("live", "stable"): 50.0}
    info = {
        (s.labels["channel"], s.labels["version"])
        for m in decider.metrics.registry.collect() if m.name == "banditstream_sdk_snapshot_info"
        for s in m.samples if s.value
    }  # fmt: skip
    assert info == {("stable", "1.0.1")}


def test_the_canary_swaps_atomically_and_is_named_in_the_snapshot_metric():
    decider = Decider("routing", settings=SETTINGS, seed=1, canary_share=0.5)
    decider.use(_active("1.0.1"))
    decider.use(_active("1.1.0", best="haiku"), channel="canary")
    decider.use(_active("1.1.1", best="haiku"), channel="canary")
    info = {
        (s.labels["channel"], s.labels["version"])
        for m in decider.metrics.registry.collect() if m.name == "banditstream_sdk_snapshot_info"
        for s in m.samples if s.value
    }  # fmt: skip
    assert info == {("stable", "1.0.1"), ("canary", "1.1.1")}
    assert (decider.policy_version, decider.canary_version) == ("1.0.1", "1.1.1")
    with pytest.raises(ValueError, match="channel must be one of stable, canary"):
        decider.use(_active("2"), channel="beta")


def test_decide_never_waits_for_a_canary_refresh_in_progress():
    decider = Decider("routing", settings=SETTINGS, seed=4, canary_share=0.5)
    decider.use(_active("1.0.0"))
    decider.use(_active("1.1.0", best="haiku"), channel="canary")
    source = _SlowSource(_active("1.1.1", best="gpt-small"))
    decider._canary_repository = source  # a canary refresh now stalls inside pull + verify
    refresher = threading.Thread(target=decider.refresh)
    refresher.start()
    assert source.entered.wait(5)
    durations = []
    for i in range(2000):
        t0 = time.perf_counter_ns()
        d = decider.decide({"tokens": 1.0}, ARMS, unit_key=f"user-{i}")
        durations.append(time.perf_counter_ns() - t0)
        assert d.policy_version == ("1.1.0" if d.channel == "canary" else "1.0.0")
    assert np.median(durations) < 1_000_000
    source.release.set()
    refresher.join(10)
    assert decider.canary_version == "1.1.1" and decider.policy_version == "1.0.0"

"""The join worker against the real broker: decisions + rewards in, one UpdateEvent each out.

Traffic is produced live (timestamps are the wall clock, as services would stamp them) at
a pace the worker keeps up with, so which rewards are on time is decided by the test's
construction, not by scheduling: on-time rewards come at most 0.8 s after their decision
(window 3 s), late ones carry a timestamp past the window or come after their decision's
UpdateEvent was read back.
"""

from __future__ import annotations

import json
import logging
import math
import random
import signal
import threading
import time
import urllib.request
from collections import Counter, defaultdict

import pytest
from confluent_kafka import Consumer, TopicPartition

from banditstream.config import Settings
from learner.domain import DomainSettings
from learner.features import FeatureEncoder
from streams.client import EventProducer
from streams.join import MAX_DEAD_LETTER_VALUE, JoinOptions
from streams.serde import AvroSerde
from streams.topics import ensure_topics
from tests import join_helpers as H

WINDOW_S = 3.0


def _domains(window_s: float = WINDOW_S, **changes) -> dict:
    domains = {name: {**d, "reward": {**d["reward"], "window_s": window_s}} for name, d in H.DOMAINS.items()}
    for name, features in changes.items():
        domains[name] = {**domains[name], "features": {**domains[name]["features"], **features}}
    return domains


def _metric(port: int, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + ("{" if labels else "")) and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _deadletters(kafka, topics, expect: int, check=None) -> list[dict]:
    return [record for _, record in H.read_topic(kafka, topics.deadletter, "deadletter", expect=expect, idle_s=2.0,
                                                 timeout_s=60, check=check)]


class Workload:
    """Live traffic over several domains: rewards for a subset (several per decision, some
    duplicated, some before their decision), late rewards, duplicated and shadow decisions."""

    def __init__(self, kafka, topics, n: int, *, seed: int = 11, rate: float = 2000.0):
        self.kafka, self.topics, self.n, self.rate = kafka, topics, n, rate
        self.rng = random.Random(seed)
        self.sender = H.Sender(kafka, topics)
        self.decisions: dict[str, dict] = {}
        self.on_time: dict[str, dict[str, dict]] = defaultdict(dict)  # event_id -> reward_id -> reward
        self.late: set[tuple[str, str]] = set()
        self.early: set[str] = set()
        self.error: BaseException | None = None

    def run_in_thread(self) -> threading.Thread:
        """:meth:`run` in a thread; its error, if any, is kept in :attr:`error`."""

        def target():
            try:
                self.run()
            except BaseException as exc:
                self.error = exc

        thread = threading.Thread(target=target, name="workload")
        thread.start()
        return thread

    def run(self) -> None:
        rng, domains = self.rng, list(H.DOMAINS)
        held: list[tuple[float, dict]] = []  # decisions whose rewards go first
        start = time.monotonic()
        for i in range(self.n):
            # pace: i decisions by now
            ahead = i / self.rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
            now = H.now_ms()
            domain = domains[i % len(domains)]
            event_id = f"{domain}-{i:06d}"
            mode = "shadow" if i % 17 == 0 else ("off" if i % 53 == 0 else "live")
            d = H.decision(event_id, domain, rng, now, mode=mode)
            self.decisions[event_id] = d
            kind = rng.random()
            rewards = []
            if kind < 0.55:  # rewarded: 1-3 rewards within the window
                for j in range(rng.randint(1, 3)):
                    rewards.append(H.reward(event_id, f"{event_id}-r{j}", domain, rng, now + rng.randint(20, 800)))
            early = 0.55 <= kind < 0.60
            if early:
                rewards = [H.reward(event_id, f"{event_id}-e0", domain, rng, now + 100)]
            if early:
                self.early.add(event_id)
                for r in rewards:
                    self.sender.reward(r)
                    self.on_time[event_id][r["reward_id"]] = r
                held.append((time.monotonic() + 0.5, d))
            else:
                self.sender.decision(d)
                if i % 97 == 0:
                    self.sender.decision(d)  # a duplicate decision
                for r in rewards:
                    self.sender.reward(r)
                    self.on_time[event_id][r["reward_id"]] = r
                    if rng.random() < 0.1:
                        self.sender.reward(r)  # a duplicate reward
                if 0.60 <= kind < 0.63:  # stamped after the window closed
                    late = H.reward(event_id, f"{event_id}-late", domain, rng, now + int(WINDOW_S * 1000) + 1000)
                    self.sender.reward(late)
                    self.late.add((event_id, late["reward_id"]))
            while held and held[0][0] <= time.monotonic():
                self.sender.decision(held.pop(0)[1])
        for _, d in held:
            self.sender.decision(d)
        self.sender.flush()

    def send_after_join(self, event_ids: list[str]) -> None:
        """Rewards for decisions already emitted: timestamps inside the window, but too late."""
        for event_id in event_ids:
            d = self.decisions[event_id]
            late = H.reward(event_id, f"{event_id}-after", d["domain"], self.rng, d["timestamp"] + 500)
            self.sender.reward(late)
            self.late.add((event_id, late["reward_id"]))
        self.sender.flush()

    def expected(self, event_id: str) -> dict:
        d = self.decisions[event_id]
        engine = DomainSettings.model_validate(_domains()[d["domain"]]).reward_engine()
        rewards = list(self.on_time.get(event_id, {}).values())
        reward, signals, count = engine.aggregate(rewards)
        return {"reward": reward, "signals": signals, "reward_count": count,
                "join_status": "rewarded" if rewards else "default",
                "reward_time": max((r["timestamp"] for r in rewards), default=None)}


def _assert_every_decision_joined_right(kafka, topics, work: "Workload", updates) -> None:
    """None lost (duplicates after a restart or takeover are removed by event_id), and the
    latest update of each decision carries the aggregate of its on-time rewards."""
    counts = H.by_event_id(updates)
    missing = sorted(set(work.decisions) - set(counts))
    assert not missing, _explain(kafka, topics, work, updates, missing)
    latest = {u["event_id"]: u for _, u in updates}
    wrong = [event_id for event_id, update in latest.items()
             if update["reward_count"] != work.expected(event_id)["reward_count"]
             or not math.isclose(update["reward"], work.expected(event_id)["reward"], abs_tol=1e-9)]
    assert not wrong, _explain(kafka, topics, work, updates, wrong)


def _explain(kafka, topics, work: "Workload", updates, wrong: list[str]) -> str:
    """Why some decisions were joined wrong: their updates, dead letters and source records."""
    reward_serde = AvroSerde("reward", framing="single_object")
    dead = _deadletters(kafka, topics, expect=1)
    why = {reward_serde.decode(r["value"])["event_id"]: (r["reason"], r["message"][-60:])
           for r in dead if r["source_topic"] == topics.rewards}
    every = defaultdict(list)
    for _, u in updates:
        every[u["event_id"]].append((u["join_status"], u["reward_count"]))
    where: dict[str, list] = {}
    for topic in (topics.decisions, topics.rewards):
        consumer = Consumer(kafka.consumer_config(f"explain-{topic}-{time.monotonic_ns()}"))
        consumer.subscribe([topic])
        end = time.monotonic() + 10
        while time.monotonic() < end:
            for m in consumer.consume(5000, 0.5):
                if m.error() is None and m.key() and m.key().decode() in wrong[:8]:
                    where.setdefault(m.key().decode(), []).append((topic, m.partition(), m.offset(), m.timestamp()[1]))
        consumer.close()
    cases = [(e, e in work.early, why.get(e), every[e], work.expected(e)["reward_count"], where.get(e)) for e in wrong[:8]]
    return (f"{len(wrong)} decisions joined wrong or not at all, e.g. (event_id, early, dead letter, updates, "
            f"rewards expected, records) {cases}; dead letters {Counter(r['reason'] for r in dead)}")


def test_every_decision_yields_exactly_one_update_with_the_right_aggregate(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    port = H.free_port()
    config = H.settings(kafka, topics, tmp_path / "state", domains=_domains(), metrics_port=port).worker_config()
    work = Workload(kafka, topics, 20_000)
    with H.JoinThread(config) as worker:
        work.run()
        updates = H.read_topic(kafka, topics.updates, "update", until=H.every_event(work.decisions), idle_s=2,
                               timeout_s=240, check=worker.check)
        work.send_after_join(sorted(work.decisions)[:300])
        dead = _deadletters(kafka, topics, expect=len(work.late), check=worker.check)
        joins = {s: _metric(port, "banditstream_joins_total", f'status="{s}"') for s in ("rewarded", "default")}
        late_metric = _metric(port, "banditstream_late_rewards_total")
        duplicate_metric = _metric(port, "banditstream_duplicates_total")
        lag_text = _lag_once_read(port, topics, worker)

    counts = H.by_event_id(updates)
    assert set(counts) == set(work.decisions)
    assert max(counts.values()) == 1, [e for e, c in counts.items() if c > 1][:5]

    miscounted = [(u["event_id"], u["event_id"] in work.early, u["reward_count"], work.expected(u["event_id"])["reward_count"])
                  for _, u in updates if u["reward_count"] != work.expected(u["event_id"])["reward_count"]]
    assert not miscounted, (len(miscounted), miscounted[:10], Counter(r["reason"] for r in dead))
    encoders = {name: FeatureEncoder(DomainSettings.model_validate(d).features) for name, d in _domains().items()}
    statuses = Counter()
    for key, update in updates:
        d = work.decisions[update["event_id"]]
        want = work.expected(update["event_id"])
        statuses[update["join_status"]] += 1
        assert update["join_status"] == want["join_status"], update["event_id"]
        assert update["reward_count"] == want["reward_count"], update["event_id"]
        assert math.isclose(update["reward"], want["reward"], rel_tol=0, abs_tol=1e-9), update["event_id"]
        assert update["signals"] == pytest.approx(want["signals"], abs=1e-12)
        assert update["reward_time"] == want["reward_time"]
        assert update["decision_time"] == d["timestamp"]
        assert update["mode"] == d["mode"]
        chosen = d["chosen"]
        assert (update["arm"], update["arm_index"]) == (d["actions"][chosen]["id"], chosen)
        assert update["probability"] == d["probabilities"][chosen]
        assert update["actions"] == [a["id"] for a in d["actions"]]
        assert update["policy_version"] == "1.2.3"
        settings = DomainSettings.model_validate(_domains()[d["domain"]])
        assert update["feature_hash"] == settings.features.config_hash()
        assert len(update["features"]) == settings.features.dimension and update["features"][0] == 1.0
        if not settings.features.normalize:  # normalised features depend on the partition's history
            assert update["features"] == encoders[d["domain"]].acted_matrix([d])[0].tolist()
        shared = d["domain"] == "ranker"
        if shared:  # every candidate's row, for evaluating shared policies; the acted one among them
            rows = update["candidate_features"]
            assert len(rows) == len(d["actions"]) and rows[chosen] == update["features"]
            if not settings.features.normalize:
                assert rows == encoders[d["domain"]].action_matrix(d["context"], d["actions"]).tolist()
        else:
            assert update["candidate_features"] == []
        assert key.decode() == (f"default/main/{d['domain']}" if shared else f"default/main/{d['domain']}/{update['arm']}")
    assert statuses["rewarded"] > 8_000 and statuses["default"] > 6_000  # of 20,000: about 60 % and 40 %
    assert sum(1 for _, u in updates if u["mode"] == "shadow") > 800  # one in 17

    late = {(r["source_topic"], r["reason"]) for r in dead}
    assert late == {(topics.rewards, "late_reward")}
    reward_serde = AvroSerde("reward", framing="single_object")
    got_late = Counter((e["event_id"], e["reward_id"]) for e in (reward_serde.decode(r["value"]) for r in dead))
    assert set(got_late) == work.late and max(got_late.values()) == 1
    assert joins == {"rewarded": statuses["rewarded"], "default": statuses["default"]}
    assert late_metric == len(work.late)
    assert duplicate_metric > 0
    assert lag_text is None, lag_text


def _lag_once_read(port: int, topics, worker, timeout_s: float = 15.0) -> str | None:
    """Wait until the join reports every source partition's lag, and all of it 0 (everything
    sent was read); None then, else the lag lines it last reported."""
    want = {(topic, str(p)) for topic in (topics.decisions, topics.rewards) for p in range(topics.partitions)}
    deadline = time.monotonic() + timeout_s
    while True:
        worker.check()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        lines = [line for line in text.splitlines() if line.startswith("banditstream_consumer_lag{")]
        zero = {(line.split('topic="')[1].split('"')[0], line.split('partition="')[1].split('"')[0])
                for line in lines if float(line.rsplit(" ", 1)[1]) == 0.0}
        if want <= zero:
            return None
        if time.monotonic() > deadline:
            return "\n".join(lines) or "no banditstream_consumer_lag reported"
        time.sleep(0.5)


class _TransactionalSender(H.Sender):
    """Sends in transactions of ``every`` events: each commit leaves a control record in every
    partition it wrote, an offset no reader is handed (a hole in the log)."""

    def __init__(self, kafka, topics, every: int):
        super().__init__(kafka, topics)
        self.producer = EventProducer(kafka, **{"transactional.id": f"tx-{topics.decisions}", "message.max.bytes": 4_000_000})
        self.transactions = self.producer._producer
        self.transactions.init_transactions(30)
        self.transactions.begin_transaction()
        self.every, self.sent, self.commits = every, 0, 0

    def decision(self, record: dict) -> None:
        super().decision(record)
        self._sent()

    def reward(self, record: dict) -> None:
        super().reward(record)
        self._sent()

    def _sent(self) -> None:
        self.sent += 1
        if self.sent % self.every == 0:
            self.flush()
            self.transactions.begin_transaction()

    def flush(self) -> None:
        self.transactions.commit_transaction(60)
        self.commits += 1


def test_holes_a_transactional_producer_leaves_in_the_sources_are_read_again_then_taken(kafka, topics, tmp_path):
    """Decisions and rewards sent in transactions: the readers meet a gap after each commit,
    read it again for the profile's ``gap_confirm_s``, then take it as a hole. Every decision
    is joined with its on-time rewards, none waits for an offset that never comes."""
    ensure_topics(kafka, topics)
    config = H.settings(kafka, topics, tmp_path / "state", domains=_domains()).worker_config()
    work = Workload(kafka, topics, 1_500, seed=3, rate=1500.0)
    work.sender = _TransactionalSender(kafka, topics, every=800)
    with H.JoinThread(config) as worker:
        work.run()  # (its last flush commits the last transaction)
        updates = H.read_topic(kafka, topics.updates, "update", until=H.every_event(work.decisions), idle_s=2,
                               timeout_s=180, check=worker.check)
    assert work.sender.commits >= 3
    _assert_every_decision_joined_right(kafka, topics, work, updates)
    assert max(H.by_event_id(updates).values()) == 1


def test_a_partition_with_more_open_entries_than_its_cache_spills_them_says_so_once_and_joins_right(
    kafka, topics, tmp_path, caplog
):
    """``join.entry_cache`` 40 against ~1,000 decisions/s: the oldest open entries are written
    and read back. The worker counts them per partition, warns once per partition naming the
    knob, and every decision is still joined with its on-time rewards, once."""
    ensure_topics(kafka, topics)
    port = H.free_port()
    config = H.settings(kafka, topics, tmp_path / "state", domains=_domains(), metrics_port=port,
                        join={"entry_cache": 40}).worker_config()
    work = Workload(kafka, topics, 3_000, seed=7, rate=1000.0)
    with caplog.at_level(logging.WARNING, logger="banditstream.join"), H.JoinThread(config) as worker:
        work.run()
        updates = H.read_topic(kafka, topics.updates, "update", until=H.every_event(work.decisions), idle_s=2,
                               timeout_s=180, check=worker.check)
        spilled = {p: _metric(port, "banditstream_join_spilled_entries_total", f'partition="{p}"')
                   for p in range(topics.partitions)}
    _assert_every_decision_joined_right(kafka, topics, work, updates)
    assert max(H.by_event_id(updates).values()) == 1
    assert all(n > 0 for n in spilled.values()), spilled
    warnings = [r.getMessage() for r in caplog.records if "join.entry_cache (40)" in r.getMessage()]
    assert sorted(int(w.split()[2]) for w in warnings) == list(range(topics.partitions)), warnings


def test_kill_9_mid_run_then_restart_loses_no_decision(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    config_path = H.write_config(tmp_path / "join.json", _domains())
    env = H.process_env(kafka, topics, tmp_path / "state", H.free_port())
    log = tmp_path / "join.log"
    work = Workload(kafka, topics, 12_000, seed=5, rate=1500.0)
    worker = H.join_process(config_path, env, log)
    try:
        consumer = Consumer(kafka.consumer_config(f"watch-{topics.updates}"))
        consumer.subscribe([topics.updates])
        produced = work.run_in_thread()
        seen = 0
        deadline = time.monotonic() + 120
        while seen < 4000 and time.monotonic() < deadline:  # kill once it has joined a good part
            seen += sum(1 for m in consumer.consume(1000, 0.5) if m.error() is None)
            assert worker.poll() is None, log.read_text()[-3000:]
        consumer.close()
        assert seen >= 4000, log.read_text()[-3000:]
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(10) == -signal.SIGKILL
        time.sleep(1.0)
        worker = H.join_process(config_path, env, log)
        produced.join()
        assert work.error is None, f"the workload could not produce: {work.error!r}"
        updates = H.read_topic(kafka, topics.updates, "update", until=H.every_event(work.decisions), idle_s=2,
                               timeout_s=240)
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(60)
    assert code == 0, log.read_text()[-3000:]
    _assert_every_decision_joined_right(kafka, topics, work, updates)


def test_two_join_workers_split_the_partitions_and_one_takes_over_when_the_other_stops(kafka, topics, tmp_path):
    # Scaling out: two processes in one group, each with its own RocksDB; one stops mid-run and
    # the other recovers its partitions' state from the changelog and resumes at their offsets.
    ensure_topics(kafka, topics)
    config_path = H.write_config(tmp_path / "join.json", _domains())
    ports = [H.free_port(), H.free_port()]
    logs = [tmp_path / "join-a.log", tmp_path / "join-b.log"]
    workers = [
        H.join_process(config_path, H.process_env(kafka, topics, tmp_path / f"state-{i}", ports[i]), logs[i])
        for i in range(2)
    ]
    work = Workload(kafka, topics, 12_000, seed=9, rate=1500.0)

    def records_in(i: int) -> float:
        try:
            return _metric(ports[i], "banditstream_records_in_total")
        except OSError:  # still starting: no metrics endpoint yet
            return 0.0

    try:
        produced = work.run_in_thread()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (records_in(0) > 0 and records_in(1) > 0 and records_in(1) > 2000):
            for i, worker in enumerate(workers):
                assert worker.poll() is None, logs[i].read_text()[-3000:]
            time.sleep(0.5)
        assert records_in(0) > 0 and records_in(1) > 2000, "both workers should hold partitions and join"
        workers[1].send_signal(signal.SIGTERM)  # leaves the group: worker a takes its partitions over
        assert workers[1].wait(60) == 0, logs[1].read_text()[-3000:]
        before = records_in(0)
        produced.join()
        assert work.error is None, f"the workload could not produce: {work.error!r}"
        updates = H.read_topic(kafka, topics.updates, "update", until=H.every_event(work.decisions), idle_s=2,
                               timeout_s=240)
        assert workers[0].poll() is None, logs[0].read_text()[-3000:]
        assert records_in(0) > before
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        codes = [worker.wait(60) for worker in workers]
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
    _assert_every_decision_joined_right(kafka, topics, work, updates)


def test_bad_records_are_dead_lettered_with_their_reason_and_good_ones_joined(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    config = H.settings(kafka, topics, tmp_path / "state", domains=_domains(1.0, routing={"vector_dim": 4})).worker_config()
    rng = random.Random(3)
    sender = H.Sender(kafka, topics)
    serde = sender.decisions
    now = H.now_ms()

    def good(i):
        d = H.decision(f"good-{i}", "prompts", rng, now)
        sender.decision(d)
        return d["event_id"]

    def variant(event_id, **changes):
        d = H.decision(event_id, "routing", rng, now)
        d["context"]["vector"] = [0.1, 0.2, 0.3, 0.4]
        for path, value in changes.items():
            if path == "nan":
                d["context"]["numeric"]["f1"] = float("nan")
            else:
                d[path] = value
        return d

    valid = serde.encode(variant("v"))
    wrong_dim = variant("bad-dim")
    wrong_dim["context"]["vector"] = [0.1, 0.2, 0.3]
    corpus = {
        "truncated": valid[: len(valid) // 2],
        "unknown_schema_id": b"\x00\x00\x00\x27\x0f" + valid[10:],
        "unknown_framing": b"\x07not an avro event",
        "non_finite_feature": serde.encode(variant("bad-nan", nan=True)),
        "wrong_dimension": serde.encode(wrong_dim),
        "chosen_out_of_range": serde.encode(variant("bad-chosen", chosen=7)),
        "probabilities_do_not_sum_to_one": serde.encode({**variant("bad-probs"), "probabilities": [0.5] * 4}),
        "missing_event_id": serde.encode(variant("")),
        "unknown_domain": serde.encode({**variant("bad-domain"), "domain": "nowhere"}),
        "oversize": serde.encode({**variant("bad-size"), "policy_version": "x" * 1_000_100}),
        "field_too_large": serde.encode({**variant("bad-long"), "policy_version": "x" * 300_000}),
    }
    good_ids = [good(0)]
    for i, (reason, payload) in enumerate(corpus.items()):
        sender.raw(topics.decisions, f"bad-{i}", payload)
        good_ids.append(good(i + 1))
    broken_reward = AvroSerde("reward", framing="single_object").encode(H.reward("good-0", "r", "prompts", rng, now))[:-3]
    sender.raw(topics.rewards, "good-0", broken_reward)
    sender.flush()

    with H.JoinThread(config) as worker:
        updates = H.read_topic(kafka, topics.updates, "update", expect=len(good_ids), idle_s=2, timeout_s=90,
                               check=worker.check)
        dead = _deadletters(kafka, topics, expect=len(corpus) + 1, check=worker.check)

    assert sorted(u["event_id"] for _, u in updates) == sorted(good_ids)
    assert len(dead) == len(corpus) + 1
    kept = MAX_DEAD_LETTER_VALUE
    by_value = {r["value"]: r for r in dead}
    for reason, payload in corpus.items():
        record = by_value.get(payload if len(payload) <= kept else payload[:kept])  # an oversize one keeps its head
        assert record is not None, f"no dead letter for the {reason} record"
        assert record["reason"] == reason, (reason, record["message"])
        assert record["source_topic"] == topics.decisions and record["worker"] == "join"
        assert record["error_class"] and record["message"]
    assert by_value[broken_reward]["reason"] == "truncated"
    assert by_value[broken_reward]["source_topic"] == topics.rewards
    where = {(r["source_partition"], r["source_offset"]) for r in dead if r["source_topic"] == topics.decisions}
    assert len(where) == len(corpus)  # each points at its own record


def test_default_rewards_fire_from_the_wall_clock_when_traffic_stops(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    config = H.settings(kafka, topics, tmp_path / "state", domains=_domains(2.0)).worker_config()
    rng = random.Random(4)
    with H.JoinThread(config) as worker:
        time.sleep(3.0)  # the worker has its partitions; then a burst, then silence
        sender = H.Sender(kafka, topics)
        sent = {}
        for i in range(300):
            d = H.decision(f"quiet-{i}", list(H.DOMAINS)[i % 3], rng, H.now_ms())
            sender.decision(d)
            sent[d["event_id"]] = d
        sender.flush()
        consumer = Consumer(kafka.consumer_config(f"quiet-{topics.updates}"))
        consumer.subscribe([topics.updates])
        serde = AvroSerde("update", framing="single_object")
        arrived = {}
        deadline = time.monotonic() + 30
        while len(arrived) < len(sent) and time.monotonic() < deadline:
            for m in consumer.consume(500, 0.5):
                if m.error() is None:
                    update = serde.decode(m.value())
                    arrived[update["event_id"]] = (update, m.timestamp()[1])
            worker.check()
        consumer.close()
    assert set(arrived) == set(sent)
    for event_id, (update, produced_at) in arrived.items():
        assert update["join_status"] == "default" and update["reward_count"] == 0
        default = DomainSettings.model_validate(_domains(2.0)[sent[event_id]["domain"]]).reward.default_reward
        assert update["reward"] == default
        waited = produced_at - update["decision_time"]
        # After the window and the grace (event time), by the sweeper: the clocks follow the
        # wall clock once the partition has been quiet for the in-flight margin. Slack for the
        # producer's start (its first records reached the broker ~1.5 s after their stamps
        # here), fetch waits and a busy machine.
        options = JoinOptions()
        settle = int((options.grace_s + options.in_flight_margin_s) * 1000)
        assert 2000 + int(options.grace_s * 1000) <= waited <= 2000 + settle + 5000, waited


def test_each_partitions_normaliser_statistics_reach_the_posterior_topic_for_the_snapshots(kafka, topics, tmp_path):
    """A normalising domain's statistics, one record per join partition; merged, they are the
    statistics of every decision's numeric features (what the publisher ships to the SDK)."""
    from learner.features import Normalizer
    from streams.worker import NORMALIZER_POLICY

    ensure_topics(kafka, topics)
    tree = H.settings(kafka, topics, tmp_path / "state").model_dump(mode="json")
    config = Settings.model_validate({**tree, "join": {"purge_interval_s": 0.5}}).worker_config()
    routing = DomainSettings.model_validate(H.DOMAINS["routing"])
    assert routing.features.normalize
    expected = Normalizer()
    reference = FeatureEncoder(routing.features, expected)
    rng = random.Random(8)
    with H.JoinThread(config) as worker:
        sender = H.Sender(kafka, topics)
        for i in range(200):
            d = H.decision(f"norm-{i}", "routing", rng, H.now_ms())
            reference.observe(d["context"], d["actions"])
            sender.decision(d)
        sender.flush()

        def merged(records):
            latest = {key: r for key, r in records if r["policy"] == NORMALIZER_POLICY}
            return Normalizer.merged(Normalizer.from_export(json.loads(r["state"])) for r in latest.values()), latest

        def complete(records) -> bool:
            statistics, _ = merged(records)
            return all(statistics.count(name) == expected.count(name) for name in expected.names())

        records = H.read_topic(kafka, topics.posterior, "posterior", until=complete, idle_s=1.0, timeout_s=60, check=worker.check)
    statistics, latest = merged(records)
    assert expected.names() and statistics.names() == expected.names()
    for name in expected.names():
        assert statistics.count(name) == expected.count(name)
        assert statistics.mean(name) == pytest.approx(expected.mean(name), rel=1e-9)
        assert statistics.std(name) == pytest.approx(expected.std(name), rel=1e-9)
    assert {r["domain"] for r in latest.values()} == {"routing"}  # only the domain that normalises
    assert all(key.decode().startswith("~normalizer/routing/p") and r["watermark"] == [] for key, r in latest.items())


def test_sigterm_is_graceful_exits_0_and_commits(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    config_path = H.write_config(tmp_path / "join.json", _domains(1.0))
    env = H.process_env(kafka, topics, tmp_path / "state", H.free_port())
    log = tmp_path / "join.log"
    rng = random.Random(9)
    sender = H.Sender(kafka, topics)
    for i in range(500):
        d = H.decision(f"term-{i}", "routing", rng, H.now_ms())
        sender.decision(d)
        sender.reward(H.reward(d["event_id"], "r", "routing", rng, d["timestamp"] + 10))
    sender.flush()
    worker = H.join_process(config_path, env, log)
    try:
        updates = H.read_topic(kafka, topics.updates, "update", expect=500, idle_s=1.0, timeout_s=90)
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(60)
    assert code == 0, log.read_text()[-3000:]
    assert len(H.by_event_id(updates)) == 500
    assert "Traceback" not in log.read_text()
    # what it read was committed on the way out: a restart would not read it again
    group = f"banditstream-join.{topics.decisions}"
    probe = Consumer(kafka.consumer_config(group))
    committed = probe.committed([TopicPartition(topics.decisions, p) for p in range(topics.partitions)], timeout=10)
    probe.close()
    assert sum(tp.offset for tp in committed if tp.offset > 0) == 500


def test_a_reward_that_cannot_meet_its_decision_is_dead_lettered_not_left_to_default(kafka, topics, tmp_path):
    """No key, a partition other than its key's, a key other than its event_id: each such
    reward is dead-lettered with its reason; the decision learns from its good reward only."""
    from confluent_kafka import Producer

    from streams.partitioning import key_partition

    ensure_topics(kafka, topics)
    config = H.settings(kafka, topics, tmp_path / "state", domains=_domains(1.0)).worker_config()
    rng = random.Random(8)
    sender = H.Sender(kafka, topics)
    now = H.now_ms()
    decision = H.decision("meet-1", "prompts", rng, now)
    sender.decision(decision)
    sender.flush()
    encode = sender.rewards.encode
    home = key_partition(b"meet-1", topics.partitions, kafka.partitioner)
    elsewhere = (home + 1) % topics.partitions
    stranger = next(f"stranger-{i}" for i in range(100) if key_partition(f"stranger-{i}".encode(), topics.partitions) == home)
    producer = Producer(kafka.producer_config())
    bad = {
        "null_key": dict(value=encode(H.reward("meet-1", "r-null", "prompts", rng, now + 10)), partition=home),
        "wrong_partition": dict(value=encode(H.reward("meet-1", "r-wrong", "prompts", rng, now + 20)), key=b"meet-1",
                                partition=elsewhere),
        "key_mismatch": dict(value=encode(H.reward("meet-1", "r-key", "prompts", rng, now + 30)), key=stranger.encode(),
                             partition=home),
    }
    for record in bad.values():
        producer.produce(topics.rewards, **record)
    producer.flush(10)
    sender.reward(H.reward("meet-1", "r-good", "prompts", rng, now + 40))
    sender.flush()

    with H.JoinThread(config) as worker:
        updates = H.read_topic(kafka, topics.updates, "update", expect=1, idle_s=2, timeout_s=60, check=worker.check)
        dead = _deadletters(kafka, topics, expect=len(bad), check=worker.check)
    assert [(u["event_id"], u["join_status"], u["reward_count"]) for _, u in updates] == [("meet-1", "rewarded", 1)]
    assert sorted(r["reason"] for r in dead) == sorted(bad)
    for record in dead:
        assert record["source_topic"] == topics.rewards and record["value"] == bad[record["reason"]]["value"]


def test_a_second_join_on_one_state_dir_is_refused_in_one_line(kafka, topics, tmp_path):
    from learner.errors import StateDirLocked
    from streams.join import run_join

    ensure_topics(kafka, topics)
    config = H.settings(kafka, topics, tmp_path / "state").worker_config()
    with H.JoinThread(config) as worker:
        deadline = time.monotonic() + 30
        while not (tmp_path / "state" / "join" / "LOCK").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(StateDirLocked) as refused:
            run_join(config, stop=threading.Event())
        worker.check()
    assert str(refused.value).count("\n") == 0 and "in use by another worker" in str(refused.value)

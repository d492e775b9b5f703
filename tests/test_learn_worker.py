"""The learner worker against the real broker: UpdateEvents in, posterior state out.

UpdateEvents are produced directly to the updates topic (the join is not involved). Workers
run in a thread where no process has to die, and as ``banditstream learn`` subprocesses where
one is killed, stopped with SIGTERM or joined by a second one. The last test checks the block
arithmetic alone, restarting a shard at many more points than a broker test can afford.
"""

from __future__ import annotations

import contextlib
import random
import re
import signal
import struct
import threading
from pathlib import Path

import pytest
from confluent_kafka import Producer

from banditstream.devstack import free_port
from learner.store import PosteriorStore
from streams._learn_shard import DomainModel, ShardLearner, Update
from streams.learn import Learner, LearnerOptions
from streams.client import EventProducer
from streams.serde import AvroSerde
from streams.settings import KafkaSettings
from streams.topics import ensure_topics
from tests import learn_helpers as h

@contextlib.contextmanager
def learner_in_thread(config, prepare=None):
    """A Learner running in a thread (``prepare(learner)`` first, if given); stopped
    (gracefully) on exit."""
    learner = Learner(config)
    if prepare is not None:
        prepare(learner)
    stop = threading.Event()
    errors: list[BaseException] = []

    def run():
        try:
            learner.run(stop)
        except BaseException as exc:  # surfaced in the test, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="learner")
    thread.start()
    try:
        h.wait_until(lambda: learner.metrics.port or errors, 30, "the learner to start")
        yield learner
    finally:
        stop.set()
        thread.join(60)
        if errors:  # the root cause of whatever the test saw
            raise errors[0]
    assert not thread.is_alive(), "the learner did not stop"


@pytest.fixture
def learners():
    """``learners(config, log)`` starts ``banditstream learn`` like ``h.start_learner``; any
    still running when the test ends, passed or failed, is killed, so a failed assertion
    leaves no learner behind."""
    started = []

    def start(config_path, log_path):
        started.append(h.start_learner(config_path, log_path))
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def stop_gracefully(process, timeout: float = 30.0) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout)


def stored_shards(state_dir: Path, topic: str, partitions: int) -> dict[int, tuple[int | None, dict]]:
    """Per partition: the stored offset and every model's ArmState, read from the store."""
    out = {}
    with PosteriorStore(Path(state_dir) / "learn") as store:
        for partition in range(partitions):
            if not store.shard_path(partition).exists():
                continue
            shard = store.shard(partition)
            out[partition] = (shard.offsets().get((topic, partition)), dict(shard.arms()))
    return out


# -- 1 -----------------------------------------------------------------------------------------


SKIPPED = ("shadow", "off", "not_activated")


@pytest.mark.integration
def test_learned_posterior_equals_the_in_process_fold_of_the_same_updates(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    updates = h.make_updates(30_000, seed=1)
    rows = random.Random(1)
    for u in updates:  # the shared model's updates carry every candidate's row, as the join writes them
        if u["domain"] == "tool":  # (the learner steps over them: AvroSerde's skip)
            u["candidate_features"] = [[1.0] + [rows.gauss(0.0, 1.0) for _ in range(h.DIM - 1)] for _ in h.ARMS["tool"]]
            u["candidate_features"][u["arm_index"]] = u["features"]
    produced = h.produce(kafka, topics.updates, h.encode_updates(updates))
    block = 256
    # with RocksDB's write-ahead log (learn.wal), which every other test leaves at its default, off
    config = h.worker_config(kafka, topics, tmp_path, group_id="learn-t1", block_size=block, wal=True)

    with learner_in_thread(config) as learner:
        h.wait_published(kafka, "learn-t1", topics, produced.ends(), timeout=90)
        assert learner.store.open_partitions == list(range(topics.update_partitions))
        assert all(learner.store.shard(p).wal for p in learner.store.open_partitions)
        not_learned = {m: h.metric(learner.metrics.port, "banditstream_updates_not_learned_total", mode=m) for m in SKIPPED}
        records_in = h.metric(learner.metrics.port, "banditstream_records_in_total")

    published = h.latest_posterior(kafka, topics)
    h.assert_matches_reference(published, h.reference(updates, produced.placed))
    assert {k.domain for k in published} == {"route", "prompt", "tool"}
    assert any(k.arm == "" for k in published)  # the shared model of "tool"
    # shadow, off and never activated updates are counted, not learned; default rewards are
    # learned (reference)
    folded = h.folded(produced, block)  # the trailing block of each partition is not folded yet
    skipped = ["not_activated" if u["join_status"] == "not_activated" else u["mode"] for u in updates]
    assert not_learned == {m: sum(s == m and folded(w) for s, w in zip(skipped, produced.placed)) for m in SKIPPED}
    assert all(not_learned.values())
    assert records_in == len(updates)
    # the store holds whole blocks only: its offset is the last block boundary before the end
    ends = produced.ends()
    for partition, (offset, states) in stored_shards(tmp_path, topics.updates, topics.update_partitions).items():
        assert offset == ends[partition] // block * block
        assert states
        for key, state in states.items():
            assert state.update_count <= published[key]["update_count"]


@pytest.mark.integration
def test_updates_sent_in_transactions_are_all_learned_across_the_holes_their_commits_leave(kafka, topics, tmp_path):
    """Each commit leaves a control record in every partition it wrote: a gap the learner
    reads again for the profile's ``gap_confirm_s`` (streams._gaps), then takes as a hole.
    Nothing after one is skipped or learned twice: the posterior is the in-process fold."""
    ensure_topics(kafka, topics)
    updates = h.make_updates(3_000, seed=4)
    producer = Producer(kafka.producer_config(**{"transactional.id": f"tx-{topics.updates}"}))
    producer.init_transactions(30)
    placed: list = [None] * len(updates)
    failed: list = []

    def report(i):
        def on_delivery(error, message):
            if error is not None:
                failed.append(error)
            placed[i] = (message.partition(), message.offset())

        return on_delivery

    for start in range(0, len(updates), 1_000):  # three transactions
        producer.begin_transaction()
        for i, (key, value) in enumerate(h.encode_updates(updates[start:start + 1_000]), start):
            producer.produce(topics.updates, value=value, key=key, on_delivery=report(i))
        producer.commit_transaction(60)
    assert not failed, failed[:3]
    produced = h.Produced(placed)
    offsets = {p: sorted(o for q, o in placed if q == p) for p in range(topics.update_partitions)}
    gaps = {p: sum(b - a - 1 for a, b in zip(o, o[1:])) for p, o in offsets.items()}
    assert gaps == {p: 2 for p in offsets}  # a marker between the transactions, in every partition

    config = h.worker_config(kafka, topics, tmp_path, group_id="learn-tx", block_size=128)
    with learner_in_thread(config) as learner:
        h.wait_published(kafka, "learn-tx", topics, produced.ends(), timeout=90)
        holes = h.metric(learner.metrics.port, "banditstream_log_gaps_total", outcome="hole")
        assert holes == sum(gaps.values())  # each read again, then taken
        assert h.metric(learner.metrics.port, "banditstream_log_gaps_total", outcome="reread") >= holes
        assert h.metric(learner.metrics.port, "banditstream_records_in_total") == len(updates)
    h.assert_matches_reference(h.latest_posterior(kafka, topics), h.reference(updates, placed))


# -- 2 -----------------------------------------------------------------------------------------


@pytest.mark.integration
def test_kill_9_at_three_random_points_reproduces_the_uninterrupted_posterior_bit_for_bit(kafka, topics, tmp_path, learners):
    """...and loses no dead letter: one record in 50 is bad, so kills land next to them. The
    per-arm domains learn robustly (``h.ROBUST_DOMAINS``), which weighs a row by its model as
    its block finds it: the block boundaries, fixed by offsets, are what make the runs agree."""
    ensure_topics(kafka, topics)
    updates = h.make_updates(100_000, seed=2)
    items = h.encode_updates(updates)
    rng = random.Random(2)
    bad_slots = set(rng.sample(range(len(items)), 2_000))
    for slot in bad_slots:  # garbage under its own shard key: the same partition as the good one
        items[slot] = (items[slot][0], b"\x07not avro")
    produced = h.produce(kafka, topics.updates, items)
    ends = produced.ends()
    bad_at = {produced.placed[slot] for slot in bad_slots}
    good = [(u, where) for i, (u, where) in enumerate(zip(updates, produced.placed)) if i not in bad_slots]

    # the uninterrupted run: its own group, store and posterior topic, default options
    ref_topics = topics.model_copy(update={"posterior": topics.posterior + ".ref", "deadletter": topics.deadletter + ".ref"})
    ensure_topics(kafka, ref_topics)
    with learner_in_thread(h.worker_config(kafka, ref_topics, tmp_path / "ref", h.ROBUST_DOMAINS, group_id="learn-t2-ref")):
        h.wait_published(kafka, "learn-t2-ref", ref_topics, ends, timeout=120)

    # the same updates through `banditstream learn`, SIGKILLed at three seeded random points
    port = free_port()
    config = h.write_config(tmp_path / "learn.json", kafka, topics, tmp_path / "killed", port, domains=h.ROBUST_DOMAINS)
    doomed = h.write_config(tmp_path / "doomed.json", kafka, topics, tmp_path / "killed", port, doomed=True, domains=h.ROBUST_DOMAINS)
    for i in range(3):
        process = learners(doomed, tmp_path / "learn.log")
        threshold = rng.uniform(2_000, 20_000)  # updates this run has folded (past its replay)

        def learned_enough():
            assert process.poll() is None, f"learner exited with {process.returncode}"
            with contextlib.suppress(OSError):
                return h.metric(port, "banditstream_batch_size_sum") >= threshold
            return False

        h.wait_until(learned_enough, 90, f"run {i} to fold {threshold:.0f} updates", interval=0.02)
        process.kill()
        assert process.wait(10) == -signal.SIGKILL
    process = learners(config, tmp_path / "learn.log")
    h.wait_published(kafka, f"banditstream-learn.{topics.updates}", topics, ends, timeout=150)
    assert stop_gracefully(process) == 0

    killed, uninterrupted = h.latest_posterior(kafka, topics), h.latest_posterior(kafka, ref_topics)
    assert set(killed) == set(uninterrupted)
    for key, record in killed.items():
        assert record["state"] == uninterrupted[key]["state"], key  # bit for bit
        assert record["update_count"] == uninterrupted[key]["update_count"]
    # and the stores agree: same block boundaries, same bytes
    assert stored_shards(tmp_path / "killed", topics.updates, 4) == stored_shards(tmp_path / "ref", topics.updates, 4)
    # counts are exact (no update lost, none counted twice); statistics match the in-process
    # fold of the same blocks (the learner's default size)
    robust = h.ROBUST_DOMAINS
    h.assert_matches_reference(killed, h.reference(*zip(*good), block=LearnerOptions().block_size, domains=robust), domains=robust)
    # every bad record dead-lettered (some twice, after a kill: at-least-once), nothing else
    letters = h.read_topic(kafka, topics.deadletter, 1, AvroSerde("deadletter", framing="single_object"))
    assert {(r["source_partition"], r["source_offset"]) for r, *_ in letters} == bad_at


# -- 3 -----------------------------------------------------------------------------------------


@pytest.mark.integration
def test_two_learners_split_the_partitions_and_one_takes_over_the_others_shards(kafka, topics, tmp_path, learners):
    ensure_topics(kafka, topics)
    group = f"banditstream-learn.{topics.updates}"
    ports = {name: free_port() for name in "abc"}
    configs = {
        name: h.write_config(tmp_path / f"{name}.json", kafka, topics, tmp_path / name, ports[name], doomed=name == "b")
        for name in "abc"
    }  # separate state roots: a worker never sees another's disk; b is SIGKILLed below
    a = learners(configs["a"], tmp_path / "a.log")
    b = learners(configs["b"], tmp_path / "b.log")

    def assigned(name):
        with contextlib.suppress(OSError):
            return h.metric(ports[name], "banditstream_partitions_assigned")
        return 0

    h.wait_until(lambda: assigned("a") >= 1 and assigned("b") >= 1 and assigned("a") + assigned("b") == 4, 60, "a split")
    first = h.make_updates(20_000, seed=31, prefix="first")
    placed = h.produce(kafka, topics.updates, h.encode_updates(first)).placed
    h.wait_published(kafka, group, topics, h.Produced(placed).ends(), timeout=90)
    assert stop_gracefully(a) == 0
    owned_by_a = last_assignment(tmp_path / "a.log")
    assert 1 <= len(owned_by_a) < 4

    # b takes a's shards over from their published state and watermark
    h.wait_until(lambda: assigned("b") == 4, 60, "b to own every partition")
    second = h.make_updates(20_000, seed=32, prefix="second")
    placed += h.produce(kafka, topics.updates, h.encode_updates(second)).placed
    h.wait_published(kafka, group, topics, h.Produced(placed).ends(), timeout=90)
    h.assert_matches_reference(h.latest_posterior(kafka, topics), h.reference(first + second, placed))
    assert last_assignment(tmp_path / "b.log") == {0, 1, 2, 3}
    read_by_b = h.metric(ports["b"], "banditstream_records_in_total")

    # b dies mid-run (SIGKILL); c, on an empty disk, rebuilds every shard from the posterior topic
    third = h.make_updates(40_000, seed=33, prefix="third")
    placed += h.produce(kafka, topics.updates, h.encode_updates(third)).placed
    h.wait_until(lambda: h.metric(ports["b"], "banditstream_records_in_total") >= read_by_b + 15_000, 60, "b mid-run", interval=0.02)
    b.kill()
    b.wait(10)
    c = learners(configs["c"], tmp_path / "c.log")
    h.wait_published(kafka, group, topics, h.Produced(placed).ends(), timeout=120)
    assert stop_gracefully(c) == 0

    # nothing lost, nothing doubled: exact counts, statistics of the in-process fold
    h.assert_matches_reference(h.latest_posterior(kafka, topics), h.reference(first + second + third, placed))
    # b rebuilt a's shards, c every shard, from published models (not from scratch)
    assert owned_by_a <= {p for p, n in rebuilt_models(tmp_path / "b.log").items() if n > 0}
    assert {p for p, n in rebuilt_models(tmp_path / "c.log").items() if n > 0} == {0, 1, 2, 3}


def rebuilt_models(log: Path) -> dict[int, int]:
    """Per partition, how many models the worker last rebuilt from the posterior topic."""
    found = re.findall(r"shard (\d+): not in the local store; rebuilt (\d+) models", log.read_text())
    return {int(p): int(n) for p, n in found}


def last_assignment(log: Path) -> set[int]:
    """The partitions a worker said it owns in its last 'assigned [...]' log line."""
    line = [line for line in log.read_text().splitlines() if " assigned [" in line][-1]
    return {int(p) for p in line.rsplit("[", 1)[1].rstrip("]").split(",") if p.strip()}


# -- 4 -----------------------------------------------------------------------------------------


@pytest.mark.integration
def test_bad_records_are_dead_lettered_with_reasons_and_the_good_ones_learned(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    serde = AvroSerde("update", framing="single_object")
    good = h.make_updates(5_000, seed=4)
    template = h.make_updates(1, seed=5, prefix="bad", modes=False)[0]

    def bad(i, **changes):
        return {**template, "event_id": f"bad-{i}", **changes}

    valid_bytes = serde.encode(template)
    corpus = [  # (reason, key, value)
        ("truncated", h.shard_key(template), valid_bytes[: len(valid_bytes) // 2]),
        ("truncated", h.shard_key(template), None),
        ("unknown_framing", h.shard_key(template), b"\x07not avro at all"),
        ("unknown_fingerprint", h.shard_key(template), b"\xc3\x01" + b"\x11" * 8 + valid_bytes[10:]),
        ("unknown_schema_id", h.shard_key(template), b"\x00" + struct.pack(">I", 4242) + valid_bytes[10:]),
        ("oversize", h.shard_key(template), serde.encode(bad(1, policy_version="x" * 5000))),
        ("missing_event_id", h.shard_key(template), serde.encode(bad(2, event_id=""))),
        ("non_finite_feature", h.shard_key(template), serde.encode(bad(3, features=[1.0, float("nan")] + [0.0] * 6))),
        ("non_finite_value", h.shard_key(template), serde.encode(bad(4, reward=float("inf")))),
        ("wrong_dimension", h.shard_key(template), serde.encode(bad(5, features=[1.0] * 5))),
        ("unknown_domain", "default/main/nope/gpt", serde.encode(bad(6, domain="nope"))),
        ("feature_hash_mismatch", h.shard_key(template), serde.encode(bad(7, feature_hash="0123456789abcdef"))),
        ("negative_weight", h.shard_key(template), serde.encode(bad(8, weight=-1.0))),
        ("out_of_range", h.shard_key(template), serde.encode(bad(12, features=[1.0, -3e200] + [0.0] * 6))),
        ("wrong_shard_key", "default/main/route", serde.encode(bad(9))),
        ("chosen_out_of_range", h.shard_key(template), serde.encode(bad(10, actions=["a", "b"], probabilities=[0.5, 0.5], arm_index=7))),
        ("probabilities_do_not_sum_to_one", h.shard_key(template), serde.encode(bad(11, actions=["a", "b"], probabilities=[0.5, 0.2], arm_index=0))),
    ]
    items = h.encode_updates(good)
    rng = random.Random(4)
    slots = sorted(rng.sample(range(len(items)), len(corpus)))
    for shift, (slot, (_reason, key, value)) in enumerate(zip(slots, corpus)):
        items.insert(slot + shift, (key, value))
    produced = h.produce(kafka, topics.updates, items)
    bad_at = {produced.placed[slot + shift]: corpus[shift] for shift, slot in enumerate(slots)}
    good_placed = [where for where, item in zip(produced.placed, items) if where not in bad_at]

    config = h.worker_config(kafka, topics, tmp_path, group_id="learn-t4", max_payload_bytes=4096)
    with learner_in_thread(config) as learner:
        h.wait_published(kafka, "learn-t4", topics, produced.ends(), timeout=60)
        by_reason = {reason: h.metric(learner.metrics.port, "banditstream_dead_letters_total", reason=reason) for reason, _, _ in corpus}

    letters = h.read_topic(kafka, topics.deadletter, 1, AvroSerde("deadletter", framing="single_object"))
    got = {(r["source_partition"], r["source_offset"]): r for r, *_ in letters}
    assert set(got) == set(bad_at)  # every bad record, once; no good record
    for where, (reason, key, value) in bad_at.items():
        letter = got[where]
        assert letter["reason"] == reason, (letter["reason"], letter["message"])
        assert letter["source_topic"] == topics.updates and letter["worker"] == "learn"
        assert letter["value"] == value and letter["key"] == key.encode()
        assert letter["message"] and letter["error_class"]
    assert by_reason == {reason: sum(r == reason for r, _, _ in corpus) for reason, _, _ in corpus}
    h.assert_matches_reference(h.latest_posterior(kafka, topics), h.reference(good, good_placed))


@pytest.mark.integration
def test_offsets_wait_for_dead_letters_and_a_restart_sends_the_unacknowledged_ones_again(kafka, topics, tmp_path):
    """Dead letters that never reached the broker (their producer cut off from it, as during a
    broker restart, or killed before its queue drained) hold the group's commit back even
    though the store folds past their records; the next start checks those records again.
    (Measured before: the restart resumed at the stored offset and those dead letters were
    lost, 15 of 100,000 in a 15-minute soak.)"""
    ensure_topics(kafka, topics)
    items = h.encode_updates(h.make_updates(6_000, seed=9))
    rng = random.Random(9)
    bad_slots = set(rng.sample(range(len(items)), 120))
    for slot in bad_slots:
        items[slot] = (items[slot][0], b"\x07not avro")
    produced = h.produce(kafka, topics.updates, items)
    bad_at = {produced.placed[slot] for slot in bad_slots}
    ends = produced.ends()
    group = "learn-t-dl"
    config = h.worker_config(kafka, topics, tmp_path, group_id=group, flush_timeout_s=0.5, block_size=256)
    nowhere = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", profile="tansu")

    def cut_off(learner):
        learner.dead_letters.producer = EventProducer(nowhere, **{"log_level": 0})

    with learner_in_thread(config, cut_off) as learner:
        stored = lambda: all(  # noqa: E731
            h.metric(learner.metrics.port, "banditstream_learner_stored_offset", partition=str(p)) >= end // 256 * 256
            for p, end in ends.items()
        )  # fmt: skip
        h.wait_until(stored, 60, "every complete block to be stored")
        h.wait_until(lambda: h.metric(learner.metrics.port, "banditstream_posterior_shards_emitted_total") > 0, 30, "a publication")
        assert learner.dead_letters.outstanding == len(bad_at)
    first_bad = {p: min(o for q, o in bad_at if q == p) for p, _ in bad_at}
    committed = h.committed(kafka, group, topics.updates, topics.update_partitions)
    assert all(committed[p] <= first for p, first in first_bad.items()), (committed, first_bad)  # nothing past them

    with learner_in_thread(config):
        h.wait_published(kafka, group, topics, ends, timeout=60)
    letters = h.read_topic(kafka, topics.deadletter, 1, AvroSerde("deadletter", framing="single_object"))
    assert {(r["source_partition"], r["source_offset"]) for r, *_ in letters} == bad_at


# -- 5 -----------------------------------------------------------------------------------------


@pytest.mark.integration
def test_an_update_delivered_twice_is_learned_once(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    updates = h.make_updates(12_000, seed=5, modes=False)
    rng = random.Random(5)
    copies: dict[int, list[dict]] = {}
    for i in rng.sample(range(len(updates)), 600):  # right after, or thousands of records later
        at = min(i + rng.choice([0, 1, rng.randrange(50, 3000)]), len(updates) - 1)
        copy = dict(updates[i]) if rng.random() < 0.8 else {**updates[i], "reward": 99.0}  # first one wins
        copies.setdefault(at, []).append(copy)
    stream = []
    for i, update in enumerate(updates):
        stream += [update, *copies.get(i, [])]
    produced = h.produce(kafka, topics.updates, h.encode_updates(stream))
    originals = {id(u) for u in updates}
    folded = h.folded(produced, 128)
    expected_duplicates = sum(id(u) not in originals and folded(w) for u, w in zip(stream, produced.placed))

    config = h.worker_config(kafka, topics, tmp_path, group_id="learn-t5", block_size=128, dedupe_window=4096)
    with learner_in_thread(config) as learner:
        h.wait_published(kafka, "learn-t5", topics, produced.ends(), timeout=60)
        duplicates = h.metric(learner.metrics.port, "banditstream_duplicates_total", kind="update")

    assert duplicates == expected_duplicates > 400  # counted as their blocks are folded
    h.assert_matches_reference(h.latest_posterior(kafka, topics), h.reference(stream, produced.placed))


# -- 6 -----------------------------------------------------------------------------------------


@pytest.mark.integration
def test_sigterm_flushes_state_publishes_commits_and_exits_0(kafka, topics, tmp_path, learners):
    ensure_topics(kafka, topics)
    port = free_port()
    config = h.write_config(tmp_path / "learn.json", kafka, topics, tmp_path / "state", port)
    process = learners(config, tmp_path / "learn.log")
    updates = h.make_updates(10_000, seed=6)
    produced = h.produce(kafka, topics.updates, h.encode_updates(updates))

    def read_all():
        with contextlib.suppress(OSError):
            return h.metric(port, "banditstream_records_in_total") >= len(updates)
        return False

    h.wait_until(read_all, 60, "the learner to read every update", interval=0.02)
    assert stop_gracefully(process) == 0  # at once: the shutdown itself must publish and commit

    ends = produced.ends()
    assert h.committed(kafka, f"banditstream-learn.{topics.updates}", topics.updates, 4) == {p: ends.get(p, 0) for p in range(4)}
    published = h.latest_posterior(kafka, topics)
    h.assert_matches_reference(published, h.reference(updates, produced.placed))
    stored = stored_shards(tmp_path / "state", topics.updates, 4)
    assert {p for p, (offset, _) in stored.items() if offset} == {p for p, end in ends.items() if end >= 1024}
    for partition, (offset, _states) in stored.items():
        assert offset in (None, ends[partition] // 1024 * 1024)  # whole blocks, flushed
    log = (tmp_path / "learn.log").read_text()
    assert "Traceback" not in log


def test_without_a_write_ahead_log_a_kill_after_a_commit_keeps_every_block_before_it(kafka, topics, tmp_path, learners):
    """The default (``learn.wal`` off): the publication's flush finishes before the commit."""
    ensure_topics(kafka, topics)
    port = free_port()
    config = h.write_config(tmp_path / "learn.json", kafka, topics, tmp_path / "state", port, doomed=True)
    process = learners(config, tmp_path / "learn.log")  # killed by the fixture if the wait fails
    produced = h.produce(kafka, topics.updates, h.encode_updates(h.make_updates(10_000, seed=9)))
    ends = produced.ends()
    group = f"banditstream-learn.{topics.updates}"

    def committed_all():
        assert process.poll() is None, f"learner exited with {process.returncode}"
        return h.committed(kafka, group, topics.updates, 4) == {p: ends.get(p, 0) for p in range(4)}

    h.wait_until(committed_all, 90, "the learner to commit every update")
    process.kill()
    assert process.wait(10) == -signal.SIGKILL
    stored = stored_shards(tmp_path / "state", topics.updates, 4)
    for partition, end in ends.items():
        assert end >= 1024 and stored[partition][0] == end // 1024 * 1024, partition  # every complete block
    assert "Traceback" not in (tmp_path / "learn.log").read_text()


# -- the block arithmetic itself, without a broker ----------------------------------------------


@pytest.mark.parametrize("block_size, n_updates", [(64, 6_000), (2, 1_500)])
def test_restarts_at_any_offsets_fold_the_same_blocks_bit_for_bit(tmp_path, block_size, n_updates):
    """A shard fed one partition, restarted from its store at random offsets (everything in
    memory lost, as after kill -9), ends with the same bytes as one fed without a restart.
    With blocks of 2 the shared model learns its rows one or two at a time, in place: its
    factor is then part of the stored state."""
    domains = {name: DomainModel.of(settings) for name, settings in h.domain_settings().items()}
    rng = random.Random(8)
    stream = h.make_updates(n_updates, seed=8)
    for _ in range(300):  # duplicates a little later in the partition
        i = rng.randrange(len(stream) - 1)
        stream.insert(min(i + rng.randrange(1, 200), len(stream)), dict(stream[i]))
    updates = [Update(o, u["event_id"], h.model_key(u), u["features"], u["reward"], u["weight"], u["mode"]) for o, u in enumerate(stream)]
    for offset in rng.sample(range(len(updates)), 40):  # records the worker dead-lettered
        updates[offset] = None

    def fold(root: Path, restarts: list[int]) -> tuple[dict, dict]:
        with PosteriorStore(root) as store:
            for stop in [*sorted(restarts), len(updates)]:
                stored = store.shard(0).offsets().get(("u", 0), 0)
                shard = ShardLearner(0, "u", domains, store.shard(0), block_size=block_size, window_blocks=4, start=stored)
                shard.load_stored()
                for offset in range(shard.warm_offset(), stop):
                    shard.feed(offset, updates[offset])
                if stop < len(updates):
                    store.close_shard(0)  # a kill: the trailing block and every cache are gone
            published = {m.key: (m.state.update_count, m.state.state) for m in shard.snapshot(shard.keys())}
            return published, dict(store.shard(0).arms())

    uninterrupted = fold(tmp_path / "once", [])
    assert len(uninterrupted[0]) == 9
    shared = [state for key, (_, state) in uninterrupted[0].items() if key.arm == ""]
    assert len(shared) == 1 and (b'"LT"' in shared[0]) == (block_size == 2)
    for trial in range(3):
        restarts = rng.sample(range(1, len(updates)), 5)
        assert fold(tmp_path / f"restarted-{trial}", restarts) == uninterrupted, restarts


def test_a_shard_that_writes_at_publication_stores_the_bytes_of_one_that_writes_every_block(tmp_path):
    """``persist_every_block=False`` (the learner without its write-ahead log): nothing reaches
    the store until :meth:`ShardLearner.persist`, which then writes what writing every block
    would hold at the last folded block, and a restart from it folds on to the same bytes."""
    domains = {name: DomainModel.of(settings) for name, settings in h.domain_settings().items()}
    stream = h.make_updates(3_000, seed=11)
    updates = [Update(o, u["event_id"], h.model_key(u), u["features"], u["reward"], u["weight"], u["mode"]) for o, u in enumerate(stream)]

    def run(root: Path, every_block: bool, stops: list[int]) -> list[tuple[int | None, dict]]:
        seen = []
        with PosteriorStore(root) as store:
            start = 0
            for stop in stops:
                db = store.shard(0)
                shard = ShardLearner(0, "u", domains, db, block_size=64, window_blocks=4,
                                     start=db.offsets().get(("u", 0), 0), persist_every_block=every_block)  # fmt: skip
                shard.load_stored()
                for offset in range(shard.warm_offset(), stop):  # the window's records, then from the stored offset on
                    shard.feed(offset, updates[offset])
                if not every_block:
                    before = store.shard(0).offsets().get(("u", 0))
                    assert before == (None if start == 0 else start // 64 * 64)  # nothing written since the last
                    assert shard.persist() and not shard.persist()  # the second has nothing due
                seen.append((store.shard(0).offsets().get(("u", 0)), dict(store.shard(0).arms())))
                store.close_shard(0)  # a restart from the store: the trailing block is read again
                start = stop
        return seen

    stops = [1_000, 2_000, 3_000]
    every_block = run(tmp_path / "every-block", True, stops)
    at_publication = run(tmp_path / "at-publication", False, stops)
    assert [offset for offset, _ in every_block] == [960, 1984, 2944]
    assert at_publication == every_block


def test_state_of_the_old_default_policy_is_taken_into_the_default_portfolio(tmp_path):
    """A domain that names no policy ran lin_igw; the default is now a portfolio of lin_igw and
    lin_igw forgetting. Its stored lin_igw state is taken in by both members (and stored and
    published as the portfolio's next); a domain whose policy has no lin_igw member refuses it."""
    from learner.domain import DomainSettings
    from learner.policies import make_policy
    from learner.store import ArmKey, ArmState
    from streams._learn_shard import StateMismatch

    old = DomainSettings(policy="lin_igw")
    dim = old.features.dimension
    policy = make_policy("lin_igw", dim=dim)
    policy.update_batch([[1.0] + [0.5] * (dim - 1)] * 3, ["a", "a", "b"], [1.0, 0.8, 0.1])
    keys = {arm: ArmKey("default", "main", "route", arm) for arm in ("a", "b")}
    with PosteriorStore(tmp_path) as store:
        states = {keys[arm]: ArmState("lin_igw", dim, policy.update_count(arm), policy.arm_state_bytes(arm), old.features.config_hash())
                  for arm in keys}  # fmt: skip
        store.shard(0).apply(states, {("u", 0): 3})
        for refusing in (DomainSettings(policy="lin_ucb"), DomainSettings(policy="portfolio", params={"members": [
                {"policy": "lin_ucb"}, {"policy": "lin_ts"}]})):  # fmt: skip
            shard = ShardLearner(0, "u", {"route": DomainModel.of(refusing)}, store.shard(0), block_size=8, window_blocks=4, start=0)
            with pytest.raises(StateMismatch, match="policy 'lin_igw'"):
                shard.load_stored()

        default = DomainSettings()
        shard = ShardLearner(0, "u", {"route": DomainModel.of(default)}, store.shard(0), block_size=8, window_blocks=4, start=3)
        assert shard.load_stored() == 2
        portfolio = shard._policies[("default", "main", "route")]  # noqa: SLF001
        for arm in keys:  # both lin_igw members start from the arm's lin_igw state, bit for bit; the Fourier one at its prior
            assert [m.arm_state_bytes(arm) for m in portfolio.members[:2]] == [policy.arm_state_bytes(arm)] * 2
            assert portfolio.members[2].update_count(arm) == 0
        assert shard.dirty == set(keys.values())  # published as the portfolio's at the next chance
        published = {m.key.arm: m.state for m in shard.snapshot(sorted(shard.dirty))}
        assert {state.policy for state in published.values()} == {"portfolio"}
        # learning goes on from there; the block it closes (offsets 0-7) stores the portfolio's state
        x = [1.0] + [0.5] * (dim - 1)
        for offset in range(3, 8):
            shard.feed(offset, Update(offset, f"e{offset}", keys["a"], x, 1.0, 1.0, "live"))
        assert {state.policy for _, state in store.shard(0).arms()} == {"portfolio"}
        assert portfolio.members[0].update_count("a") == policy.update_count("a") + 5
        learned = portfolio.arm_state_bytes("a")

    with PosteriorStore(tmp_path) as store:  # and a restarted learner reads it as the portfolio's
        shard = ShardLearner(0, "u", {"route": DomainModel.of(DomainSettings())}, store.shard(0), block_size=8, window_blocks=4, start=8)
        assert shard.load_stored() == 2 and shard.dirty == set()
        assert shard._policies[("default", "main", "route")].arm_state_bytes("a") == learned  # noqa: SLF001


def test_a_learner_refuses_state_of_another_policy_in_one_line(kafka, topics, tmp_path, learners):
    """`banditstream learn` over a state dir whose model was learned with another policy than
    the domain's: one line naming both and what to do, exit 2 (as every refused input), no traceback."""
    from learner.policies import make_policy
    from learner.store import ArmKey, ArmState

    ensure_topics(kafka, topics)
    settings = h.domain_settings()["route"]
    other = make_policy("lin_ucb", dim=h.DIM)
    other.update_batch([[1.0] * h.DIM], ["gpt"], [1.0])
    state_dir = tmp_path / "state"
    with PosteriorStore(state_dir / "learn") as store:  # where the learner keeps its store
        state = ArmState("lin_ucb", h.DIM, 1, other.arm_state_bytes("gpt"), settings.features.config_hash())
        store.shard(0).apply({ArmKey("default", "main", "route", "gpt"): state}, {(topics.updates, 0): 0})  # offset 0: the log's start
    config = h.write_config(tmp_path / "learn.json", kafka, topics, state_dir, free_port())
    log = tmp_path / "learn.log"
    code = learners(config, log).wait(timeout=120)  # a learner still running is killed by the fixture
    text = log.read_text()
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in text, text[-3000:]
    assert len(errors) == 1 and "policy 'lin_ucb' (configured: 'lin_ts')" in errors[0], text[-3000:]

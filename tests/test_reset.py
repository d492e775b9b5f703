"""Model resets: a marker in the updates log returns a domain's models to their priors.

The block arithmetic is checked without a broker (a reset is one more record of the fold, so it
must replay bit for bit and leave the other domains alone); then the whole path on the real
broker: markers on every partition, a learner folding them, the posterior topic and the
publisher's table following, and the evaluation readers skipping them.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from learner.store import ArmKey, PosteriorStore
from streams._learn_shard import BEFORE_RESET, RESET, BlockStats, DomainModel, ShardLearner, Update
from streams.evaluation_log import read_updates
from streams.reset import is_reset, reset_marker, send_reset
from streams.serde import AvroSerde
from streams.topics import ensure_topics
from tests import learn_helpers as h
from tests.test_learn_worker import learner_in_thread

DOMAINS = {name: DomainModel.of(settings) for name, settings in h.domain_settings().items()}
#: where the markers go: "route" (per-arm Thompson) twice, "tool" (a shared model) once
MARKERS = {1000: "route", 1500: "tool", 2200: "route"}


def marker(offset: int, domain: str, time: int = 0) -> Update:
    return Update(offset, f"reset-{offset}", ArmKey("default", "main", domain, ""), [], 0.0, 0.0, RESET, time)


def as_update(offset: int, u: dict, time: int = 0) -> Update:
    return Update(offset, u["event_id"], h.model_key(u), u["features"], u["reward"], u["weight"], u["mode"], time)


def streams_with_and_without_resets(n: int = 3000, seed: int = 5) -> tuple[list[Update | None], list[Update | None]]:
    """The partition with the markers, and the same partition with each marker and every row of
    its domain before it dead-lettered instead (what a reset should be equivalent to)."""
    raw = h.make_updates(n, seed=seed)
    with_resets: list[Update | None] = []
    without: list[Update | None] = []
    last_reset = {domain: max(o for o, d in MARKERS.items() if d == domain) for domain in set(MARKERS.values())}
    for offset, u in enumerate(raw):
        if offset in MARKERS:
            with_resets.append(marker(offset, MARKERS[offset]))
            without.append(None)
            continue
        update = as_update(offset, u)
        with_resets.append(update)
        without.append(None if offset < last_reset.get(u["domain"], -1) else update)
    return with_resets, without


#: In the timed stream a row at offset o was decided at o ms, a marker resets at its offset's time,
#: and every third row in LATE was decided just before the 2200 reset of "route" (it reached the
#: log late: a reward after the reset, a default that fired late).
LATE = range(2201, 2600, 3)


def timed_streams(n: int = 3000, seed: int = 5) -> tuple[list[Update | None], list[Update | None]]:
    """The timed partition, and the same partition with every route row the 2200 reset should
    discard dead-lettered instead: those before it, and the late ones after it decided before it.
    The late rows of the other domains are learned: their resets (tool at 1500) came earlier."""
    with_resets, without = [], []
    for offset, u in enumerate(h.make_updates(n, seed=seed)):
        if offset in MARKERS:
            with_resets.append(marker(offset, MARKERS[offset], time=offset))
            without.append(None)
            continue
        late = offset in LATE
        update = as_update(offset, u, time=2199 if late else offset)
        with_resets.append(update)
        discarded = {"route": offset < 2200 or late, "tool": offset < 1500}.get(u["domain"], False)
        without.append(None if discarded else update)
    return with_resets, without


def fold(root: Path, updates: list[Update | None], restarts: list[int] = (), block_size: int = 64, end: int | None = None):
    """Feed ``updates`` to a shard (restarted from its store at ``restarts``, as after kill -9);
    the published models (trailing block included) and the stored ones."""
    end = len(updates) if end is None else end
    with PosteriorStore(root) as store:
        for stop in [*sorted(restarts), end]:
            stored = store.shard(0).offsets().get(("u", 0), 0)
            shard = ShardLearner(0, "u", DOMAINS, store.shard(0), block_size=block_size, window_blocks=4, start=stored)
            shard.load_stored()
            for offset in range(shard.warm_offset(), stop):
                shard.feed(offset, updates[offset])
            if stop < end:
                store.close_shard(0)
        published = {m.key: (m.state.update_count, m.state.state) for m in shard.snapshot(shard.keys())}
        return published, dict(store.shard(0).arms()), shard


def prior_state(key: ArmKey) -> bytes:
    policy = h.domain_settings()[key.domain].make_policy()
    policy.add_arm(key.arm)
    return policy.arm_state_bytes(key.arm)


@pytest.mark.parametrize("block_size", [64, 2])
def test_a_reset_folds_as_if_the_domains_earlier_rows_were_never_there_and_replays_bit_for_bit(tmp_path, block_size):
    with_resets, without = streams_with_and_without_resets()
    published, stored, _ = fold(tmp_path / "reset", with_resets, block_size=block_size)
    reference, _, _ = fold(tmp_path / "reference", without, block_size=block_size)

    # Every model learned after the resets is, bit for bit, the one learned from those rows
    # alone; the untouched domain ("prompt") is the same as if nothing had happened.
    assert set(reference) <= set(published) and {k.domain for k in reference} == {"route", "prompt", "tool"}
    for key, state in reference.items():
        assert published[key] == state, key
    # An arm of a reset domain that learned nothing since holds exactly its prior.
    for key in set(published) - set(reference):
        assert key.domain in ("route", "tool")
        assert published[key] == (0, prior_state(key)), key
    learned_since = sum(1 for u in with_resets[2201:] if u and u.key.domain == "route" and u.mode == "live")
    assert sum(c for k, (c, _) in published.items() if k.domain == "route") == learned_since > 0
    # the store holds whole blocks: never more than what is published
    assert all(state.update_count <= published[key][0] for key, state in stored.items())

    rng = random.Random(block_size)
    for trial in range(3):
        restarts = sorted(rng.sample(range(1, len(with_resets)), 4)) + [999, 1001, 2199, 2201]
        again = fold(tmp_path / f"restarted-{trial}", with_resets, restarts, block_size=block_size)
        assert again[:2] == (published, stored), restarts


def test_a_reset_in_the_trailing_block_shows_in_what_is_published_not_in_the_store(tmp_path):
    with_resets, _ = streams_with_and_without_resets()
    before, stored_before, _ = fold(tmp_path / "before", with_resets, end=2176)  # block 34 starts at 2176
    published, stored, shard = fold(tmp_path / "after", with_resets, end=2210)  # its marker (2200) is read

    route = {k for k in before if k.domain == "route"}
    assert route and all(before[k][0] > 0 for k in route)
    # The store stays at the block boundary: the old learning, untouched by the pending marker.
    assert {k: stored[k].state for k in route} == {k: stored_before[k].state for k in route}
    # What is published carries the reset: only rows after the marker count.
    after_marker = {u.key for u in with_resets[2201:2210] if u and u.key.domain == "route" and u.mode == "live"}
    assert {k for k in route if published[k][0] > 0} <= after_marker
    assert all(published[k] == (0, prior_state(k)) for k in route - after_marker)
    # and every route model is marked changed, so the learner will publish it
    assert route <= shard.dirty


@pytest.mark.parametrize("block_size", [64, 2])
def test_a_row_decided_before_a_reset_that_reaches_the_log_after_it_is_not_learned_across_restarts(tmp_path, block_size):
    with_resets, without = timed_streams()
    late_route = [o for o in LATE if with_resets[o] and with_resets[o].key.domain == "route" and with_resets[o].mode == "live"]
    assert len(late_route) > 20
    published, stored, _ = fold(tmp_path / "reset", with_resets, block_size=block_size)
    reference, _, _ = fold(tmp_path / "reference", without, block_size=block_size)
    assert {k: published[k] for k in reference} == reference
    assert all(published[k] == (0, prior_state(k)) for k in set(published) - set(reference))
    # the late rows of the other domains were learned: they are in the reference
    assert any(with_resets[o].key.domain != "route" for o in LATE if with_resets[o])

    # A restart between the marker and the late rows must remember the reset's time: the
    # store holds it with the block, not only the offset.
    restarts = [2240, 2241, 2300, 2450] + sorted(random.Random(block_size).sample(range(2201, 2600), 3))
    again = fold(tmp_path / "restarted", with_resets, restarts, block_size=block_size)
    assert again[:2] == (published, stored)
    with PosteriorStore(tmp_path / "restarted") as store:
        assert store.shard(0).resets() == {("default", "main", "route"): 2200, ("default", "main", "tool"): 1500}


def test_rows_decided_before_a_reset_are_counted_as_before_reset():
    with_resets, _ = timed_streams()
    blocks: list[BlockStats] = []
    with PosteriorStore(Path(tempfile.mkdtemp()) / "s") as store:
        shard = ShardLearner(0, "u", DOMAINS, store.shard(0), block_size=64, window_blocks=4, start=0, on_block=blocks.append)
        for offset, update in enumerate(with_resets):
            shard.feed(offset, update)
    late = sum(1 for o in LATE if with_resets[o] and with_resets[o].key.domain == "route" and with_resets[o].mode == "live")
    assert sum(b.not_acted.get(BEFORE_RESET, 0) for b in blocks) == late


@pytest.mark.parametrize("cut", [2199, 2250], ids=["published-before-the-marker", "after-it"])
def test_a_shard_rebuilt_from_states_published_after_a_reset_still_skips_rows_decided_before_it(tmp_path, cut):
    """Published after the marker, a rebuilt shard never reads the marker again: only the
    ``reset_time`` published with each model tells it which later rows to leave out."""
    with_resets, without = timed_streams()
    reference, _, _ = fold(tmp_path / "reference", without)
    with PosteriorStore(tmp_path / "old") as store:
        old = ShardLearner(0, "u", DOMAINS, store.shard(0), block_size=64, window_blocks=4, start=0)
        for offset in range(cut):
            old.feed(offset, with_resets[offset])
        published = {m.key: m for m in old.snapshot(old.keys())}
    assert {m.reset_time for k, m in published.items() if k.domain == "route"} == {2200 if cut > 2200 else 1000}
    with PosteriorStore(tmp_path / "new") as store:
        new = ShardLearner(0, "u", DOMAINS, store.shard(0), block_size=64, window_blocks=4, start=cut, persist_from=cut)
        for key, m in published.items():
            new.load_published(key, m.state.policy, m.state.dimension, m.state.feature_hash, m.state.state, m.reset_time)
        for offset in range(new.warm_offset(), len(with_resets)):
            new.feed(offset, with_resets[offset])
        rebuilt = {m.key: m.state.update_count for m in new.snapshot(new.keys())}
    assert {k: rebuilt[k] for k in reference} == {k: count for k, (count, _) in reference.items()}


def test_the_marker_is_not_a_decision_for_any_reader():
    record = reset_marker("default", "main", "route", now_ms=1_700_000_000_000)
    serde = AvroSerde("update", framing="single_object")
    decoded = serde.decode(serde.encode(record))
    assert is_reset(decoded) and decoded["mode"] == "off" and decoded["features"] == []
    assert not is_reset(serde.decode(serde.encode({**record, "reset": False})))


def test_add_arm_holds_an_arm_at_its_prior_and_keeps_one_that_learned():
    policy = h.domain_settings()["route"].make_policy()
    policy.update_batch(np.ones((3, h.DIM)), ["gpt", "gpt", "small"], np.array([1.0, 0.0, 1.0]))
    learned = policy.arm_state_bytes("gpt")
    policy.add_arm("gpt")
    policy.add_arm("new")
    assert policy.arm_state_bytes("gpt") == learned
    assert policy.update_count("new") == 0 and policy.arm_state_bytes("new") == prior_state(ArmKey("default", "main", "route", "new"))


# -- the real broker ------------------------------------------------------------------------------


@pytest.mark.integration
def test_reset_markers_on_every_partition_reset_the_domain_in_the_learner_and_its_posterior(kafka, topics, tmp_path):
    from publisher.worker import PosteriorTable

    ensure_topics(kafka, topics)
    serde = AvroSerde("update", framing="single_object")
    first = h.make_updates(2000, seed=11, prefix="a", modes=False)
    produced_first = h.produce(kafka, topics.updates, h.encode_updates(first))
    config = h.worker_config(kafka, topics, tmp_path, group_id="reset-t1", block_size=64)

    with learner_in_thread(config) as learner:
        h.wait_published(kafka, "reset-t1", topics, produced_first.ends(), timeout=90)
        table = PosteriorTable("default", "main", h.DOMAINS)
        for record in h.latest_posterior(kafka, topics).values():
            table.put(record)
        learned_before = table.learned("route")

        landed = send_reset(kafka, topics.updates, serde, "default", "main", "route")
        assert sorted(landed) == list(range(topics.update_partitions))
        after = int(time.time() * 1000) + 1
        second = [{**u, "decision_time": after + i} for i, u in enumerate(h.make_updates(600, seed=12, prefix="b", modes=False))]
        # route decisions made before the reset whose updates reach the log after it (decided
        # in 2023, like the first ones): the reset discarded them, so they are not learned
        late = [u for u in h.make_updates(300, seed=13, prefix="late", modes=False) if u["domain"] == "route"]
        produced_second = h.produce(kafka, topics.updates, h.encode_updates(late + second))
        ends = produced_second.ends()
        h.wait_published(kafka, "reset-t1", topics, {p: max(ends.get(p, 0), o + 1) for p, o in landed.items()}, timeout=90)
        resets = h.metric(learner.metrics.port, "banditstream_learner_resets_total", domain="route")
        skipped = h.metric(learner.metrics.port, "banditstream_updates_not_learned_total", mode="before_reset")

    assert resets == topics.update_partitions and skipped == len(late) > 0
    published = h.latest_posterior(kafka, topics)
    # route learned only what came after its markers; the other domains everything
    kept = [u for u in first if u["domain"] != "route"] + second
    placed = [w for u, w in zip(first, produced_first.placed) if u["domain"] != "route"] + produced_second.placed[len(late):]
    expected = h.reference(kept, placed)
    assert {k: r["update_count"] for k, r in published.items() if k in expected} == {
        k: p.update_count(k.arm) for k, p in expected.items()
    }
    h.assert_matches_reference({k: r for k, r in published.items() if k in expected}, expected)
    # each route model carries the reset's time, for a rebuild that will not read the marker again
    assert len({r["reset_time"] for k, r in published.items() if k.domain == "route"}) == 1
    assert all(0 < r["reset_time"] < after for k, r in published.items() if k.domain == "route")
    for key in set(published) - set(expected):  # a route arm no update reached since the reset
        assert key.domain == "route" and published[key]["update_count"] == 0

    # The publisher's table follows the reset though the counts went down.
    for record in published.values():
        table.put(record)
    assert learned_before > table.learned("route") == sum(u["domain"] == "route" for u in second)

    # Evaluation reads decisions: the markers are counted and left out.
    updates, report = read_updates(kafka, topics.updates, serde)
    assert len(updates) == len(first) + len(late) + len(second) and report.resets == topics.update_partitions
    assert not any(is_reset(u) for u in updates)


@pytest.mark.parametrize("cuts", [(2199,), (2199, 2205)], ids=["published-before-the-marker", "and-after-it"])
def test_a_shard_rebuilt_from_published_states_applies_a_marker_only_to_models_published_before_it(tmp_path, cuts):
    """A rebuild resumes each model at its own watermark: a model published after the marker
    (at 2200) already holds the reset and what it learned since, one published before it still
    needs the reset."""
    with_resets, _ = streams_with_and_without_resets()
    whole, _, _ = fold(tmp_path / "whole", with_resets)

    # The previous owner publishes everything at the first cut, then at each later one what
    # changed since (every route model, through its reset), and is lost.
    with PosteriorStore(tmp_path / "old") as store:
        old = ShardLearner(0, "u", DOMAINS, store.shard(0), block_size=64, window_blocks=4, start=0)
        published = {}
        for cut in cuts:
            for offset in range(old.position, cut):
                old.feed(offset, with_resets[offset])
            keys = old.keys() if not published else sorted(old.dirty)
            published.update({m.key: (m.state, cut) for m in old.snapshot(keys)})
            old.dirty.clear()
    floors = {key: watermark for key, (_, watermark) in published.items()}
    assert {floors[k] for k in floors if k.domain == "route"} == {cuts[-1]}
    assert min(floors.values()) == 2199  # so the rebuilt shard reads the marker again
    learned_since = [o for o in range(2201, cuts[-1]) if with_resets[o] and with_resets[o].key.domain == "route"]
    assert bool(learned_since) == (len(cuts) > 1)  # rows a second reset would lose

    with PosteriorStore(tmp_path / "new") as store:
        new = ShardLearner(0, "u", DOMAINS, store.shard(0), block_size=64, window_blocks=4, start=min(floors.values()),
                           floors=floors, persist_from=max(floors.values()))  # fmt: skip
        for key, (state, _) in published.items():
            new.load_published(key, state.policy, state.dimension, state.feature_hash, state.state)
        for offset in range(new.warm_offset(), len(with_resets)):
            new.feed(offset, with_resets[offset])
        rebuilt = {m.key: m.state for m in new.snapshot(new.keys())}

    # Exact in what was learned (every update once, the 2200 reset once); the statistics agree to
    # rounding, since the old owner's trailing block was cut where it published.
    assert {k: s.update_count for k, s in rebuilt.items()} == {k: count for k, (count, _) in whole.items()}
    settings = h.domain_settings()
    for key, state in rebuilt.items():
        mine, theirs = settings[key.domain].make_policy(), settings[key.domain].make_policy()
        mine.load_arm_state(key.arm, state.state)
        theirs.load_arm_state(key.arm, whole[key][1])
        for name, value in theirs.arm_statistics(key.arm).items():
            np.testing.assert_allclose(mine.arm_statistics(key.arm)[name], value, rtol=1e-9, atol=1e-9, err_msg=f"{key} {name}")


def test_a_reset_before_any_block_closes_marks_every_model_of_the_domain_changed(tmp_path):
    """With nothing persisted yet (one long trailing block) and the learned models just
    published, a marker still marks every model of its domain changed, so each is published
    again at its priors (a learner with a large block size, a quiet domain)."""
    with_resets, _ = streams_with_and_without_resets()
    with PosteriorStore(tmp_path / "store") as store:
        shard = ShardLearner(0, "u", DOMAINS, store.shard(0), block_size=4096, window_blocks=4, start=0)
        for offset in range(0, 900):
            shard.feed(offset, with_resets[offset])
        route = {k for k in shard.dirty if k.domain == "route"}
        assert route and shard.keys() == []  # nothing committed: every model lives in the trailing block
        shard.snapshot(sorted(shard.dirty))
        shard.dirty.clear()  # published
        shard.feed(900, None)
        shard.feed(901, marker(901, "route"))
        assert route <= shard.dirty
        published = {m.key: m.state for m in shard.snapshot(sorted(shard.dirty))}
    assert all(published[k].update_count == 0 and published[k].state == prior_state(k) for k in route)

"""The join's state machine (streams._join_state) driven directly, on real RocksDB files.

What the worker keeps in memory between batches (decoded waiting decisions, the update of a
decision pickled once) must change nothing: the UpdateEvents, the dead letters and every
byte in the database come out the same with that cache off, tiny, or larger than the state,
and across a restart that starts from the database alone.
"""

from __future__ import annotations

import pickle
import random
import time
from collections import Counter

import pytest
from rocksdict import Options, Rdict

from banditstream.config import Settings
from streams._join_state import (
    DeadLetter,
    JoinCore,
    JoinOptions,
    Outputs,
    PartitionState,
    decode_entry,
    encode_entry,
)
from tests.join_helpers import DOMAINS, decision, reward

T0 = 1_800_000_000_000
WINDOW_MS = 2000  # every test domain's window
GRACE_MS = int(JoinOptions().grace_s * 1000)


def join_core() -> JoinCore:
    return JoinCore(Settings.model_validate({"domains": DOMAINS}).worker_config().domains, JoinOptions())


def open_db(path) -> Rdict:
    return Rdict(str(path), options=Options(raw_mode=True))


def traffic(seed: int = 3, n: int = 600) -> list[tuple[int, str, dict]]:
    """(read time, topic, event) in read order: rewards in and after the window, early rewards
    (before their decision), stragglers (stamped in the window, read after it), duplicates
    of decisions and rewards, several rewards for one decision, rewards whose decision never
    comes."""
    rng = random.Random(seed)
    events = []
    for i in range(n):
        ts = T0 + 7 * i
        domain = rng.choice(sorted(DOMAINS))
        event_id = f"ev-{i:05d}"
        d = decision(event_id, domain, rng, ts)
        if i % 13 == 5:  # deferred: activated (early, in or after the window, twice) or never
            d["deferred"] = True
            if i % 39 != 5:
                delay = rng.choice((-20, 500, 2500))
                events.append((ts + delay, "rewards", activation(event_id, domain, rng, ts + delay)))
                if i % 26 == 5:
                    events.append((ts + delay + 9, "rewards", activation(event_id, domain, rng, ts + delay + 9)))
        events.append((ts, "decisions", d))
        if i % 17 == 0:
            events.append((ts + 3, "decisions", d))  # a duplicate decision
        for j in range(rng.choice((0, 1, 1, 1, 2, 3))):
            delay = rng.choice((-50, 10, 300, 1500, 2500))  # before, inside, after the window
            r = reward(event_id, f"{event_id}-r{j}", domain, rng, ts + delay)
            events.append((ts + delay, "rewards", r))
            if j == 1:
                events.append((ts + delay + 1, "rewards", dict(r)))  # a duplicate reward
        if i % 11 == 0:  # stamped inside the window, read after it closed: late all the same
            events.append((ts + 3000, "rewards", reward(event_id, f"{event_id}-s", domain, rng, ts + 100)))
        if i % 23 == 0:  # a reward whose decision never comes
            orphan = f"orphan-{i:05d}"
            events.append((ts, "rewards", reward(orphan, f"{orphan}-r", domain, rng, ts)))
    events.sort(key=lambda e: e[0])
    return events


def activation(event_id: str, domain: str, rng: random.Random, ts: int) -> dict:
    """What ``banditstream serve`` sends to activate a deferred decision."""
    from streams._join_state import ACTIVATION_REWARD_ID

    return {**reward(event_id, ACTIVATION_REWARD_ID, domain, rng, ts), "signals": {}, "value": None}


def replay(tmp_path, entry_cache: int, *, restart_at: int | None = None, tag: str = "") -> tuple[list, dict, Counter]:
    """Feed the traffic in batches of 40 as the worker does, then let every window close;
    (what came out, the database, entries written by kind).

    ``restart_at``: before that batch a new worker starts from the database alone, and, as
    the worker's consumer does, reads each topic again from where the state says to resume
    (``resume``): the records it had handled are replays, whose outputs are suppressed."""
    core, db = join_core(), open_db(tmp_path / f"db-{entry_cache}-{restart_at}{tag}")
    part = caught_up(PartitionState(0, db, core.domains, entry_cache))
    produced, writes = [], Counter()
    numbered, next_offset = [], {"decisions": 0, "rewards": 0}
    for ts, topic, event in traffic():
        numbered.append((ts, topic, next_offset[topic], event))
        next_offset[topic] += 1
    feed, b = list(numbered), 0
    while feed:
        if b == restart_at:  # a new worker: nothing in memory, the database as it was left
            part = PartitionState(0, db, core.domains, entry_cache)
            read = [e for e in numbered if e[2] >= part.resume.get(e[1], 0)]
            feed = read + [e for e in feed if e not in read]
        batch, feed = feed[:40], feed[40:]
        if b == (restart_at or 0) + 1:  # the reader reached both ends once since the restart
            caught_up(part)
        b += 1
        out, suppressed = Outputs(), Outputs()
        decisions = [e for _, topic, _, e in batch if topic == "decisions"]
        encoded = iter(core.encode(decisions))
        for ts, topic, offset, event in batch:
            sink = suppressed if part.replaying(topic, offset) else out
            part.handled(topic, offset)
            part.observe(topic == "decisions", event["timestamp"])
            source = DeadLetter(topic, 0, offset, event["event_id"].encode(), b"")
            if topic == "decisions":
                core.decision(part, event, source, sink, next(encoded))
            else:
                core.reward(part, event, source, sink)
        part.batch_read(batch[-1][0])
        core.fire(part, 0.0, out)
        produced.append((out.updates, [(d.topic, d.offset, d.reason) for d in out.dead], out.duplicates, out.late_rewards))
        persist(part, writes)
    out = Outputs()
    core.fire(part, 0.0, out, T0 + 10**9, T0 + 10**9)  # both topics read to their end, long quiet
    produced.append((out.updates, [(d.topic, d.offset, d.reason) for d in out.dead], out.duplicates, out.late_rewards))
    persist(part, writes)
    # Entries compared decoded: pickle shares repeated strings by identity, which differs
    # between objects decoded afresh and those kept in memory; the values do not.
    contents = {key: decode_entry(db[key])[:4] if key.startswith(b"e:") else pickle.loads(db[key]) if key == b"m:meta"
                else db[key] for key in db.keys()}
    db.close()
    return produced, contents, writes


def caught_up(part: PartitionState) -> PartitionState:
    """As a worker whose reader reached both topics' ends since it loaded the partition
    (before that, nothing fires: ``JoinOptions.catch_up_hold_max``)."""
    part.caught_up = {True: True, False: True}
    return part


def fire_until(core: JoinCore, part: PartitionState, out: Outputs, event_time: int) -> None:
    """Both topics read up to ``event_time`` (and to their ends once): what is due by then fires."""
    caught_up(part)
    part.observe(True, event_time)
    part.observe(False, event_time)
    part.batch_read(0.0)
    core.fire(part, 0.0, out)


def persist(part: PartitionState, writes: Counter) -> None:
    """The batch's changes into the database, as the worker writes them; entries counted by kind."""
    items = part.changes()
    for key, value in items:
        if value is not None and key.startswith(b"e:"):
            kind = value[:1].decode()
            writes[kind] += 1
            if kind == "D":
                writes["D", decode_entry(value)[2]["domain"]] += 1
    part.write(items)


def flattened(produced: list) -> tuple:
    """What came out regardless of batching: updates by event id, dead letters, counts."""
    updates = sorted((record["event_id"], shard, sorted(record.items())) for batch in produced for shard, record in batch[0])
    dead = sorted(d for batch in produced for d in batch[1])
    duplicates: dict[str, int] = {}
    for batch in produced:
        for kind, n in batch[2].items():
            duplicates[kind] = duplicates.get(kind, 0) + n
    return updates, dead, duplicates, sum(batch[3] for batch in produced)


def test_an_entry_held_in_memory_is_written_once_when_it_finishes(tmp_path):
    """entry_cache=0 writes every change (a decision opened, each reward attached, done); a
    cache that holds every open entry writes each decision once, done ("X"), except in a
    domain that normalises its features ("routing"), whose entries are written as before."""
    *_, every_change = replay(tmp_path, 0)
    *_, held = replay(tmp_path, 1_000_000)
    decisions = len({event["event_id"] for _, topic, event in traffic() if topic == "decisions"})
    assert every_change["D"] >= decisions and every_change["X"] == decisions and every_change["R"] > 0
    assert held["X"] == decisions and held["R"] == 0
    assert held["D", "ranker"] == held["D", "prompts"] == 0
    assert held["D", "routing"] == every_change["D", "routing"] > 0
    assert held["Z"] == every_change["Z"] > 0  # early rewards whose decision never came


@pytest.mark.parametrize("entry_cache", [0, 5, 1_000_000])
def test_entries_held_in_memory_change_nothing(tmp_path, entry_cache):
    reference = replay(tmp_path, 0, tag="-reference")  # every change written at once, read back every time
    produced, contents, _ = replay(tmp_path, entry_cache)
    assert produced == reference[0]
    assert contents == reference[1]
    updates = [u for batch in produced for u in batch[0]]
    statuses = {record["join_status"] for _, record in updates}
    reasons = {reason for batch in produced for _, _, reason in batch[1]}
    decisions = {event["event_id"] for _, topic, event in traffic() if topic == "decisions"}
    assert {record["event_id"] for _, record in updates} == decisions and len(updates) == len(decisions)
    assert statuses == {"rewarded", "default", "not_activated"}
    assert {"late_reward", "reward_without_decision"} <= reasons
    assert any(record["reward_count"] > 1 for _, record in updates)


@pytest.mark.parametrize("entry_cache", [0, 5, 1_000_000])
@pytest.mark.parametrize("restart_at", [1, 7, 20])
def test_a_restart_replays_what_was_held_and_outputs_each_thing_once(tmp_path, entry_cache, restart_at):
    """A new worker from the database alone, reading again from where the state resumes:
    every update, dead letter and count comes out exactly once, as without the restart."""
    reference, reference_contents, _ = replay(tmp_path, 0, tag="-reference")
    produced, contents, _ = replay(tmp_path, entry_cache, restart_at=restart_at)
    assert flattened(produced) == flattened(reference)
    assert contents == reference_contents


def test_held_entries_move_the_resume_point_back_and_finishing_them_forward(tmp_path):
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 100)
    rng = random.Random(1)
    events = [("decisions", decision(f"ev-{i}", "ranker", rng, T0 + i)) for i in range(3)]
    events.append(("rewards", reward("ev-1", "ev-1-r", "ranker", rng, T0 + 5)))
    for offset, (topic, event) in enumerate(events):
        part.handled(topic, offset)
        source = DeadLetter(topic, 0, offset, b"", b"")
        (core.decision if topic == "decisions" else core.reward)(part, event, source, Outputs())
    changes = dict(part.changes())
    assert not any(key.startswith(b"e:") for key in changes)  # held: nothing written
    assert pickle.loads(changes[b"m:meta"])["replay_from"] == {"decisions": 0, "rewards": 3}
    assert part.offsets == {"decisions": 3, "rewards": 4}
    out = Outputs()
    fire_until(core, part, out, T0 + WINDOW_MS + GRACE_MS + 10)
    changes = dict(part.changes())
    assert len(out.updates) == 3
    assert {decode_entry(v)[0] for k, v in changes.items() if k.startswith(b"e:")} == {"X"}
    assert pickle.loads(changes[b"m:meta"])["replay_from"] == {"decisions": 3, "rewards": 4}
    db.close()


def test_open_entries_past_the_cache_are_spilled_oldest_first_and_counted(tmp_path):
    """More open entries than ``entry_cache``: the oldest are written in full (what the worker
    counts and warns of); the resume point moves past them, as they no longer live in memory."""
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 5)
    rng = random.Random(2)
    for offset in range(12):
        part.handled("decisions", offset)
        event = decision(f"ev-{offset:02d}", "ranker", rng, T0 + offset)
        core.decision(part, event, DeadLetter("decisions", 0, offset, b"", b""), Outputs())
    changes = dict(part.changes())
    spilled = sorted(key for key, value in changes.items() if key.startswith(b"e:") and value[:1] == b"D")
    assert part.spilled == 7
    assert spilled == [f"e:ev-{i:02d}".encode() for i in range(7)]
    assert decode_entry(changes[spilled[0]])[2]["event_id"] == "ev-00"
    assert pickle.loads(changes[b"m:meta"])["replay_from"] == {"decisions": 7}
    part.changes()
    assert part.spilled == 0  # the count is the last batch's
    db.close()


def test_a_worker_that_dies_before_its_replay_reached_a_topic_leaves_that_topic_s_resume_point(tmp_path):
    """Records held only in memory by a worker that died are read again by the next; if that
    one dies too, having read again only the decisions, the rewards' resume point stays where it
    was, so the third reads them again as well (it moved to the rewards' stored offset: the
    join-faults test's third worker skipped 1,845 rewards and learned their decisions as default)."""
    core, db = join_core(), open_db(tmp_path / "db")
    rng = random.Random(2)
    records = [("decisions", 0, decision("ev-0", "ranker", rng, T0)), ("rewards", 0, reward("ev-0", "ev-0-r", "ranker", rng, T0 + 5))]

    def read(part: PartitionState, topics: tuple[str, ...]) -> PartitionState:
        for topic, offset, event in records:
            if topic in topics and offset >= part.position.get(topic, 0):
                part.handled(topic, offset)
                source = DeadLetter(topic, 0, offset, b"", b"")
                (core.decision if topic == "decisions" else core.reward)(part, event, source, Outputs())
        persist(part, Counter())
        return part

    read(PartitionState(0, db, core.domains, 100), ("decisions", "rewards"))  # held in memory, then killed
    second = PartitionState(0, db, core.domains, 100)
    assert second.resume == {"decisions": 0, "rewards": 0}
    read(second, ("decisions",))  # killed before its reader handed over a reward
    third = read(PartitionState(0, db, core.domains, 100), ("decisions", "rewards"))
    assert third.resume == {"decisions": 0, "rewards": 0}
    out = Outputs()
    fire_until(core, third, out, T0 + WINDOW_MS + GRACE_MS + 10)
    assert [(u["event_id"], u["join_status"]) for _, u in out.updates] == [("ev-0", "rewarded")]
    db.close()


def test_an_entry_written_before_the_update_was_pickled_apart_still_loads():
    update = {"event_id": "e1", "features": [0.5, -1.0], "_shard": "t/w/d/a"}
    rewards = {"r1": (T0, {"success": 1.0}, None)}
    entry = ["D", T0 + WINDOW_MS, update, rewards]
    old = b"D" + (T0 + WINDOW_MS).to_bytes(8, "big", signed=True) + pickle.dumps(entry, pickle.HIGHEST_PROTOCOL)
    assert decode_entry(old) == entry
    new = encode_entry(list(entry))
    assert new[:9] == old[:9]
    assert decode_entry(new)[:4] == entry


def test_early_rewards_that_gave_up_are_remembered_so_a_replay_does_not_dead_letter_them_again(tmp_path):
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 100)
    rng = random.Random(2)
    early = reward("ev-1", "ev-1-r", "prompts", rng, T0)
    keeper = decision("ev-0", "prompts", rng, T0)  # held open: keeps the resume point at 0

    def feed(topic, offset, event, out):
        sink = Outputs() if part.replaying(topic, offset) else out
        part.handled(topic, offset)
        source = DeadLetter(topic, 0, offset, b"", b"")
        (core.decision if topic == "decisions" else core.reward)(part, event, source, sink)

    out = Outputs()
    feed("decisions", 0, keeper, out)
    feed("rewards", 0, early, out)
    fire_until(core, part, out, T0 + WINDOW_MS + GRACE_MS)  # the clocks reach the windows' end plus grace only
    assert not out.dead and not out.updates
    fire_until(core, part, out, T0 + WINDOW_MS + GRACE_MS + 1)
    assert [d.reason for d in out.dead] == ["reward_without_decision"] and len(out.updates) == 1
    changes = dict(part.changes())
    assert decode_entry(changes[b"e:ev-1"])[0] == "Z"
    for key, value in changes.items():
        db[key] = value

    part = PartitionState(0, db, core.domains, 100)  # restart: both records are read again
    assert part.resume == {"decisions": 1, "rewards": 1}
    part = PartitionState(0, db, core.domains, 100)
    part.resume = part.position = {"decisions": 0, "rewards": 0}  # as if an older entry were held
    out = Outputs()
    feed("rewards", 0, early, out)
    assert part.get(b"e:ev-1")[0] == "Z" and not out.dead  # skipped: dead-lettered the first time
    late_decision = decision("ev-1", "prompts", rng, T0 + WINDOW_MS + 500)
    feed("decisions", 1, late_decision, out)  # after its reward gave up: opens afresh
    feed("rewards", 1, reward("ev-1", "ev-1-r2", "prompts", rng, T0 + WINDOW_MS + 600), out)
    fire_until(core, part, out, T0 + 10**6)
    assert [(u["event_id"], u["reward_count"]) for _, u in out.updates] == [("ev-1", 1)]
    db.close()


# -- clocks: event time, never the time records are read ---------------------------------


def pairs(seed: int, n: int, start: int) -> list[tuple[str, dict]]:
    """Decisions and their rewards merged in event-time order, as services log them: most
    rewarded inside the window (some twice), some never, some after the window closed."""
    rng = random.Random(seed)
    events = []
    for i in range(n):
        ts = start + 13 * i
        domain = ("ranker", "prompts")[i % 2]
        event_id = f"p-{i:05d}"
        events.append((ts, "decisions", decision(event_id, domain, rng, ts)))
        for j in range(rng.choice((0, 1, 1, 2))):
            delay = rng.choice((5, 400, 1900, 2600))  # the last after the window
            events.append((ts + delay, "rewards", reward(event_id, f"{event_id}-r{j}", domain, rng, ts + delay)))
    events.sort(key=lambda e: e[0])
    return [(topic, event) for _, topic, event in events]


def join_as_read(tmp_path, events, read_at, *, batch: int = 50, ends=lambda b: True, tag: str = "") -> dict:
    """Join ``events`` (in log order) as a worker reads them: in batches handed over at wall
    time ``read_at(i)`` of their first record; after batch ``b`` both topics are reported read
    to their end when ``ends(b)`` (the reader caught up with the producer). Then traffic stops.
    Returns event_id -> (status, reward, reward_count), and the dead letters' reasons."""
    core, db = join_core(), open_db(tmp_path / f"clock-db{tag}")
    part = PartitionState(0, db, core.domains, 1_000_000)
    offsets = {"decisions": 0, "rewards": 0}
    out = Outputs()
    encoded = iter(core.encode([e for topic, e in events if topic == "decisions"]))
    for b, first in enumerate(range(0, len(events), batch)):
        wall = read_at(first)
        for topic, event in events[first : first + batch]:
            offset = offsets[topic]
            offsets[topic] += 1
            part.handled(topic, offset)
            part.observe(topic == "decisions", event["timestamp"])
            source = DeadLetter(topic, 0, offset, event["event_id"].encode(), b"")
            if topic == "decisions":
                core.decision(part, event, source, out, next(encoded))
            else:
                core.reward(part, event, source, out)
        part.batch_read(wall)
        end = wall if ends(b) else None
        core.fire(part, wall, out, end, end)
        part.changes()
    quiet = read_at(len(events)) + 10**7
    core.fire(part, quiet, out, quiet, quiet)
    db.close()
    joined = {u["event_id"]: (u["join_status"], u["reward"], u["reward_count"]) for _, u in out.updates}
    assert len(joined) == len(out.updates)  # one update per decision
    return {"updates": joined, "dead": Counter(d.reason for d in out.dead)}


def test_a_backlog_stamped_an_hour_ago_joins_as_the_same_events_did_live(tmp_path):
    """Live: each record read as it is stamped, the reader at the end after every batch.
    Backlog: the same log an hour later at full speed (a spool drained, a producer catching
    up), the reader now and then catching up with the producer. The same updates come out."""
    events = pairs(5, 3000, T0)
    live = join_as_read(tmp_path, events, lambda i: events[min(i, len(events) - 1)][1]["timestamp"] + 30, tag="live")
    # The backlog's rewards reach the broker behind its decisions (another partition's
    # batches still in flight: here 500 records, ~3 s of event time, more than the grace)
    # while the reader reports both partitions read to their end.
    lagging = [e for _, e in sorted(enumerate(events), key=lambda x: x[0] + 500 * (x[1][0] == "rewards"))]
    rng = random.Random(9)
    later = T0 + 3_600_000
    backlog = join_as_read(tmp_path, lagging, lambda i: later + i // 100, ends=lambda b: rng.random() < 0.3,
                           tag="backlog")
    assert backlog == live
    statuses = Counter(status for status, _, _ in live["updates"].values())
    assert len(live["updates"]) == 3000 and statuses["rewarded"] > 1500 and statuses["default"] > 300
    assert live["dead"]["late_reward"] > 100 and set(live["dead"]) == {"late_reward"}


def test_a_backlog_whose_rewards_are_in_flight_longer_than_the_margin_joins_as_live(tmp_path):
    """A backlog produced at full speed by a loaded producer: its decisions reach the broker
    and are read within 100 ms, its rewards 1.5 s later (acknowledged late: more than the
    in-flight margin), while the reader reports both topics read to their end. Decisions
    handed over the margin ago must not carry the reward clock 26 s of event time ahead:
    a settled clock runs at wall-clock speed from the newest record read. (Found by the soak:
    a few hundred backlog decisions learned their default, their rewards dead-lettered late.)"""
    events = pairs(11, 2000, T0)
    live = join_as_read(tmp_path, events, lambda i: events[min(i, len(events) - 1)][1]["timestamp"] + 30, tag="live")
    decisions = [e for e in events if e[0] == "decisions"]
    rewards = [e for e in events if e[0] == "rewards"]
    later = T0 + 3_600_000
    n = len(decisions)
    backlog = join_as_read(tmp_path, decisions + rewards,
                           lambda i: later + i // 20 if i < n else later + 1500 + (i - n) // 20, tag="backlog")
    assert backlog == live
    assert sum(status == "rewarded" for status, _, _ in live["updates"].values()) > 1000


def test_a_settled_clock_runs_at_wall_speed_from_the_first_record_read(tmp_path):
    """Decisions of a backlog read at 10 s of event time per wall second, no reward read yet,
    the rewards reported read to their end: the reward clock follows at wall speed from the
    first decision read, not at the backlog's speed."""
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    margin = int(JoinOptions().in_flight_margin_s * 1000)
    wall = T0 + 3_600_000
    for i in range(50):  # 100 ms of wall, 1 s of event time each
        for k in range(10):
            part.observe(True, T0 + 1000 * i + 100 * k)
        part.batch_read(wall + 100 * i)
        part.advance(None, wall + 100 * i, margin)
        assert part.reward_clock <= T0 + max(0, 100 * i - margin)
    assert part.reward_clock == T0 + 49 * 100 - margin
    db.close()


def test_decisions_never_rewarded_get_their_default_once_later_decisions_are_read(tmp_path):
    """A domain whose rewards never come: the rewards partition is read to its end, so the
    reward clock follows the decisions handed over at least the in-flight margin before."""
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    rng = random.Random(4)
    options = JoinOptions()
    margin = int(options.in_flight_margin_s * 1000)
    out = Outputs()
    for i in range(200):  # one decision every 100 ms, each read 50 ms after its stamp
        ts = T0 + 100 * i
        event = decision(f"d-{i}", "ranker", rng, ts)
        part.handled("decisions", i)
        part.observe(True, ts)
        core.decision(part, event, DeadLetter("decisions", 0, i, b"", b""), out)
        part.batch_read(ts + 50)
        core.fire(part, ts + 50, out, None, ts + 50)  # rewards read to their end; decisions never quite
        done = {u["event_id"] for _, u in out.updates}
        # d-k is due once a decision stamped after its window end plus grace was handed over
        # at least the margin ago: about (window + grace + margin) / 100 ms decisions later
        due = {f"d-{k}" for k in range(i + 1) if T0 + 100 * k + WINDOW_MS + GRACE_MS < ts - margin - 50}
        assert due <= done <= {f"d-{k}" for k in range(i + 1) if T0 + 100 * k + WINDOW_MS + GRACE_MS < ts}
    assert len(out.updates) > 100 and all(u["join_status"] == "default" for _, u in out.updates)
    db.close()


def test_a_quiet_partition_follows_the_wall_clock_from_its_newest_event_after_the_margin(tmp_path):
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    margin = int(JoinOptions().in_flight_margin_s * 1000)
    part.handled("decisions", 0)
    part.observe(True, T0 - 3_600_000)  # an old event, read now
    part.batch_read(T0)
    part.advance(T0 + margin, T0 + margin, margin)  # read to both ends, quiet only for the margin
    assert part.reward_clock == part.decision_clock == T0 - 3_600_000
    part.advance(T0 + margin + 500, T0 + margin + 400, margin)
    assert part.reward_clock == part.decision_clock == T0 - 3_600_000 + 400  # the earlier end of the two
    part.advance(None, T0 + 10**6, margin)  # decisions not known read to their end: no quiet rule
    assert part.reward_clock == T0 - 3_600_000 + 400
    db.close()


def test_a_broker_away_is_no_quiet_the_wall_clock_counts_from_its_return(tmp_path):
    """Read at T0, then the broker froze for 15 s and is heard again at T0 + 15 s: the
    partition is read to its end right after that, but the records its producers held
    meanwhile (stamped T0..T0 + 15 s) are only now reaching it. Counting the freeze as quiet
    would jump both clocks 15 s and fire defaults for their decisions the moment they are read
    (the memory-storage soak: 1,054 decisions learned as default around two freezes)."""
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    margin = int(JoinOptions().in_flight_margin_s * 1000)
    part.handled("decisions", 0)
    part.observe(True, T0)
    part.batch_read(T0)
    back = T0 + 15_000
    part.advance(back + 200, back + 200, margin, resumed_ms=back)  # read to its end 0.2 s after the return
    assert part.reward_clock == part.decision_clock == T0  # no quiet yet: within the margin of the return
    part.advance(back + margin + 300, back + margin + 300, margin, resumed_ms=back)
    assert part.reward_clock == part.decision_clock == T0 + 300  # quiet counted from the return only
    without = PartitionState(1, db, core.domains, 1000)  # the same reads, the outage not known
    without.handled("decisions", 0)
    without.observe(True, T0)
    without.batch_read(T0)
    without.advance(back + 200, back + 200, margin)
    assert without.reward_clock == T0 + 15_000 + 200 - margin  # what the outage would have cost
    db.close()


def test_no_clock_passes_the_cap_an_outage_sets_until_it_is_lifted(tmp_path):
    """After a freeze, one producer's batch stamped 19 s into it can be read before another's
    stamped at its start: the cap (the last time the broker was heard, less the margin) holds
    both clocks, so no window closes on rewards still on their way; lifted, they move again."""
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    part.handled("rewards", 0)
    part.observe(False, T0)
    part.batch_read(T0)
    assert part.reward_clock == T0
    part.clock_cap = T0 + 200.0  # heard last at T0 + 1.2 s, margin 1 s
    part.observe(False, T0 + 19_000)  # the first producer's held batch
    part.batch_read(T0 + 20_000)
    assert part.reward_clock == T0 + 200
    part.advance(T0 + 40_000, T0 + 40_000, 1000)  # read to both ends, quiet for long: still capped
    assert part.reward_clock == part.decision_clock == T0 + 200
    part.clock_cap = None
    part.observe(False, T0 + 19_500)
    part.batch_read(T0 + 21_000)
    assert part.reward_clock == T0 + 19_500
    db.close()


def restart_into_an_outage(tmp_path, options: JoinOptions, tag: str) -> dict[str, str]:
    """A join started after an outage it never saw: the log it reads holds decisions stamped
    T0..T0 + 1 s, then what producers sent when the broker came back 20 s later, one
    producer's recent records (stamped T0 + 20 s) before another's held rewards for the early
    decisions (stamped T0 + 0.5..1.5 s). Read in two batches, the ends known only after the
    second. Returns event_id -> join status."""
    core = JoinCore(Settings.model_validate({"domains": DOMAINS}).worker_config().domains, options)
    db = open_db(tmp_path / f"db-{tag}")
    part = PartitionState(0, db, core.domains, 1000)
    rng = random.Random(6)
    early = [("decisions", decision(f"d-{i}", "ranker", rng, T0 + 100 * i)) for i in range(10)]
    recent = [("decisions", decision(f"n-{i}", "ranker", rng, T0 + 20_000 + i)) for i in range(10)]
    recent += [("rewards", reward(f"n-{i}", f"n-{i}-r", "ranker", rng, T0 + 20_100 + i)) for i in range(10)]
    held = [("rewards", reward(f"d-{i}", f"d-{i}-r", "ranker", rng, T0 + 100 * i + 500)) for i in range(10)]
    offsets, out = {"decisions": 0, "rewards": 0}, Outputs()
    wall = T0 + 30_000
    for batch, ends in ((early + recent, None), (held, wall + 5000)):
        encoded = iter(core.encode([e for topic, e in batch if topic == "decisions"]))
        for topic, event in batch:
            part.handled(topic, offsets[topic])
            part.observe(topic == "decisions", event["timestamp"])
            source = DeadLetter(topic, 0, offsets[topic], event["event_id"].encode(), b"")
            offsets[topic] += 1
            if topic == "decisions":
                core.decision(part, event, source, out, next(encoded))
            else:
                core.reward(part, event, source, out)
        part.batch_read(wall)
        core.fire(part, wall, out, ends, ends)
        wall += 5000
    core.fire(part, wall + 10**7, out, wall + 10**7, wall + 10**7)
    db.close()
    return {u["event_id"]: u["join_status"] for _, u in out.updates}


def test_a_restart_fires_nothing_before_its_rewards_were_read_to_their_end_once(tmp_path):
    """The soak's default seed: the join killed at the end of two back-to-back broker freezes
    and restarted; it read a reward stamped 38 s ago after rewards stamped 20 s later and,
    knowing nothing of the freezes, closed 1,273 windows with their rewards in the log."""
    statuses = restart_into_an_outage(tmp_path, JoinOptions(), "held")
    assert statuses == {**{f"d-{i}": "rewarded" for i in range(10)}, **{f"n-{i}": "rewarded" for i in range(10)}}
    unheld = restart_into_an_outage(tmp_path, JoinOptions(catch_up_hold_max=0), "unheld")
    assert [unheld[f"d-{i}"] for i in range(10)] == ["default"] * 10  # what the hold prevents


def test_the_clocks_are_stored_and_a_restart_starts_from_them(tmp_path):
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    part.handled("rewards", 0)
    part.observe(False, T0 + 7)
    part.handled("decisions", 0)
    part.observe(True, T0 + 5)
    part.batch_read(T0 + 100)
    for key, value in part.changes():
        db[key] = value
    before = time.time() * 1000
    again = PartitionState(0, db, core.domains, 1000)
    assert (again.reward_clock, again.decision_clock, again.stream_time) == (T0 + 7, T0 + 5, T0 + 7)
    assert before <= again.last_read <= time.time() * 1000  # quiet counts from the start: never the downtime
    db.close()


def test_a_reward_stamped_before_its_decision_by_more_than_the_skew_is_refused(tmp_path):
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    rng = random.Random(6)
    skew = int(JoinOptions().max_clock_skew_s * 1000)
    out = Outputs()
    core.decision(part, decision("e", "ranker", rng, T0), DeadLetter("decisions", 0, 0, b"", b""), out)
    for offset, ts in enumerate((T0 - skew - 1, T0 - skew, T0 + 10)):
        core.reward(part, reward("e", f"r{offset}", "ranker", rng, ts), DeadLetter("rewards", 0, offset, b"", b""), out)
    fire_until(core, part, out, T0 + 10**6)
    assert [d.reason for d in out.dead] == ["reward_before_decision"]
    assert [u["reward_count"] for _, u in out.updates] == [2]
    db.close()


def test_a_decision_older_than_the_join_remembers_is_refused_not_learned_twice(tmp_path):
    """Past its window, grace and done_retention_s, a decision's done marker would be purged:
    a re-send could not be told from a first sending, so it is refused (expired_decision)."""
    from streams._join_state import JoinError

    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    rng = random.Random(7)
    options = JoinOptions()
    forget = WINDOW_MS + GRACE_MS + int(options.done_retention_s * 1000)
    out = Outputs()
    core.decision(part, decision("now", "ranker", rng, T0), DeadLetter("decisions", 0, 0, b"", b""), out)
    part.observe(True, T0)
    part.batch_read(0.0)
    core.decision(part, decision("old-but-known", "ranker", rng, T0 - forget), DeadLetter("decisions", 0, 1, b"", b""), out)
    with pytest.raises(JoinError) as refused:
        core.decision(part, decision("too-old", "ranker", rng, T0 - forget - 1), DeadLetter("decisions", 0, 2, b"", b""), out)
    assert refused.value.reason == "expired_decision"
    core.decision(part, decision("now", "ranker", rng, T0), DeadLetter("decisions", 0, 3, b"", b""), out)
    assert out.duplicates == {"decision": 1} and out.duplicate_samples == {"decision": "now"}
    db.close()


def test_an_activation_of_a_decision_not_deferred_changes_nothing(tmp_path):
    """``banditstream serve`` activates an event it did not rank itself in case it was
    deferred: for a decision that was not, the activation is counted, never a reward."""
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    rng = random.Random(8)
    out = Outputs()
    core.decision(part, decision("e", "ranker", rng, T0), DeadLetter("decisions", 0, 0, b"", b""), out)
    core.reward(part, activation("e", "ranker", rng, T0 + 5), DeadLetter("rewards", 0, 0, b"", b""), out)
    core.reward(part, reward("e", "r1", "ranker", rng, T0 + 10), DeadLetter("rewards", 0, 1, b"", b""), out)
    fire_until(core, part, out, T0 + WINDOW_MS + GRACE_MS + 1)
    core.reward(part, activation("e", "ranker", rng, T0 + 20), DeadLetter("rewards", 0, 2, b"", b""), out)
    assert out.activations == 2 and not out.dead and not out.duplicates
    assert [(u["join_status"], u["reward_count"]) for _, u in out.updates] == [("rewarded", 1)]
    db.close()


def deferred(event_id: str, rng: random.Random, ts: int) -> dict:
    return {**decision(event_id, "ranker", rng, ts), "deferred": True}


def test_a_deferred_decision_waits_for_its_activation_and_its_window_runs_from_it(tmp_path):
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    rng = random.Random(9)
    out = Outputs()
    activated_at = T0 + 3 * WINDOW_MS
    core.decision(part, deferred("e", rng, T0), DeadLetter("decisions", 0, 0, b"", b""), out)
    core.reward(part, reward("e", "before", "ranker", rng, T0 + 100), DeadLetter("rewards", 0, 0, b"", b""), out)
    fire_until(core, part, out, activated_at - 1)  # long past a window from the decision
    assert not out.updates
    core.reward(part, activation("e", "ranker", rng, activated_at), DeadLetter("rewards", 0, 1, b"", b""), out)
    core.reward(part, activation("e", "ranker", rng, activated_at + 1), DeadLetter("rewards", 0, 2, b"", b""), out)
    core.reward(part, reward("e", "in", "ranker", rng, activated_at + WINDOW_MS), DeadLetter("rewards", 0, 3, b"", b""), out)
    core.reward(part, reward("e", "late", "ranker", rng, activated_at + WINDOW_MS + 1), DeadLetter("rewards", 0, 4, b"", b""), out)
    fire_until(core, part, out, activated_at + WINDOW_MS + GRACE_MS)
    assert not out.updates  # the window from the activation, plus grace
    fire_until(core, part, out, activated_at + WINDOW_MS + GRACE_MS + 1)
    [(_, update)] = out.updates
    assert (update["join_status"], update["reward_count"]) == ("rewarded", 2)  # "before" and "in"
    assert update["reward_time"] == activated_at + WINDOW_MS and "_deferred" not in update
    assert [(d.offset, d.reason) for d in out.dead] == [(4, "late_reward")]
    assert out.activations == 2 and out.duplicates == {"activation": 1}
    db.close()


def test_a_deferred_decision_never_activated_is_kept_for_evaluation_not_learned(tmp_path):
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    rng = random.Random(10)
    wait = int(JoinOptions().activation_wait_s * 1000)
    out = Outputs()
    core.decision(part, deferred("e", rng, T0), DeadLetter("decisions", 0, 0, b"", b""), out)
    core.reward(part, reward("e", "r", "ranker", rng, T0 + 100), DeadLetter("rewards", 0, 0, b"", b""), out)
    fire_until(core, part, out, T0 + wait + GRACE_MS)
    assert not out.updates
    fire_until(core, part, out, T0 + wait + GRACE_MS + 1)
    [(_, update)] = out.updates
    assert (update["join_status"], update["reward_count"]) == ("not_activated", 1)
    core.reward(part, activation("e", "ranker", rng, T0 + wait + 5), DeadLetter("rewards", 0, 1, b"", b""), out)
    assert [(d.offset, d.reason) for d in out.dead] == [(1, "late_activation")]
    db.close()


def test_an_activation_read_before_its_deferred_decision_activates_it(tmp_path):
    core, db = join_core(), open_db(tmp_path / "db")
    part = PartitionState(0, db, core.domains, 1000)
    rng = random.Random(11)
    out = Outputs()
    core.reward(part, reward("e", "r", "ranker", rng, T0 + 40), DeadLetter("rewards", 0, 0, b"", b""), out)
    core.reward(part, activation("e", "ranker", rng, T0 + 50), DeadLetter("rewards", 0, 1, b"", b""), out)
    core.decision(part, deferred("e", rng, T0), DeadLetter("decisions", 0, 0, b"", b""), out)
    fire_until(core, part, out, T0 + 50 + WINDOW_MS + GRACE_MS + 1)
    [(_, update)] = out.updates
    assert (update["join_status"], update["reward_count"]) == ("rewarded", 1)
    assert not out.dead
    db.close()

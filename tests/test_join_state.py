"""The join's state machine (streams._join_state) driven directly, on real RocksDB files.

What the worker keeps in memory between batches (decoded waiting decisions, the update of a
decision pickled once) must change nothing: the UpdateEvents, the dead letters and every
byte in the database come out the same with that cache off, tiny, or larger than the state,
and across a restart that starts from the database alone.
"""

from __future__ import annotations

import pickle
import random
from collections import Counter

import pytest
from rocksdict import Options, Rdict, WriteBatch

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


def replay(tmp_path, entry_cache: int, *, restart_at: int | None = None, tag: str = "") -> tuple[list, dict, Counter]:
    """Feed the traffic in batches of 40 as the worker does, then let every window close;
    (what came out, the database, entries written by kind).

    ``restart_at``: before that batch a new worker starts from the database alone, and, as
    the worker's consumer does, reads each topic again from where the state says to resume
    (``resume``): the records it had handled are replays, whose outputs are suppressed."""
    core, db = join_core(), open_db(tmp_path / f"db-{entry_cache}-{restart_at}{tag}")
    part = PartitionState(0, db, core.domains, entry_cache)
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
        b += 1
        out, suppressed = Outputs(), Outputs()
        decisions = [e for _, topic, _, e in batch if topic == "decisions"]
        encoded = iter(core.encode(decisions))
        newest = None
        for ts, topic, offset, event in batch:
            sink = suppressed if part.replaying(topic, offset) else out
            part.handled(topic, offset)
            source = DeadLetter(topic, 0, offset, event["event_id"].encode(), b"")
            if topic == "decisions":
                core.decision(part, event, source, sink, next(encoded))
                newest = ts
            else:
                core.reward(part, event, source, sink)
        core.fire(part, 0.0, out, newest, None, batch[-1][0])
        produced.append((out.updates, [(d.topic, d.offset, d.reason) for d in out.dead], out.duplicates, out.late_rewards))
        persist(part, db, writes)
    out = Outputs()
    core.fire(part, 0.0, out, T0 + 10**9, None, T0 + 10**9)
    produced.append((out.updates, [(d.topic, d.offset, d.reason) for d in out.dead], out.duplicates, out.late_rewards))
    persist(part, db, writes)
    # Entries compared decoded: pickle shares repeated strings by identity, which differs
    # between objects decoded afresh and those kept in memory; the values do not.
    contents = {key: decode_entry(db[key])[:4] if key.startswith(b"e:") else db[key] for key in db.keys()}
    db.close()
    return produced, contents, writes


def persist(part: PartitionState, db: Rdict, writes: Counter) -> None:
    """The batch's changes into the database, as the worker writes them; entries counted by kind."""
    write = WriteBatch(raw_mode=True)
    for key, value in part.changes():
        if value is None:
            write.delete(key)
        else:
            write.put(key, value)
            if key.startswith(b"e:"):
                kind = value[:1].decode()
                writes[kind] += 1
                if kind == "D":
                    writes["D", decode_entry(value)[2]["domain"]] += 1
    db.write(write)


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
    assert statuses == {"rewarded", "default"}
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
    core.fire(part, 0.0, out, T0 + WINDOW_MS + 10, None, T0 + WINDOW_MS + 10)
    changes = dict(part.changes())
    assert len(out.updates) == 3
    assert {decode_entry(v)[0] for k, v in changes.items() if k.startswith(b"e:")} == {"X"}
    assert pickle.loads(changes[b"m:meta"])["replay_from"] == {"decisions": 3, "rewards": 4}
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
    core.fire(part, 0.0, out, None, None, T0 + WINDOW_MS - 1)  # the clock reaches the reward's expiry only
    part.advance(T0 + WINDOW_MS, None, None)
    core.fire(part, 0.0, out, None, None, None)
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
    core.fire(part, 0.0, out, T0 + 10**6, None, T0 + 10**6)
    assert [(u["event_id"], u["reward_count"]) for _, u in out.updates] == [("ev-1", 1)]
    db.close()

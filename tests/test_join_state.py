"""The join's state machine (streams._join_state) driven directly, on real RocksDB files.

What the worker keeps in memory between batches (decoded waiting decisions, the update of a
decision pickled once) must change nothing: the UpdateEvents, the dead letters and every
byte in the database come out the same with that cache off, tiny, or larger than the state,
and across a restart that starts from the database alone.
"""

from __future__ import annotations

import pickle
import random

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


def traffic(seed: int = 3, n: int = 600) -> list[tuple[int, str, dict]]:
    """(read time, topic, event) in read order: rewards in and after the window, early rewards
    (before their decision), stragglers (stamped in the window, read after it), duplicates
    of decisions and rewards, several rewards for one decision."""
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
    events.sort(key=lambda e: e[0])
    return events


def replay(tmp_path, entry_cache: int, *, restart_at: int | None = None) -> tuple[list, dict]:
    """Feed the traffic in batches of 40 as the worker does; (what came out, the database)."""
    domains = Settings.model_validate({"domains": DOMAINS}).worker_config().domains
    core = JoinCore(domains, JoinOptions())
    db = Rdict(str(tmp_path / f"db-{entry_cache}-{restart_at}"), options=Options(raw_mode=True))
    part = PartitionState(0, db, core.domains, entry_cache)
    produced = []
    events = traffic()
    for b, start in enumerate(range(0, len(events), 40)):
        if b == restart_at:  # a new worker: nothing in memory, the database as it was left
            part = PartitionState(0, db, core.domains, entry_cache)
        batch = events[start : start + 40]
        out = Outputs()
        decisions = [e for _, topic, e in batch if topic == "decisions"]
        encoded = iter(core.encode(decisions))
        newest = None
        for offset, (ts, topic, event) in enumerate(batch, start):
            source = DeadLetter(topic, 0, offset, event["event_id"].encode(), b"")
            if topic == "decisions":
                core.decision(part, event, source, out, next(encoded))
                newest = ts
            else:
                core.reward(part, event, source, out)
        core.fire(part, 0.0, out, newest, None, batch[-1][0])
        produced.append((out.updates, [(d.offset, d.reason) for d in out.dead], out.duplicates, out.late_rewards))
        write = WriteBatch(raw_mode=True)
        for key, value in part.changes():
            if value is None:
                write.delete(key)
            else:
                write.put(key, value)
        db.write(write)
    out = Outputs()
    core.fire(part, 0.0, out, T0 + 10**9, None, T0 + 10**9)
    produced.append((out.updates, [(d.offset, d.reason) for d in out.dead], out.duplicates, out.late_rewards))
    # Entries compared decoded: pickle shares repeated strings by identity, which differs
    # between objects decoded afresh and those kept in memory; the values do not.
    contents = {key: decode_entry(db[key])[:4] if key.startswith(b"e:") else db[key] for key in db.keys()}
    db.close()
    return produced, contents


@pytest.mark.parametrize("entry_cache", [0, 5, 1_000_000])
def test_waiting_decisions_kept_in_memory_change_nothing(tmp_path, entry_cache):
    reference = replay(tmp_path, 0, restart_at=0)  # never a cached entry: read back every time
    produced, contents = replay(tmp_path, entry_cache)
    assert produced == reference[0]
    assert contents == reference[1]
    restarted = replay(tmp_path, entry_cache, restart_at=20)
    assert restarted == reference
    updates = [u for batch in produced for u in batch[0]]
    statuses = {record["join_status"] for _, record in updates}
    reasons = {reason for batch in produced for _, reason in batch[1]}
    assert len({record["event_id"] for _, record in updates}) == len(updates) == 600
    assert statuses == {"rewarded", "default"}
    assert {"late_reward"} <= reasons
    assert any(record["reward_count"] > 1 for _, record in updates)


def test_an_entry_written_before_the_update_was_pickled_apart_still_loads():
    update = {"event_id": "e1", "features": [0.5, -1.0], "_shard": "t/w/d/a"}
    rewards = {"r1": (T0, {"success": 1.0}, None)}
    entry = ["D", T0 + WINDOW_MS, update, rewards]
    old = b"D" + (T0 + WINDOW_MS).to_bytes(8, "big", signed=True) + pickle.dumps(entry, pickle.HIGHEST_PROTOCOL)
    assert decode_entry(old) == entry
    new = encode_entry(list(entry))
    assert new[:9] == old[:9]
    assert decode_entry(new)[:4] == entry

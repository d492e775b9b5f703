"""The posterior store on real RocksDB files: round trips, domain scans, atomic state +
offsets (including a writer SIGKILLed mid-run), corruption, checkpoints, bounded size."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import rocksdict

from learner.errors import (
    InvalidKey,
    OffsetRegression,
    ShardClosed,
    StoreCorruption,
    StoreError,
)
from learner.store import ArmKey, ArmState, PosteriorStore

REPO = Path(__file__).resolve().parents[1]
UPDATES = "bandit.updates"


def state(count: int, fill: float = 0.0, d: int = 4, policy: str = "lin_ucb") -> ArmState:
    payload = np.full(d * d + d, fill, dtype=np.float64).tobytes()
    return ArmState(policy, d, count, payload, feature_hash="fh-1")


def raw_db(path: Path) -> rocksdict.Rdict:
    """The shard's database opened directly, as a foreign writer or a bad disk would."""
    return rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True))


def raw_key_ending(path: Path, suffix: bytes) -> bytes:
    db = raw_db(path)
    try:
        matches = [key for key in db.keys() if key.endswith(suffix)]
    finally:
        db.close()
    assert len(matches) == 1, matches
    return matches[0]


def rewrite_raw(path: Path, key: bytes, change) -> None:
    db = raw_db(path)
    try:
        db[key] = change(db[key])
    finally:
        db.close()


# -- round trip, domain scan, offsets ------------------------------------------------------


def test_state_and_offsets_round_trip_through_a_reopen(tmp_path):
    gpt = ArmKey("default", "main", "route", "gpt")
    shared = ArmKey("acme", "staging", "prompt")  # arm "" : one model shared across arms
    big = ArmState("lin_ts", 128, 2**40, os.urandom(128 * 129 * 8), feature_hash="a" * 64)
    with PosteriorStore(tmp_path) as store:
        store.shard(3).apply({gpt: state(1000, 0.5), shared: big}, {(UPDATES, 3): 1000})
        assert store.shard(3).get(gpt) == state(1000, 0.5)
    with PosteriorStore(tmp_path) as store:
        shard = store.shard(3)
        assert shard.get(gpt) == state(1000, 0.5)
        assert shard.get(shared) == big
        assert shard.get(ArmKey("default", "main", "route", "claude")) is None
        assert shard.offsets() == {(UPDATES, 3): 1000}
        assert (tmp_path / "shard-0003").is_dir()


def test_domain_scan_returns_every_arm_of_that_domain_and_nothing_else(tmp_path):
    wanted = {
        "": state(1, 1.0),
        "a": state(2, 2.0),
        "b/with/slashes": state(3, 3.0),
        "ünïcode": state(4, 4.0),
    }
    others = [
        ArmKey("default", "main", "router", "a"),  # a domain the wanted one is a prefix of
        ArmKey("default", "main", "rout", "e"),  # and one that is a prefix of it
        ArmKey("default", "main2", "route", "a"),
        ArmKey("other", "main", "route", "a"),
    ]
    with PosteriorStore(tmp_path) as store:
        shard = store.shard(0)
        shard.apply(
            {**{ArmKey("default", "main", "route", arm): s for arm, s in wanted.items()},
             **{key: state(99, 9.0) for key in others}},
            {},
        )
        assert shard.domain_arms("default", "main", "route") == wanted
        assert shard.domain_arms("default", "main", "missing") == {}
        keys = [key for key, _ in shard.arms()]
        assert keys == sorted(keys)  # key order is (tenant, workspace, domain, arm)
        assert len(keys) == len(wanted) + len(others)


def test_offsets_are_written_with_state_and_a_rejected_batch_writes_nothing(tmp_path):
    a = ArmKey("default", "main", "route", "a")
    b = ArmKey("default", "main", "route", "b")
    with PosteriorStore(tmp_path) as store:
        shard = store.shard(1)
        shard.apply({a: state(10, 1.0)}, {(UPDATES, 1): 10, ("bandit.replay", 0): 4})
        with pytest.raises(OffsetRegression, match=r"bandit.updates\[1\].*from 10 to 5"):
            shard.apply({a: state(20, 2.0), b: state(5, 5.0)}, {(UPDATES, 1): 5})
        with pytest.raises(InvalidKey, match="NUL"):
            shard.apply({b: state(5, 5.0), ArmKey("default", "main", "ro\x00ute", "c"):
                         state(1)}, {(UPDATES, 1): 30})
        with pytest.raises(ValueError, match="update_count"):
            shard.apply({b: ArmState("lin_ucb", 4, -1, b"")}, {(UPDATES, 1): 30})
        assert shard.offsets() == {(UPDATES, 1): 10, ("bandit.replay", 0): 4}
    with PosteriorStore(tmp_path) as store:
        shard = store.shard(1)
        assert shard.offsets() == {(UPDATES, 1): 10, ("bandit.replay", 0): 4}
        assert shard.get(a) == state(10, 1.0)
        assert shard.get(b) is None
        shard.apply({}, {(UPDATES, 1): 10})  # the same offset again is not a regression
        shard.apply({b: state(5, 5.0)}, {(UPDATES, 1): 15})
        assert shard.offsets()[(UPDATES, 1)] == 15


def test_reset_times_are_written_with_the_block_and_read_back_per_domain(tmp_path):
    a = ArmKey("default", "main", "route", "a")
    with PosteriorStore(tmp_path) as store:
        shard = store.shard(0)
        shard.apply({a: state(3, 1.0)}, {(UPDATES, 0): 64}, {("default", "main", "route"): 1_700_000_000_000})
        with pytest.raises(ValueError, match="reset time of default/main/router"):
            shard.apply({}, {(UPDATES, 0): 128}, {("default", "main", "router"): -1})
        shard.apply({}, {(UPDATES, 0): 128}, {("t2", "main", "route"): 5, ("default", "main", "route"): 1_800_000_000_000})
    with PosteriorStore(tmp_path) as store:
        shard = store.shard(0)
        # "router" was refused with its batch; "route" keeps its newest time; another tenant is apart
        assert shard.resets() == {("default", "main", "route"): 1_800_000_000_000, ("t2", "main", "route"): 5}
        assert shard.offsets() == {(UPDATES, 0): 128} and [k for k, _ in shard.arms()] == [a]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (ArmKey("default", "main", "", "a"), "domain must not be empty"),
        (ArmKey("default", "ma\x00in", "route", "a"), "workspace 'ma\\\\x00in' contains NUL"),
        (ArmKey("default", "main", "route", "a\x00"), "arm 'a\\\\x00' contains NUL"),
        (ArmKey("default", "main", "route", 7), "arm must be a string"),
        (ArmKey("default", "main", "route", "\ud800"), "not valid UTF-8"),
        (("default", "main"), "an arm key is"),
    ],
)
def test_ids_that_cannot_be_encoded_are_refused(tmp_path, key, message):
    with PosteriorStore(tmp_path) as store:
        with pytest.raises(InvalidKey, match=message):
            store.shard(0).apply({key: state(1)}, {})
        assert list(store.shard(0).arms()) == []


# -- crash mid-batch -----------------------------------------------------------------------

# The writer resumes from the store (as a worker does), then applies batch after batch until
# it is killed; without the write-ahead log it flushes every fifth batch and says so. Batch i
# touches arm j when j <= i and (i + j) % 3 != 0 (arms join over time, each batch a different
# subset); arm j's payload after batch i is filled with i * 100 + j and every touch adds 50
# updates. The stored offset n * 1000 therefore fixes exactly what every arm must hold.
ARMS, D, PER_TOUCH = 12, 96, 50

WRITER = textwrap.dedent(
    f"""
    import sys
    import numpy as np
    from learner.store import ArmKey, ArmState, PosteriorStore

    wal = sys.argv[2] == "wal"
    shard = PosteriorStore(sys.argv[1], wal=wal).shard(5)
    i = shard.offsets().get(("{UPDATES}", 5), 0) // 1000
    counts = {{}}
    for j in range({ARMS}):
        stored = shard.get(ArmKey("t", "w", "d", f"arm{{j:02d}}"))
        counts[j] = 0 if stored is None else stored.update_count
    while True:
        states = {{}}
        for j in range({ARMS}):
            if j <= i and (i + j) % 3 != 0:
                counts[j] += {PER_TOUCH}
                payload = np.full({D} * {D} + {D}, i * 100 + j, dtype=np.float64).tobytes()
                states[ArmKey("t", "w", "d", f"arm{{j:02d}}")] = ArmState(
                    "lin_ts", {D}, counts[j], payload
                )
        shard.apply(states, {{("{UPDATES}", 5): (i + 1) * 1000, ("bandit.replay", 5): (i + 1) * 7}})
        if i % 10 == 0:
            print("applied", i, flush=True)
        i += 1
        if not wal and i % 5 == 0:
            shard.flush()
            print("flushed", i, flush=True)
    """
)


def expected_after(batches: int) -> dict[str, tuple[int, int]]:
    """arm -> (last batch that touched it, its update count) after ``batches`` batches."""
    expected = {}
    for j in range(ARMS):
        touched = [b for b in range(j, batches) if (b + j) % 3 != 0]
        if touched:
            expected[f"arm{j:02d}"] = (touched[-1], len(touched) * PER_TOUCH)
    return expected


@pytest.mark.parametrize("log", ["wal", "no-wal"])
def test_writer_killed_mid_run_leaves_whole_batches_matching_the_stored_offset(tmp_path, log):
    rng = random.Random(20261122)
    done = 0
    for _ in range(4):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), log],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            started = writer.stdout.readline()
            assert started.startswith(("applied", "flushed")), started or writer.stderr.read()  # "": it died
            # sleep into the stream of batches (each ~1 MB, written as one batch)
            try:
                writer.wait(timeout=rng.uniform(0.05, 0.5))
            except subprocess.TimeoutExpired:
                pass
            assert writer.poll() is None, writer.stderr.read()
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait()
        assert writer.returncode == -signal.SIGKILL
        lines = [started, *writer.stdout.read().splitlines()]
        flushed = [int(line.split()[1]) for line in lines if line.startswith("flushed")]

        with PosteriorStore(tmp_path) as store:
            shard = store.shard(5)
            offsets = shard.offsets()
            batches, remainder = divmod(offsets[(UPDATES, 5)], 1000)
            assert remainder == 0
            assert offsets[("bandit.replay", 5)] == batches * 7
            if log == "wal":
                assert batches > done  # the writer made progress since the last kill
            else:  # every flushed batch survived; later ones may not have
                assert batches >= max(flushed, default=done)
                assert batches >= done
            arms = shard.domain_arms("t", "w", "d")
            expected = expected_after(batches)
            assert sorted(arms) == sorted(expected)
            for arm, (last_batch, count) in expected.items():
                values = np.frombuffer(arms[arm].state, dtype=np.float64)
                assert arms[arm].update_count == count, arm
                assert values.shape == (D * D + D,)
                assert (values == last_batch * 100 + int(arm[3:])).all(), arm
        done = batches


LOSES_UNFLUSHED = textwrap.dedent(
    f"""
    import os, sys
    from learner.store import ArmKey, ArmState, PosteriorStore

    shard = PosteriorStore(sys.argv[1], wal=sys.argv[2] == "wal").shard(5)
    for i in range(3):
        state = ArmState("lin_ts", 1, i + 1, bytes([i]) * 8)
        shard.apply({{ArmKey("t", "w", "d", "a"): state}}, {{("{UPDATES}", 5): (i + 1) * 1000}})
        if i == 1:
            shard.flush()
    os._exit(0)  # as a crash: no close, no flush
    """
)


@pytest.mark.parametrize(("log", "kept"), [("wal", 3), ("no-wal", 2)])
def test_without_the_log_a_crash_keeps_exactly_the_flushed_batches(tmp_path, log, kept):
    """The learner's default (``wal=False``) trades the batches since the last flush, which
    Kafka replays, for not writing every state twice; the log keeps every batch."""
    subprocess.run([sys.executable, "-c", LOSES_UNFLUSHED, str(tmp_path), log], cwd=REPO, check=True)
    with PosteriorStore(tmp_path) as store:
        shard = store.shard(5)
        assert shard.offsets() == {(UPDATES, 5): kept * 1000}
        state = shard.get(ArmKey("t", "w", "d", "a"))
        assert (state.update_count, state.state) == (kept, bytes([kept - 1]) * 8)


def test_sync_without_the_log_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs wal=True"):
        PosteriorStore(tmp_path, sync=True, wal=False)


# -- corruption ----------------------------------------------------------------------------

GPT = ArmKey("default", "main", "route", "gpt")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda v: v[:-1] + bytes([v[-1] ^ 0x01]), "checksum mismatch"),  # payload bit flip
        (lambda v: v[:12] + bytes([v[12] ^ 0x80]) + v[13:], "checksum mismatch"),  # count
        (lambda v: v[:-3], "envelope declares"),  # truncated
        (lambda v: b"\x80\x04\x95" + bytes(60), "not a banditstream arm state"),  # a pickle
        (lambda v: b"hello", "shorter than the 28-byte envelope"),
        (lambda v: v[:4] + b"\x09" + v[5:], "envelope version 9"),
    ],
)
def test_damaged_or_foreign_value_names_the_shard_and_key(tmp_path, change, reason):
    with PosteriorStore(tmp_path) as store:
        store.shard(3).apply({GPT: state(7, 3.0)}, {(UPDATES, 3): 7})
    path = tmp_path / "shard-0003"
    rewrite_raw(path, raw_key_ending(path, b"gpt"), change)
    with PosteriorStore(tmp_path) as store:
        shard = store.shard(3)
        for read in (
            lambda: shard.get(GPT),
            lambda: shard.domain_arms("default", "main", "route"),
            lambda: list(shard.arms()),
        ):
            with pytest.raises(StoreCorruption) as caught:
                read()
            assert caught.value.shard == "shard-0003"
            assert caught.value.key == "default/main/route/gpt"
            assert reason in str(caught.value)
            assert str(caught.value).startswith("shard shard-0003, key default/main/route/gpt: ")
        assert shard.offsets() == {(UPDATES, 3): 7}  # the rest of the shard still reads


def test_foreign_database_is_refused_with_the_shard_named(tmp_path):
    db = raw_db(tmp_path / "shard-0002")
    db[b"some-other-app"] = b"value"
    db.close()
    with pytest.raises(StoreCorruption, match="shard-0002: .* holds data but no banditstream"):
        PosteriorStore(tmp_path).shard(2)


def test_shard_directory_of_another_partition_is_refused(tmp_path):
    with PosteriorStore(tmp_path) as store:
        store.shard(3).apply({GPT: state(1)}, {(UPDATES, 3): 1})
    (tmp_path / "shard-0003").rename(tmp_path / "shard-0004")
    with pytest.raises(StoreCorruption, match="holds partition 3 but was opened as partition 4"):
        PosteriorStore(tmp_path).shard(4)


# -- checkpoint, closing, several shards ---------------------------------------------------


def test_checkpoint_opens_as_a_shard_with_the_content_at_that_moment(tmp_path):
    arms = {ArmKey("default", "main", "route", f"arm{j}"): state(j, float(j)) for j in range(5)}
    backup = tmp_path / "backup"
    with PosteriorStore(tmp_path / "live") as store:
        shard = store.shard(6)
        shard.apply(arms, {(UPDATES, 6): 500})
        assert shard.checkpoint(backup / "shard-0006") == backup / "shard-0006"
        shard.apply({GPT: state(9, 9.0)}, {(UPDATES, 6): 900})  # after: not in the copy
        with pytest.raises(FileExistsError):
            shard.checkpoint(backup / "shard-0006")
    with PosteriorStore(backup) as restored:
        shard = restored.shard(6)
        assert dict(shard.arms()) == arms
        assert shard.offsets() == {(UPDATES, 6): 500}


def test_closed_shard_refuses_use_and_reopens_from_the_store(tmp_path):
    store = PosteriorStore(tmp_path)
    shard = store.shard(0)
    shard.apply({GPT: state(1)}, {(UPDATES, 0): 1})
    assert store.shard(0) is shard
    store.close_shard(0)
    with pytest.raises(ShardClosed, match="shard-0000 is closed"):
        shard.get(GPT)
    assert store.open_partitions == []
    assert store.shard(0).get(GPT) == state(1)
    store.close()
    assert store.open_partitions == []


def test_store_reads_a_domain_across_shards_and_refuses_an_arm_in_two(tmp_path):
    with PosteriorStore(tmp_path) as store:
        store.shard(0).apply({ArmKey("default", "main", "route", "a"): state(1, 1.0)}, {})
        store.shard(1).apply({ArmKey("default", "main", "route", "b"): state(2, 2.0)}, {})
        store.shard(2).apply({ArmKey("default", "main", "other", "a"): state(3, 3.0)}, {})
        assert store.all_domain_arms("default", "main", "route") == {
            "a": state(1, 1.0),
            "b": state(2, 2.0),
        }
        store.shard(2).apply({ArmKey("default", "main", "route", "a"): state(4, 4.0)}, {})
        with pytest.raises(StoreError, match="'a' of default/main/route .* shard-0000 and "
                                             "shard-0002"):
            store.all_domain_arms("default", "main", "route")


def test_shard_is_locked_against_a_second_writer(tmp_path):
    with PosteriorStore(tmp_path) as first:
        first.shard(0)
        with pytest.raises(StoreError, match="shard-0000: cannot open"):
            PosteriorStore(tmp_path).shard(0)


# -- size ----------------------------------------------------------------------------------


def test_size_is_bounded_by_arms_not_by_updates(tmp_path):
    arms = [ArmKey("default", "main", "route", f"arm{j:02d}") for j in range(20)]
    d = 16
    value_bytes = (d * d + d) * 8
    batches = 600
    with PosteriorStore(tmp_path, write_buffer_bytes=1 << 20) as store:
        shard = store.shard(0)
        rng = np.random.default_rng(1)
        for i in range(batches):
            # random doubles do not compress, so only dropping old versions keeps it small
            shard.apply(
                {
                    key: ArmState("lin_ucb", d, (i + 1) * 50, rng.random(d * d + d).tobytes())
                    for key in arms
                },
                {(UPDATES, 0): (i + 1) * 1000},
            )
        shard.compact()
        assert len(list(shard.arms())) == 20
        assert shard.offsets() == {(UPDATES, 0): batches * 1000}
    db = raw_db(tmp_path / "shard-0000")
    try:
        entries = sum(1 for _ in db.keys())
    finally:
        db.close()
    assert entries == 20 + 1 + 1  # arms, one offset, the store's metadata
    written = batches * len(arms) * value_bytes  # ~27 MB of state written over time
    live = len(arms) * value_bytes  # ~45 KB of it is current
    on_disk = sum(p.stat().st_size for p in (tmp_path / "shard-0000").glob("*.sst"))
    assert on_disk < 2 * live + (64 << 10), (on_disk, live, written)


def test_numpy_integers_from_the_policies_are_accepted_and_read_back_as_ints(tmp_path):
    with PosteriorStore(tmp_path) as store:
        shard = store.shard(np.int64(2))
        shard.apply(
            {GPT: ArmState("lin_ucb", np.int32(4), np.int64(123), b"\x00" * 8)},
            {(UPDATES, np.int64(2)): np.int64(123)},
        )
        stored = shard.get(GPT)
        assert (stored.dimension, stored.update_count) == (4, 123)
        assert type(stored.update_count) is int
        assert shard.offsets() == {(UPDATES, 2): 123}
        with pytest.raises(ValueError, match="offset of bandit.updates\\[2\\] must be an int"):
            shard.apply({}, {(UPDATES, 2): 1.5})

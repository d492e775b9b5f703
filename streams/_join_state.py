"""The join's state machine, free of faust and Kafka: what happens to one partition's
decisions and rewards, and which UpdateEvents and dead letters come out.

``streams.join`` feeds it decoded, validated events per partition and persists what it
marks dirty; tests can drive it directly.

State of one partition (one RocksDB database; keys ``e:<event_id>``, ``m:meta``,
``n:<domain>``; values are pickled plain lists, an internal format never seen outside the
worker):

* ``["D", deadline_ms, update, rewards]`` - a decision waiting for rewards until
  ``deadline_ms = decision.timestamp + window``. ``update`` is the UpdateEvent without its
  reward part (features already encoded; stored pickled on its own, see
  :func:`encode_entry`); ``rewards`` maps reward_id to ``(timestamp, signals, value)``.
  A *deferred* decision (Personalizer's ``deferActivation``) waits for its activation (a
  reward with the reserved id ``activate``, kept in ``rewards`` under that id) until
  ``decision.timestamp + activation_wait_s``; once activated its window runs from the
  activation, ``deadline_ms = activation.timestamp + window`` (rewards that came before the
  activation count). Never activated, it is emitted with ``join_status = not_activated``:
  kept on the updates topic for evaluation, never learned.
* ``["R", expire_ms, [waiting reward, ...]]`` - rewards that came before their decision;
  they wait until ``expire_ms = first reward's timestamp + window``, then are dead-lettered
  (``reward_without_decision``). Each keeps its raw bytes and source coordinates.
* ``["X", done_wall_ms, reward_ids]`` - the decision was emitted; kept ``done_retention_s``
  so a replayed or duplicated decision or reward is recognised, then purged locally.
  ``["X", done_wall_ms, reward_ids, "not_activated"]`` for a deferred decision emitted
  unactivated: an activation read after it is dead-lettered (``late_activation``).
* ``["Z", done_wall_ms, last_offset]`` - early rewards whose decision never came were
  dead-lettered; a replayed reward at or below ``last_offset`` is skipped. Purged like "X".
* ``m:meta`` - the clock, per source topic the next offset handled (``offsets``) and where
  reading resumes after a restart (``replay_from``, see below); ``n:<domain>`` - the
  domain's normaliser statistics (per partition).

Open entries are *held* in memory, not written, while they are among the partition's newest
``entry_cache`` (a decision's entry is written once, when it finishes as "X", instead of
three times: opened, reward attached, done). What is held lives in the source topics
instead: ``replay_from`` is the offset of the oldest record per topic whose effect is held
only in memory, and after a restart (or on another worker) reading resumes there. Records
between ``replay_from`` and ``offsets`` are replays: applied again to rebuild what was held,
their dead letters and duplicate counts suppressed (they were sent the first time), and an
entry already written ("X", "Z", a written "D") makes them no-ops. An entry evicted from
memory is written and from then on written on every change, like an entry of a domain
that normalises its features (its encoding depends on the normaliser's state at the time).

The deadline index is two in-memory heaps per partition, ``(deadline_ms, key)`` of waiting
decisions and ``(expire_ms, key)`` of early rewards, rebuilt from the database when the
partition is assigned (after faust's changelog recovery). Entries are lazily invalidated: a
popped key whose entry no longer carries that kind and deadline is skipped.

Clocks: event time, as Kafka Streams keeps stream time, never the broker's record time - so
a backlog, a spool drained after an outage or a producer catching up joins as it would have
live. Each partition keeps two monotone clocks, stored with its state:

* the **reward clock**: how far in event time the partition's rewards are known read. A
  waiting decision is finalised - rewarded, or with the domain's default reward - once the
  reward clock is past its window's end plus ``grace_s``;
* the **decision clock**, likewise for the decisions: early rewards whose decision has not come
  give up once it is past their expiry plus grace (``reward_without_decision``).

Each clock moves to the newest event time read on its own topic; an event stamped more than
``max_clock_skew_s`` ahead of the wall clock counts as that far only. Two rules move a clock
further when its topic has nothing left to read (the reader knows from fetch responses, right
on every broker, that everything that reached the broker before wall time F is handed over),
on the assumptions that a record reaches the broker within ``in_flight_margin_s`` of being
produced and that records are produced in event-time order within the grace:

* rewards read to their end at F: every reward produced before a decision handed over at or
  before F - margin is read, so the reward clock moves to that decision's time (a domain whose
  rewards are rare, or never come, still finalises as decisions flow); decisions read to their
  end move the decision clock likewise from the rewards. Never faster than the wall clock
  from the newest reward (decision) read: in a backlog, the margin's wall time spans much
  more event time, and a record in flight longer than the margin (a loaded producer)
  would otherwise find its window closed;
* both read to their end and nothing handed over for longer than the margin (traffic stopped):
  both clocks follow the wall clock from the newest event time read, ``stream_time + (F -
  margin - last_read)``, so the sweeper fires default rewards. A stall of a backlog's
  producer moves them by the stall's length, as it would have live; the join's own downtime
  never counts (the session's ``last_read`` starts when it starts).

So nothing is finalised before every reward stamped in its window that was produced in order
is read - also after a restart, which resumes the stored clocks and reads the held records
again before any clock can pass them. A reward more than the grace out of order, or stamped
more than ``max_clock_skew_s`` before its decision, is refused with its reason.

Broker outages break the in-order assumption: producers hold their records while the broker
is away and send them when it returns, out of event-time order by up to the outage's length.
A worker that sees the outage caps its clocks (``clock_cap``, set by ``streams.join``); a
worker that starts (or is assigned the partition) after one cannot know of it, so nothing
fires on a partition until its rewards were read to their end once since it was loaded, and
no early reward gives up until its decisions were (``catch_up_hold_max`` bounds the wait).
"""

from __future__ import annotations

import heapq
import itertools
import pickle
import time
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from rocksdict import WriteBatch

from learner.domain import DomainSettings
from learner.features import FeatureEncoder, Normalizer
from learner.policies import POLICIES

EVENT_PREFIX = b"e:"
META_KEY = b"m:meta"
NORM_PREFIX = b"n:"
FENCE_KEY = b"f:fence"

_DUMP = pickle.dumps
_LOAD = pickle.loads
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_HEAD = 9  # kind byte + 8-byte signed big-endian deadline (or done time), then the pickle
NEVER = -(1 << 62)
_LATEST = 1 << 62  # (an empty batch's oldest event time)
#: Batches waiting to settle a clock per topic and partition before the oldest are merged.
_UNSETTLED_MAX = 1024


def encode_entry(entry: list) -> bytes:
    """``kind + deadline + pickle``: loading the index and purging read 9 bytes, not the pickle.

    A decision's ``update`` never changes once the entry is opened, while its rewards do: it
    is pickled once, into bytes kept as the entry's fifth element, and every later write of
    the entry (a reward attached) pickles the rewards around those bytes.
    """
    head = entry[0].encode() + int(entry[1]).to_bytes(8, "big", signed=True)
    if entry[0] != "D":
        return head + _DUMP(entry, _PROTOCOL)
    if len(entry) == 4:
        entry.append(_DUMP(entry[2], _PROTOCOL))
    return head + _DUMP(["D", entry[1], entry[4], entry[3]], _PROTOCOL)


def decode_entry(raw: bytes) -> list:
    entry = _LOAD(raw[_HEAD:])
    if entry[0] == "D" and type(entry[2]) is bytes:  # the update as pickled once (encode_entry)
        entry.append(entry[2])
        entry[2] = _LOAD(entry[2])
    return entry


#: The reward id reserved for the activation of a deferred decision (Personalizer's activate).
ACTIVATION_REWARD_ID = "activate"


@dataclass(frozen=True)
class JoinOptions:
    """Limits and cadences of the join (``WorkerConfig.extra["join"]`` overrides them)."""

    #: Most events handled as one batch (one flush of outputs and state).
    batch_max: int = 4000
    #: Longest wait to fill a batch, seconds (each batch costs three flushes to the broker:
    #: outputs, changelog, fence; 0.2 measured ~15% more throughput than 0.05).
    batch_within_s: float = 0.2
    #: Open entries (waiting decisions, early rewards) kept in memory per partition (the
    #: newest): held there unwritten until they finish or age out (see the module's doc), so
    #: a reward, decision or deadline for one of them reads, unpickles and writes nothing.
    #: About 2 KB each for a per-arm domain at d=8-24, 4 KB for a shared one with 5
    #: candidates at d=32 (measured with tracemalloc). Older ones are written ("spilled",
    #: logged once per partition and counted in ``banditstream_join_spilled_entries_total``)
    #: and read back from RocksDB when needed: a spilled shared entry is a 2 KB changelog
    #: record (the pipeline benchmark with half its decisions spilled: 150-160 us of join CPU
    #: per pair, 127 without). A decision stays open for its window plus ``grace_s`` of event
    #: time, so 30,000 hold 10,000 decisions/s per partition with 1 s windows (60-120 MB per
    #: partition at that rate). It bounds memory and how much a restart replays (records
    #: since the oldest held entry), not correctness; 0 writes every change.
    entry_cache: int = 30_000
    #: Rewards are handed to the join in time order with their partition's decisions: a
    #: reward waits, undecoded, until a decision stamped no more than this before it is read
    #: (or the decisions are read to their end), seconds.
    reward_lead_s: float = 0.0
    #: Rewards waiting so per partition before the partition's fetching pauses.
    rewards_held_max: int = 20_000
    #: After a start (or an assignment) a partition's defaults wait until its rewards were read
    #: to their end once, and its early rewards until its decisions were: the log read back
    #: may hold the aftermath of an outage this worker never saw (producers' held records,
    #: out of event-time order by up to the outage's length), which no in-flight margin
    #: covers. Past this many waiting decisions the partition fires by its clocks anyway
    #: (a backlog too long to hold); 0 never waits.
    catch_up_hold_max: int = 200_000
    #: Wall-clock sweeper period, seconds.
    sweep_interval_s: float = 0.5
    #: Distinct rewards kept per decision; more are dead-lettered (``too_many_rewards``).
    max_rewards_per_decision: int = 64
    #: Event ids with early rewards waiting per partition; beyond, early rewards are
    #: dead-lettered at once (``reward_without_decision``).
    max_waiting_events: int = 100_000
    #: How long a finalised decision is remembered (duplicates and replays), seconds.
    done_retention_s: float = 900.0
    #: How often old done markers are purged, seconds; each purge looks at ``purge_scan``
    #: keys per partition at most (bounded work per tick), continuing where the last stopped.
    purge_interval_s: float = 10.0
    purge_scan: int = 20_000
    #: How often each partition's changed normaliser statistics go to the posterior topic,
    #: seconds: a snapshot ships the newest the publisher has read.
    normalizer_every_s: float = 2.0
    #: How far event clocks may disagree, seconds: an event stamped further ahead of the wall
    #: clock moves the join's clocks only this far (a producer with a wrong clock must not
    #: close a partition's windows), and a reward stamped more than this before its decision
    #: is refused (``reward_before_decision``).
    max_clock_skew_s: float = 5.0
    #: How long a record may take from its producer to the broker's log, seconds (wall time):
    #: a partition read to its end at wall time F holds everything produced before F minus this.
    in_flight_margin_s: float = 1.0
    #: How far out of event-time order a partition's records may arrive, seconds (as Kafka
    #: Streams' grace): a decision's default fires only once its rewards are read past its
    #: window's end plus this.
    grace_s: float = 2.0
    #: How long a deferred decision waits for its activation, seconds of event time from
    #: the decision's timestamp; never activated by then, it is emitted as ``not_activated``
    #: (kept for evaluation, never learned), and a later activation is dead-lettered.
    activation_wait_s: float = 900.0
    #: How long one flush of a batch's outputs or changelog may wait for the broker, seconds;
    #: past it (or on a producer error) the producer is rebuilt and the batch sent again,
    #: for as long as the broker is away: the join waits out an outage rather than exit.
    output_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for option in fields(self):
            value = getattr(self, option.name)
            number = isinstance(option.default, float)
            if isinstance(value, bool) or not isinstance(value, (int, float) if number else int):
                raise ValueError(f"{option.name} must be {'a number' if number else 'an integer'}, got {value!r}")
            if value < 0 or (value == 0 and option.name not in _MAY_BE_ZERO):
                raise ValueError(f"{option.name} must be {'>= 0' if option.name in _MAY_BE_ZERO else '> 0'}, got {value!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> "JoinOptions":
        return cls(**dict(data or {}))


#: Join options for which 0 means something (no cache, no margin, no memory of done markers).
_MAY_BE_ZERO = frozenset(
    ("entry_cache", "done_retention_s", "max_clock_skew_s", "in_flight_margin_s", "max_waiting_events", "reward_lead_s",
     "grace_s", "catch_up_hold_max")
)


@dataclass
class DeadLetter:
    """A record to dead-letter: where it came from, why, and its bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    error: BaseException | None = None
    reason: str | None = None


class JoinError(Exception):
    """A record the join refuses for a join-level reason (late, orphaned, mismatched, ...)."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass
class Outputs:
    """What one batch or sweep produced, in order."""

    #: (shard key, UpdateEvent dict)
    updates: list[tuple[str, dict]] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    #: kind -> one duplicate's id, for the log line that reports them
    duplicate_samples: dict[str, str] = field(default_factory=dict)
    late_rewards: int = 0
    #: activations of deferred decisions read (rewards with the reserved id ``activate``)
    activations: int = 0

    def duplicate(self, kind: str, sample: str) -> None:
        self.duplicates[kind] = self.duplicates.get(kind, 0) + 1
        self.duplicate_samples.setdefault(kind, sample)


class _Domain:
    """What the join needs of one domain, built once."""

    def __init__(self, name: str, settings: DomainSettings) -> None:
        self.name = name
        self.settings = settings
        self.engine = settings.reward_engine()
        self.window_ms = int(round(settings.reward.window_s * 1000))
        self.features = settings.features
        self.feature_hash = settings.features.config_hash()
        self.shared = POLICIES[settings.policy].shared
        self.normalize = settings.features.normalize
        #: Without normalisation the encoding depends on nothing but the event, so a batch's
        #: decisions are encoded together, by one encoder (:meth:`JoinCore.encode`).
        self.encoder = None if self.normalize else FeatureEncoder(settings.features)


class PartitionState:
    """One partition's join state: a view of its database plus this batch's changes."""

    def __init__(self, partition: int, db: Any, domains: Mapping[str, _Domain], entry_cache: int = 30_000) -> None:
        self.partition = partition
        self.db = db
        self._domains = domains
        #: Deadline index: (deadline_ms, key) of waiting decisions ("D"), and (expire_ms, key)
        #: of early rewards ("R").
        self.heap: list[tuple[int, bytes]] = []
        self.early_heap: list[tuple[int, bytes]] = []
        self.waiting = 0
        #: The clocks (event time, ms, monotone, stored; see the module's doc): how far the
        #: partition's rewards and its decisions are known read, and the newest event time read.
        self.reward_clock = NEVER
        self.decision_clock = NEVER
        self.stream_time = NEVER
        #: This session only: wall ms the last record was handed over (or the session began),
        #: each topic's newest event time in the batch being read, and per topic the
        #: (wall ms handed over, newest event time) of batches not yet settled (:meth:`advance`).
        self.last_read = time.time() * 1000.0
        #: While set, no clock moves past this event time (ms): a broker away, and the margin
        #: after it answers again (set by the worker: ``streams.join``, ``_cap_clocks``).
        self.clock_cap: float | None = None
        #: This session only: whether the rewards (True: the decisions) were read to their end
        #: since the partition was loaded (see ``JoinOptions.catch_up_hold_max``).
        self.caught_up = {True: False, False: False}
        self._batch_newest = {True: NEVER, False: NEVER}
        self._batch_oldest = {True: _LATEST, False: _LATEST}
        #: per topic (True: decisions): (wall ms, event time) of the newest record handed
        #: over, from which a settled clock may run ahead at wall-clock speed only
        self._newest_read: dict[bool, tuple[float, int] | None] = {True: None, False: None}
        self._unsettled: dict[bool, deque[tuple[float, int]]] = {True: deque(), False: deque()}
        #: Source topic -> next offset after the newest record handled, stored with the state.
        self.offsets: dict[str, int] = {}
        #: Source topic -> where reading resumes after a restart: the oldest record whose
        #: effect is held in memory only (stored with the state as ``replay_from``).
        self.resume: dict[str, int] = {}
        #: Source topic -> next offset to read in this session (starts at ``resume``).
        self.position: dict[str, int] = {}
        #: Source topic -> records below this offset (read again after a restart) are replays.
        self.replay_until: dict[str, int] = {}
        self.normalizers: dict[str, Normalizer] = {}
        self._encoders: dict[str, FeatureEncoder] = {}
        self._norm_dirty: set[str] = set()
        #: Domains whose normaliser changed since the worker last published it.
        self.norm_unpublished: set[str] = set()
        self._meta_dirty = False
        #: This batch's entries, as read or written (cleared when its changes are taken).
        self._cache: dict[bytes, list | None] = {}
        #: Open entries ("D" waiting decisions, "R" early rewards), decoded, oldest first:
        #: written ones (equal to the database), and held ones (in ``_held``, not written).
        self._open: dict[bytes, list] = {}
        self._entry_cache = entry_cache
        #: Held entries the last :meth:`changes` wrote because they aged out of memory (more
        #: open than ``entry_cache``): each costs a full entry in the changelog and RocksDB,
        #: and a read back when it changes or finishes.
        self.spilled = 0
        #: Keys of open entries held in memory only, and per source topic the (offset, key)
        #: of every record whose effect went into one, in offset order (stale ones dropped
        #: lazily): the oldest still held gives ``resume``.
        self._held: set[bytes] = set()
        self._held_records: defaultdict[str, deque[tuple[int, bytes]]] = defaultdict(deque)
        self.dirty: set[bytes] = set()
        self.purge_cursor = EVENT_PREFIX
        self._load()

    # -- loading -------------------------------------------------------------------------

    def _load(self) -> None:
        """Rebuild the in-memory index (deadlines, waiting count, clock, normalisers)."""
        meta = self.db.get(META_KEY)
        if meta is not None:
            meta = _LOAD(meta)
            clocks = meta.get("clocks") or dict.fromkeys(("rewards", "decisions", "stream"), meta["watermark"])
            self.reward_clock = int(clocks["rewards"])
            self.decision_clock = int(clocks["decisions"])
            self.stream_time = int(clocks["stream"])
            self.offsets = dict(meta.get("offsets", {}))
            self.resume = {**self.offsets, **meta.get("replay_from", {})}
        self.position = dict(self.resume)
        self.replay_until = dict(self.offsets)
        for name in self._domains:
            raw = self.db.get(NORM_PREFIX + name.encode())
            if raw is not None:
                self.normalizers[name] = Normalizer.from_export(_LOAD(raw))
                self.norm_unpublished.add(name)
        heap, early = self.heap, self.early_heap
        it = self.db.iter()
        it.seek(EVENT_PREFIX)
        while it.valid():
            key = it.key()
            if not key.startswith(EVENT_PREFIX):
                break
            head = it.value()[:_HEAD]
            kind = head[:1]
            if kind == b"D":
                heap.append((int.from_bytes(head[1:], "big", signed=True), key))
            elif kind == b"R":
                early.append((int.from_bytes(head[1:], "big", signed=True), key))
                self.waiting += 1
            it.next()
        heapq.heapify(heap)
        heapq.heapify(early)

    # -- entries -------------------------------------------------------------------------

    def get(self, key: bytes) -> list | None:
        try:
            return self._cache[key]
        except KeyError:
            entry = self._open.get(key)
            if entry is None:
                raw = self.db.get(key)
                entry = None if raw is None else decode_entry(raw)
            self._cache[key] = entry
            return entry

    def put(self, key: bytes, entry: list | None) -> None:
        """Change an entry, written with this batch (always for "X", "Z" and deletes)."""
        self._cache[key] = entry
        self.dirty.add(key)

    def hold(self, key: bytes, entry: list, topic: str, offset: int) -> None:
        """Change an open entry because of ``topic``'s record at ``offset``, in memory only
        if it was never written (:meth:`get` it first); else as :meth:`put`."""
        previous = self._cache.get(key)
        if key in self.dirty or (previous is not None and key not in self._held and previous[0] in ("D", "R")):
            self.put(key, entry)
            return
        self._cache[key] = entry
        self._open[key] = entry
        self._held.add(key)
        self._held_records[topic].append((offset, key))

    def replaying(self, topic: str, offset: int) -> bool:
        """Whether the record was handled before the last restart (read again: a replay)."""
        return offset < self.replay_until.get(topic, -1)

    def encoder(self, domain: _Domain) -> FeatureEncoder:
        encoder = self._encoders.get(domain.name)
        if encoder is None:
            normalizer = self.normalizers.setdefault(domain.name, Normalizer())
            encoder = self._encoders[domain.name] = FeatureEncoder(domain.features, normalizer)
        return encoder

    def handled(self, topic: str, offset: int) -> None:
        """Record that the state now reflects ``topic``'s record at ``offset``."""
        self.position[topic] = offset + 1
        if offset >= self.offsets.get(topic, -1):
            self.offsets[topic] = offset + 1
        self._meta_dirty = True

    def normalizer_changed(self, domain: str) -> None:
        self._norm_dirty.add(domain)
        self.norm_unpublished.add(domain)

    # -- clocks --------------------------------------------------------------------------

    def observe(self, is_decision: bool, timestamp: int) -> None:
        """A record of the batch being read carries this event time (capped by the caller)."""
        if timestamp > self._batch_newest[is_decision]:
            self._batch_newest[is_decision] = timestamp
        if timestamp < self._batch_oldest[is_decision]:
            self._batch_oldest[is_decision] = timestamp

    def batch_read(self, read_wall_ms: float) -> None:
        """The batch's records were handed over at ``read_wall_ms``: each topic's clock moves
        to its newest event time read, and the batch waits to settle the other topic's clock."""
        for is_decision, newest in self._batch_newest.items():
            if newest == NEVER:
                continue
            oldest = self._batch_oldest[is_decision]
            self._batch_newest[is_decision], self._batch_oldest[is_decision] = NEVER, _LATEST
            self.last_read = read_wall_ms
            if self._newest_read[is_decision] is None or newest >= self._newest_read[is_decision][1]:
                self._newest_read[is_decision] = (read_wall_ms, newest)
            if self._newest_read[not is_decision] is None:  # nothing of the other topic read yet:
                other = self.reward_clock if is_decision else self.decision_clock  # its clock paces
                self._newest_read[not is_decision] = (read_wall_ms, max(other, oldest))  # from here
            if newest > self.stream_time:
                self.stream_time = newest
            if is_decision:
                self._raise("decision_clock", newest)
            else:
                self._raise("reward_clock", newest)
            unsettled = self._unsettled[is_decision]
            unsettled.append((read_wall_ms, newest))
            if len(unsettled) > _UNSETTLED_MAX:  # merged: settles at the later time (later, never early)
                _, first = unsettled.popleft()
                wall, second = unsettled.popleft()
                unsettled.appendleft((wall, max(first, second)))

    def advance(
        self, decisions_end: float | None, rewards_end: float | None, margin_ms: float, resumed_ms: float | None = None
    ) -> None:
        """Move the clocks with what the reader knows of the partition's ends.

        ``decisions_end`` / ``rewards_end``: the wall ms F up to which that topic is read and
        handed over to its end (everything that reached the broker before F), None while
        records are left. A record reaches the broker within ``margin_ms`` of being produced,
        and records are produced in event-time order within the grace, so:

        * rewards read to their end at F: every reward produced before a decision handed over
          at or before F - margin is read; the reward clock moves to that decision's time;
        * decisions read to their end: likewise the decision clock, from rewards;
        * both read to their end and nothing handed over for longer than the margin: both
          clocks follow the wall clock from the newest event time read (the partition is
          quiet, so default rewards fire when traffic stops): ``stream_time + (F - margin -
          last_read)``. ``resumed_ms``: when the partition's broker was heard again after a
          silence (None: it never was silent). A broker away is no quiet: producers hold their
          records meanwhile and send them, with their earlier event times, once it is back, so
          quiet is counted from ``max(last_read, resumed_ms)``, never across the outage (the
          soak's broker freezes made windows of decisions still in their producers close).
        """
        if rewards_end is not None:
            self.caught_up[False] = True
            self._settle(True, rewards_end - margin_ms, "reward_clock")
        if decisions_end is not None:
            self.caught_up[True] = True
            self._settle(False, decisions_end - margin_ms, "decision_clock")
        if rewards_end is not None and decisions_end is not None and self.stream_time != NEVER:
            quiet = min(rewards_end, decisions_end) - margin_ms - max(self.last_read, resumed_ms or 0.0)
            if quiet > 0:
                self._raise("reward_clock", self.stream_time + int(quiet))
                self._raise("decision_clock", self.stream_time + int(quiet))

    def _settle(self, is_decision: bool, until_wall_ms: float, clock: str) -> None:
        unsettled = self._unsettled[is_decision]
        newest = self._newest_read[not is_decision]  # the settled topic's own newest record
        cap = None if newest is None else newest[1] + max(0.0, until_wall_ms - newest[0])
        while unsettled and unsettled[0][0] <= until_wall_ms:
            at = unsettled[0][1]
            if cap is not None and at > cap:
                self._raise(clock, int(cap))  # the rest settles as the wall clock moves on
                return
            self._raise(clock, unsettled.popleft()[1])

    def _raise(self, clock: str, value: int) -> None:
        if self.clock_cap is not None and value > self.clock_cap:
            value = int(self.clock_cap)
        if value > getattr(self, clock):
            setattr(self, clock, value)
            self._meta_dirty = True

    # -- persistence ---------------------------------------------------------------------

    def write(self, items: list[tuple[bytes, bytes | None]]) -> None:
        """Write a batch's changes, as :meth:`changes` gave them, to the database at once."""
        batch = WriteBatch(raw_mode=True)
        for key, value in items:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self.db.write(batch)

    def changes(self) -> list[tuple[bytes, bytes | None]]:
        """This batch's writes as (key, value or None for a delete); clears them."""
        out: list[tuple[bytes, bytes | None]] = []
        cache, live, held = self._cache, self._open, self._held
        for key in self.dirty:
            entry = cache[key]
            held.discard(key)
            if entry is None:
                out.append((key, None))
                live.pop(key, None)
                continue
            out.append((key, encode_entry(entry)))
            if entry[0] == "X" or entry[0] == "Z":
                live.pop(key, None)
            else:
                live[key] = entry
        excess = len(live) - self._entry_cache
        self.spilled = 0
        if excess > 0:  # the oldest entries out of memory: written if held, read back if needed
            for key in list(itertools.islice(live, excess)):
                entry = live.pop(key)
                if key in held:
                    held.discard(key)
                    out.append((key, encode_entry(entry)))
                    self.spilled += 1
        # Not the offsets: a record between this session's position and them was held in memory
        # by the worker before (its replay not read yet), and must still be read after a restart.
        resume = dict(self.position)
        for topic, records in self._held_records.items():
            while records and records[0][1] not in held:
                records.popleft()
            if records:
                resume[topic] = records[0][0]
        if resume != self.resume:
            self.resume = resume
            self._meta_dirty = True
        for name in self._norm_dirty:
            out.append((NORM_PREFIX + name.encode(), _DUMP(self.normalizers[name].export(), _PROTOCOL)))
        if self._meta_dirty or out:
            meta = {
                "watermark": self.reward_clock,  # as read by states written before the clocks were apart
                "clocks": {"rewards": self.reward_clock, "decisions": self.decision_clock, "stream": self.stream_time},
                "offsets": self.offsets, "replay_from": self.resume,
            }  # fmt: skip
            out.append((META_KEY, _DUMP(meta, _PROTOCOL)))
        self.dirty = set()
        self._norm_dirty = set()
        self._meta_dirty = False
        cache.clear()
        return out

    def purge_done(self, now_wall_ms: float, retention_ms: float, scan: int) -> int:
        """Delete done markers ("X", "Z") older than the retention, looking at ``scan`` keys at most.

        Local deletes only: the changelog topic's retention drops old markers there, and a
        marker restored from it is purged again here by its timestamp.
        """
        cutoff = now_wall_ms - retention_ms
        it = self.db.iter()
        it.seek(self.purge_cursor)
        stale: list[bytes] = []
        seen = 0
        while it.valid() and seen < scan:
            key = it.key()
            if not key.startswith(EVENT_PREFIX):
                break
            head = it.value()[:_HEAD]
            if head[:1] in (b"X", b"Z") and int.from_bytes(head[1:], "big", signed=True) < cutoff and key not in self._cache:
                stale.append(key)
            seen += 1
            it.next()
        self.purge_cursor = it.key() if it.valid() and it.key().startswith(EVENT_PREFIX) else EVENT_PREFIX
        for key in stale:
            self.db.delete(key)
        return len(stale)


class JoinCore:
    """Decisions and rewards in, UpdateEvents and dead letters out, per partition."""

    def __init__(self, domains: Mapping[str, DomainSettings], options: JoinOptions) -> None:
        self.domains = {name: _Domain(name, settings) for name, settings in domains.items()}
        self.options = options
        self._grace_ms = int(round(options.grace_s * 1000))
        self._margin_ms = options.in_flight_margin_s * 1000.0
        self._skew_ms = int(round(options.max_clock_skew_s * 1000))
        #: How long past its window a decision can still be told from a re-send (its done
        #: marker is kept ``done_retention_s``), ms.
        self._forget_ms = self._grace_ms + int(round(options.done_retention_s * 1000))
        self._activation_wait_ms = int(round(options.activation_wait_s * 1000))

    # -- events --------------------------------------------------------------------------

    def encode(self, events: list[dict]) -> list[list[float] | Exception | None]:
        """The acted feature vectors of a batch's decisions whose per-arm domain does not
        normalise, one ``acted_matrix`` per domain (its fixed numpy costs paid once per batch,
        not per decision); per event, the vector, the error that refused it, or None (encoded
        in :meth:`decision`, in order, with the partition's normaliser; a shared model's with
        every candidate's row, the acted one among them)."""
        out: list[list[float] | Exception | None] = [None] * len(events)
        groups: dict[str, list[int]] = {}
        for i, event in enumerate(events):
            domain = self.domains.get(event["domain"])
            if domain is not None and domain.encoder is not None and not domain.shared:
                groups.setdefault(domain.name, []).append(i)
        for name, indices in groups.items():
            encoder = self.domains[name].encoder
            try:
                rows = encoder.acted_matrix([events[i] for i in indices]).tolist()
            except ValueError:  # find the culprits one by one
                rows = []
                for i in indices:
                    try:
                        rows.append(encoder.acted_matrix((events[i],))[0].tolist())
                    except ValueError as error:
                        rows.append(error)
            for i, row in zip(indices, rows):
                out[i] = row
        return out

    def decision(self, part: PartitionState, event: dict, source: DeadLetter, out: Outputs,
                 features: list[float] | Exception | None = None) -> None:
        """Open the decision's join entry; ``features`` as :meth:`encode` gave them, if it did."""
        key = EVENT_PREFIX + event["event_id"].encode()
        entry = part.get(key)
        if entry is not None:
            if entry[0] == "Z":  # its early rewards gave up waiting: it opens afresh
                entry = None
            elif entry[0] != "R":
                out.duplicate("decision", event["event_id"])
                return
        domain = self.domains[event["domain"]]
        if entry is None and event["timestamp"] + domain.window_ms + self._forget_ms < part.decision_clock:
            # Its done marker, had it been joined before, would be purged by now: a re-send
            # could not be told from a first sending, and would be learned twice.
            raise JoinError("expired_decision",
                            f"stamped {event['timestamp']}, older than its window plus grace_s and done_retention_s "
                            f"before the partition's decisions ({part.decision_clock}): it cannot be told from a re-send")
        if isinstance(features, Exception):
            raise features
        candidate_features: list[list[float]] | np.ndarray = []
        if features is None:
            encoder = part.encoder(domain)
            if domain.shared:  # every candidate's row (for evaluation); the acted one is what is learned
                # held as an array until the update is emitted: 1.3 KB, not 5 KB of lists, per open entry
                candidate_features = encoder.action_matrix(event.get("context") or {}, event["actions"])
                features = candidate_features[event["chosen"]].tolist()
            else:  # the acted row of a per-arm model is the context's vector
                features = encoder.context_vector(event.get("context") or {}).tolist()
            if domain.normalize:  # after encoding, so a value never normalises itself
                encoder.observe(event.get("context") or {}, event["actions"])
                part.normalizer_changed(domain.name)
        actions = event["actions"]
        chosen = event["chosen"]
        arm = actions[chosen]["id"]
        tenant, workspace = event["tenant"], event["workspace"]
        shard = f"{tenant}/{workspace}/{domain.name}" if domain.shared else f"{tenant}/{workspace}/{domain.name}/{arm}"
        probabilities = list(event["probabilities"])
        update = {
            "event_id": event["event_id"],
            "tenant": tenant,
            "workspace": workspace,
            "domain": domain.name,
            "arm": arm,
            "arm_index": chosen,
            "actions": [a["id"] for a in actions],
            "probabilities": probabilities,
            "probability": probabilities[chosen],
            "features": features,
            "feature_hash": domain.feature_hash,
            "mode": event.get("mode") or "live",
            "policy_version": event.get("policy_version") or "",
            "channel": event.get("channel") or "stable",
            "recommended_probabilities": event.get("recommended_probabilities") or [],
            "recommended_version": event.get("recommended_version") or "",
            "decision_time": event["timestamp"],
            "weight": 1.0,
            "candidate_features": candidate_features,
            "_shard": shard,
            "_deferred": bool(event.get("deferred")),
        }
        if update["_deferred"]:
            deadline = event["timestamp"] + self._activation_wait_ms
        else:
            deadline = event["timestamp"] + domain.window_ms
        rewards: dict[str, tuple] = {}
        if entry is not None:  # rewards (or its activation) that came first
            part.waiting -= 1
            early = sorted(entry[2], key=lambda waiting: waiting[0] != ACTIVATION_REWARD_ID)  # the activation first
            for waiting in early:
                if waiting[0] == ACTIVATION_REWARD_ID:
                    if update["_deferred"]:  # (else there is nothing to activate)
                        deadline = self._activate(update, deadline, rewards, waiting, domain, out) or deadline
                else:
                    self._attach(update, deadline, rewards, waiting, out)
        if domain.normalize:  # encoded with the normaliser as it is now: never rebuilt by a replay
            part.put(key, ["D", deadline, update, rewards])
        else:
            part.hold(key, ["D", deadline, update, rewards], source.topic, source.offset)
        heapq.heappush(part.heap, (deadline, key))

    def reward(self, part: PartitionState, event: dict, source: DeadLetter, out: Outputs) -> None:
        key = EVENT_PREFIX + event["event_id"].encode()
        entry = part.get(key)
        reward_id = event["reward_id"]
        owner = (event["tenant"], event["workspace"], event["domain"])
        waiting = (reward_id, event["timestamp"], dict(event.get("signals") or {}), event.get("value"), owner, source)
        if reward_id == ACTIVATION_REWARD_ID:
            # The activation of a deferred decision (banditstream serve's deferActivation):
            # it opens the decision's window, and is never aggregated as a reward.
            out.activations += 1
            if entry is not None and entry[0] in ("D", "X"):
                self._activation(part, key, entry, waiting, source, out)
                return
        if entry is not None and entry[0] == "Z":
            if source.offset <= entry[2]:  # a replay of a reward dead-lettered with them
                return
            entry = None
        if entry is None:
            if part.waiting >= self.options.max_waiting_events:
                out.dead.append(_refuse(source, "reward_without_decision",
                                        f"{part.waiting} event ids already wait for their decision on this partition"))
                return
            expire = event["timestamp"] + self.domains[event["domain"]].window_ms
            part.hold(key, ["R", expire, [waiting]], source.topic, source.offset)
            part.waiting += 1
            heapq.heappush(part.early_heap, (expire, key))
            return
        kind = entry[0]
        if kind == "R":
            if any(w[0] == reward_id for w in entry[2]):
                out.duplicate("reward", f"{event['event_id']}/{reward_id}")
            elif len(entry[2]) >= self.options.max_rewards_per_decision:
                out.dead.append(_refuse(source, "too_many_rewards",
                                        f"already {len(entry[2])} rewards wait for this decision"))
            else:
                entry[2].append(waiting)
                part.hold(key, entry, source.topic, source.offset)
            return
        if kind == "X":
            if reward_id in entry[2]:
                out.duplicate("reward", f"{event['event_id']}/{reward_id}")
            else:
                out.late_rewards += 1
                out.dead.append(_refuse(source, "late_reward",
                                        f"its decision was already joined and emitted (at {entry[1]}, reward clock {part.reward_clock})"))
            return
        if self._attach(entry[2], entry[1], entry[3], waiting, out):
            part.hold(key, entry, source.topic, source.offset)

    def _activation(self, part: PartitionState, key: bytes, entry: list, waiting: tuple, source: DeadLetter,
                    out: Outputs) -> None:
        """An activation read for a decision already read (waiting, or emitted)."""
        if entry[0] == "X":
            if len(entry) > 3:  # emitted unactivated: too late
                out.dead.append(_refuse(source, "late_activation",
                                        f"its deferred decision waited activation_wait_s for an activation and was "
                                        f"emitted as not_activated (at {entry[1]})"))
            elif ACTIVATION_REWARD_ID in entry[2]:
                out.duplicate("activation", key[len(EVENT_PREFIX):].decode())
            return  # (a decision that was not deferred: nothing to activate)
        update, rewards = entry[2], entry[3]
        if not update.get("_deferred"):
            return
        deadline = self._activate(update, entry[1], rewards, waiting, self.domains[update["domain"]], out)
        if deadline is not None:
            entry[1] = deadline
            part.hold(key, entry, source.topic, source.offset)
            heapq.heappush(part.heap, (deadline, key))

    def _activate(self, update: dict, deadline: int, rewards: dict, waiting: tuple, domain: "_Domain",
                  out: Outputs) -> int | None:
        """Activate a deferred decision: its new deadline (the window from the activation), or
        None when the activation is refused or a duplicate."""
        reward_id, ts, _signals, _value, owner, source = waiting
        if reward_id in rewards:
            out.duplicate("activation", update["event_id"])
            return None
        if self._foreign(update, owner, source, "activation", out):
            return None
        if ts > deadline:
            out.dead.append(_refuse(source, "late_activation",
                                    f"timestamp {ts} is after its deferred decision stopped waiting at {deadline}"))
            return None
        if self._too_early(update, ts, source, out):
            return None
        rewards[ACTIVATION_REWARD_ID] = (ts, {}, None)
        return max(ts, update["decision_time"]) + domain.window_ms

    def _attach(self, update: dict, deadline: int, rewards: dict, waiting: tuple, out: Outputs) -> bool:
        """Add a reward to a waiting decision, or count/dead-letter it; True if added."""
        reward_id, ts, signals, value, owner, source = waiting
        if reward_id in rewards:
            out.duplicate("reward", f"{update['event_id']}/{reward_id}")
            return False
        if self._foreign(update, owner, source, "reward", out):
            return False
        if ts > deadline:
            out.late_rewards += 1
            out.dead.append(_refuse(source, "late_reward",
                                    f"timestamp {ts} is after the decision's window closed at {deadline}"))
            return False
        if self._too_early(update, ts, source, out):
            return False
        if len(rewards) >= self.options.max_rewards_per_decision:
            out.dead.append(_refuse(source, "too_many_rewards", f"already {len(rewards)} rewards for this decision"))
            return False
        rewards[reward_id] = (ts, signals, value)
        return True

    @staticmethod
    def _foreign(update: dict, owner: tuple, source: DeadLetter, what: str, out: Outputs) -> bool:
        """Dead-letter a reward or activation naming another tenant/workspace/domain than its decision."""
        if owner == (update["tenant"], update["workspace"], update["domain"]):
            return False
        out.dead.append(_refuse(source, "reward_mismatch",
                                f"the {what} names {'/'.join(owner)}, its decision "
                                f"{update['tenant']}/{update['workspace']}/{update['domain']}"))
        return True

    def _too_early(self, update: dict, ts: int, source: DeadLetter, out: Outputs) -> bool:
        """Dead-letter a reward or activation stamped more than the skew before its decision."""
        if ts >= update["decision_time"] - self._skew_ms:
            return False
        out.dead.append(_refuse(source, "reward_before_decision",
                                f"timestamp {ts} is more than max_clock_skew_s before its decision's "
                                f"{update['decision_time']}"))
        return True

    # -- deadlines -----------------------------------------------------------------------

    def fire(self, part: PartitionState, now_wall_ms: float, out: Outputs, decisions_end: float | None = None,
             rewards_end: float | None = None, resumed_ms: float | None = None) -> None:
        """Advance the partition's clocks (:meth:`PartitionState.advance`) and finalise
        everything now due: a waiting decision once the reward clock is past its window's end
        plus grace, early rewards once the decision clock is past theirs."""
        part.advance(decisions_end, rewards_end, self._margin_ms, resumed_ms)
        grace, done_at, hold_max = self._grace_ms, int(now_wall_ms), self.options.catch_up_hold_max
        heap, clock = part.heap, part.reward_clock - grace
        if not part.caught_up[False] and len(heap) <= hold_max:
            clock = NEVER  # rewards not yet read to their end since the start: nothing is due yet
        while heap and heap[0][0] < clock:
            deadline, key = heapq.heappop(heap)
            entry = part.get(key)
            if entry is None or entry[0] != "D" or entry[1] != deadline:
                continue  # finalised, or an index entry left from before a change
            update, rewards = entry[2], entry[3]
            domain = self.domains[update["domain"]]
            out.updates.append(self._finalise(domain, update, rewards))
            done = ["X", done_at, tuple(rewards)]
            if out.updates[-1][1]["join_status"] == "not_activated":
                done.append("not_activated")
            part.put(key, done)
        heap, clock = part.early_heap, part.decision_clock - grace
        if not part.caught_up[True] and len(heap) <= hold_max:
            clock = NEVER
        while heap and heap[0][0] < clock:
            expire, key = heapq.heappop(heap)
            entry = part.get(key)
            if entry is None or entry[0] != "R" or entry[1] != expire:
                continue
            part.waiting -= 1
            for waiting in entry[2]:
                out.dead.append(_refuse(waiting[5], "reward_without_decision",
                                        f"no decision {key[len(EVENT_PREFIX):].decode()!r} arrived within the window"))
            part.put(key, ["Z", done_at, max(waiting[5].offset for waiting in entry[2])])

    def _finalise(self, domain: _Domain, update: dict, rewards: dict) -> tuple[str, dict]:
        record = dict(update)
        rows = record["candidate_features"]
        if type(rows) is not list:  # (an array while the entry was open; see decision)
            record["candidate_features"] = rows.tolist()
        shard = record.pop("_shard")
        deferred = record.pop("_deferred", False)  # (absent from entries opened before deferral was built)
        activated = ACTIVATION_REWARD_ID in rewards
        if activated:
            rewards = {rid: reward for rid, reward in rewards.items() if rid != ACTIVATION_REWARD_ID}
        if rewards:
            events = [{"reward_id": rid, "timestamp": ts, "signals": signals, "value": value}
                      for rid, (ts, signals, value) in rewards.items()]
            reward, signals, count = domain.engine.aggregate(events)
            record.update(reward=float(reward), signals=signals, reward_count=count, join_status="rewarded",
                          reward_time=max(ts for ts, _, _ in rewards.values()))
        else:
            record.update(reward=float(domain.engine.default_reward), signals={}, reward_count=0,
                          join_status="default", reward_time=None)
        if deferred and not activated:
            record["join_status"] = "not_activated"  # kept for evaluation, never learned
        return shard, record


def _refuse(source: DeadLetter, reason: str, message: str) -> DeadLetter:
    return DeadLetter(source.topic, source.partition, source.offset, source.key, source.value,
                      JoinError(reason, message), reason)



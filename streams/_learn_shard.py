"""One partition of the updates topic as the learner folds it: blocks, dedupe, state, offsets.

A :class:`ShardLearner` owns one shard (one updates partition, one RocksDB database). The
worker feeds it every record of the partition in offset order, valid or not; it folds them in
**blocks aligned to offsets**: block ``k`` is every record with ``k*B <= offset < (k+1)*B``.
When a block is complete (its last offset was read, or a later offset was) it is folded into
the policies with one ``update_batch`` per domain, and the touched models' states and the
offset ``(k+1)*B`` go to the store in one write batch. The fold of a block is a function of
the block's records and the state at its start only, so however polls, crashes and restarts
cut the stream, the same blocks are folded in the same order from the same states: the result
is the same bit for bit.

With ``persist_every_block=False`` (the learner's default, its write-ahead log off) the write
waits for :meth:`ShardLearner.persist`, which the worker calls when it publishes, just before it
flushes the store: one write batch of every model changed since the last one and the offset of
the last folded block. Without the log only a flush makes a write survive a crash, so writing
each block to the memtable kept nothing more; it cost the default portfolio a quarter to a
third of its update at d=32 (each touched arm's state encoded, checksummed and written every
block, where once per publication writes the same bytes: ``benchmarks/learner.py``'s loop,
one busy sitting, 77,600-80,400 rows a second against 102,800-115,500; at d=128 29,000-34,700
against 35,500-39,900). What a crash leaves is the same: the blocks up to the last
publication's flush, then the restart folds the rest again.

The trailing, incomplete block is never persisted. :meth:`ShardLearner.snapshot` folds it into
scratch copies of the models it touches (for the PosteriorShards the worker emits), leaving the
persisted base at the block boundary; a restart re-reads that block from the stored offset.

Dedupe: a record is a duplicate when its ``event_id`` was seen (in a record that decoded and
validated) earlier in its block or in the ``window_blocks`` blocks before it. The window is a
function of the log alone, so it is not stored: on assignment the worker seeks
``window_blocks`` blocks before the resume offset and feeds those records first; they only
fill the window (:attr:`ShardLearner.floor` says from where records are learned).

Reset: an update of mode :data:`RESET` (a marker, :mod:`streams.reset`) cuts its domain's rows
in the block: the rows before it are folded, then every model of the domain returns to its
priors (keeping its place, so its prior state is persisted and published like any other), then
the rows after it are folded. A model whose own floor lies past the marker (a rebuilt shard's
model published after it) already starts from the reset and is left alone.

A reset starts over from the marker's time, not only from its offset: an update of a decision
made before it that reaches the log after it (a default reward that fired late, a reward that
came in after the reset) is not learned (counted as ``before_reset``). The newest reset time
per domain is part of the state: stored with the block (:meth:`Shard.apply`) and published
with every model (``reset_time``), so a restart or a rebuild skips the same rows.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from learner.domain import DomainSettings
from learner.errors import StoreError
from learner.policies import Drift, Policy, PolicyError, Portfolio
from learner.store import ArmKey, ArmState, Shard

__all__ = ["BEFORE_RESET", "RESET", "BlockStats", "DomainModel", "ModelState", "ShardLearner", "StateMismatch", "Update"]

log = logging.getLogger(__name__)

#: The mode of a model-reset marker (see the module docstring).
RESET = "reset"
#: How an update of a decision made before its domain's newest reset is counted (not learned).
BEFORE_RESET = "before_reset"


class StateMismatch(StoreError):
    """Stored or published state was learned with other settings than the configured ones."""


class Update(NamedTuple):
    """A valid UpdateEvent reduced to what learning needs."""

    offset: int
    event_id: str
    key: ArmKey  # the model's key: arm is "" for a model shared across arms
    features: list[float]
    reward: float
    weight: float
    mode: str  # live, shadow or off; only live updates are learned as acted; RESET for a reset marker
    time: int = 0  # the decision's event time, epoch ms (a marker's: the reset's time)


@dataclass(frozen=True)
class DomainModel:
    """What the learner needs of one configured domain, derived once from its settings."""

    settings: DomainSettings
    policy: str
    dimension: int
    feature_hash: str
    shared: bool
    #: policies whose state this domain's policy takes in (a portfolio: its members' policies)
    adopts: frozenset[str] = frozenset()

    @classmethod
    def of(cls, settings: DomainSettings) -> DomainModel:
        policy = settings.make_policy()
        return cls(
            settings=settings,
            policy=settings.policy,
            dimension=settings.features.dimension,
            feature_hash=settings.features.config_hash(),
            shared=settings.features.shared,
            adopts=frozenset(m.name for m in policy.members if policy.adopts(m.name))
            if isinstance(policy, Portfolio) else frozenset(),
        )

    def check(self, key: ArmKey, policy: str, dimension: int, feature_hash: str, where: str) -> None:
        """Refuse state learned with another policy (one a portfolio adopts aside), dimension or
        feature configuration."""
        problems = []
        if policy != self.policy and policy not in self.adopts:
            problems.append(f"policy {policy!r} (configured: {self.policy!r})")
        if dimension != self.dimension:
            problems.append(f"dimension {dimension} (configured: {self.dimension})")
        if feature_hash and feature_hash != self.feature_hash:
            problems.append(f"feature_hash {feature_hash!r} (configured: {self.feature_hash!r})")
        if problems:
            raise StateMismatch(
                f"{where}: state of {key} was learned with {', '.join(problems)}; restore the domain's "
                "settings, or retire the old state (a new domain name starts fresh)"
            )


class ModelState(NamedTuple):
    """One model as the worker publishes it."""

    key: ArmKey
    state: ArmState
    drift: Drift
    reset_time: int = 0  # its domain's newest reset as of this state (epoch ms; 0: never)


class BlockStats(NamedTuple):
    """What folding one block did, for metrics."""

    partition: int
    records: int  # valid records in the block (not counting the window warm-up)
    learned: int
    duplicates: int
    not_acted: dict[str, int]  # mode -> count of shadow/off updates skipped
    seconds: float  # fold, and the state write when every block is written
    persisted: bool


@dataclass
class _Fold:
    ids: set[str] = field(default_factory=set)
    groups: dict[tuple[str, str, str], list[Update]] = field(default_factory=dict)
    records: int = 0
    duplicates: int = 0
    not_acted: dict[str, int] = field(default_factory=dict)
    #: per (tenant, workspace, domain): (rows of it before the marker, the marker's offset), in order
    resets: dict[tuple[str, str, str], list[tuple[int, int]]] = field(default_factory=dict)
    #: per domain reset in the block: its newest reset time at the block's end
    reset_times: dict[tuple[str, str, str], int] = field(default_factory=dict)


class ShardLearner:
    """The learning state of one updates partition. See the module docstring.

    Parameters:
        partition, topic: the updates partition this shard is.
        domains: the configured domains.
        shard: the partition's store database (state and offsets are written there).
        block_size: records per block (``B``).
        window_blocks: blocks before the current one whose event_ids count as seen.
        start: the first offset not yet in the state (the stored offset, or where a rebuild
            resumes); records before it only fill the dedupe window.
        floors: per model, the first offset not yet in its state, when it differs from
            ``start`` (a shard rebuilt from published states, each with its own watermark).
        persist_from: no block boundary below this is persisted (a rebuilt shard holds states
            ahead of ``start``; persisting before every floor is passed would re-learn them).
        persist_every_block: write every folded block to the store at once (default); False
            leaves the writes to :meth:`persist` (see the module docstring).
        on_block: called with :class:`BlockStats` after every folded block.
    """

    def __init__(
        self,
        partition: int,
        topic: str,
        domains: Mapping[str, DomainModel],
        shard: Shard,
        *,
        block_size: int,
        window_blocks: int,
        start: int,
        floors: Mapping[ArmKey, int] | None = None,
        persist_from: int = 0,
        on_block: Callable[[BlockStats], None] | None = None,
        persist_every_block: bool = True,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if window_blocks < 0:
            raise ValueError(f"window_blocks must be >= 0, got {window_blocks}")
        self.partition = partition
        self.topic = topic
        self.domains = domains
        self.shard = shard
        self.block_size = block_size
        self.window_blocks = window_blocks
        self.floor = start
        self._floors: dict[ArmKey, int] = dict(floors or {})
        self._persist_from = max(persist_from, start)
        self._stored = shard.offsets().get((topic, partition))
        self._persist_every_block = persist_every_block
        #: the last folded block boundary not written yet (:meth:`persist`)
        self._due: int | None = None
        self._on_block = on_block
        self._policies: dict[tuple[str, str, str], Policy] = {}
        #: per (tenant, workspace, domain): the time of its newest reset (rows decided before it are not learned)
        self._reset_times: dict[tuple[str, str, str], int] = {}
        self._unsaved_resets: set[tuple[str, str, str]] = set()
        # dedupe window: event_id -> block it was seen in, and the blocks in order
        self._seen: dict[str, int] = {}
        self._window: collections.deque[tuple[int, set[str]]] = collections.deque()
        self._pending: list[Update] = []
        self._pending_block: int | None = None
        #: next offset to read: every record before it has been fed (from the window's start)
        self.position = self.warm_offset()
        #: models changed since the last successful publication
        self.dirty: set[ArmKey] = set()
        #: models changed since the last write to the store
        self._unsaved: set[ArmKey] = set()

    # -- loading ---------------------------------------------------------------------------

    def warm_offset(self) -> int:
        """Where to start reading so that the dedupe window is complete at :attr:`floor`."""
        first_block = self.floor // self.block_size - self.window_blocks
        return max(0, first_block * self.block_size)

    def load_stored(self) -> int:
        """Load every model state the shard holds; returns how many.

        States of domains no longer configured stay in the store untouched (and unpublished).
        """
        loaded = 0
        adopted: collections.Counter[tuple[str, str]] = collections.Counter()
        for key, state in self.shard.arms():
            model = self.domains.get(key.domain)
            if model is None:
                continue
            model.check(key, state.policy, state.dimension, state.feature_hash, self.shard.name)
            if self._load(key, state.policy, state.state):
                adopted[key.domain, state.policy] += 1
            loaded += 1
        for (domain, policy), arms in sorted(adopted.items()):
            log.info("%s: %d arm(s) of %s state taken into the domain's portfolio (its %s members start from "
                     "them)", domain, arms, policy, policy)  # fmt: skip
        self._reset_times.update(self.shard.resets())
        return loaded

    def load_published(
        self, key: ArmKey, policy: str, dimension: int, feature_hash: str, state: bytes, reset_time: int = 0
    ) -> None:
        """Adopt one published model state (a rebuild from the posterior topic)."""
        model = self.domains[key.domain]
        model.check(key, policy, dimension, feature_hash, f"posterior topic, partition {self.partition}")
        if self._load(key, policy, state):
            log.info("%s: %s state from the posterior topic taken into the domain's portfolio", key, policy)
        self._unsaved.add(key)  # the local store does not have it yet
        if reset_time > self._reset_times.get(key[:3], 0):
            # Taking the newest of the models' is exact: a row it skips that an older model's
            # resume would have learned lies before that model's next marker, which resets it.
            self._reset_times[key[:3]] = reset_time
            self._unsaved_resets.add(key[:3])

    def keys(self) -> list[ArmKey]:
        """Every model this shard holds (committed state)."""
        return [ArmKey(*twd, arm) for twd, policy in self._policies.items() for arm in policy.arm_ids()]

    # -- feeding ---------------------------------------------------------------------------

    def feed(self, offset: int, update: Update | None) -> None:
        """The record at ``offset``: a valid update, or None for one that was dead-lettered.

        Records must come in increasing offset order; one already fed is ignored.
        """
        if offset < self.position:
            return
        block = offset // self.block_size
        if self._pending_block is not None and block != self._pending_block:
            self._close_block()
        self._pending_block = block
        if update is not None:
            self._pending.append(update)
            if update.mode == "live" and offset >= self._floors.get(update.key, self.floor):
                self.dirty.add(update.key)
            elif update.mode == RESET and offset >= self.floor:  # every model of the domain changes
                twd = update.key[:3]
                self.dirty.update(self._resettable(twd, offset, self._policies))
                self.dirty.update(u.key for u in self._pending if u.mode == "live" and u.key[:3] == twd)
        self.position = offset + 1
        if self.position == (block + 1) * self.block_size:
            self._close_block()

    def _close_block(self) -> None:
        block = self._pending_block
        if block is None:
            return
        started = time.perf_counter()
        end = (block + 1) * self.block_size
        fold = self._fold(block, self._pending)
        touched = self._apply(fold, self._policies)
        self._unsaved.update(touched)
        self._reset_times.update(fold.reset_times)
        self._unsaved_resets.update(fold.reset_times)
        self._window.append((block, fold.ids))
        for event_id in fold.ids:
            self._seen[event_id] = block
        self._pending = []
        self._pending_block = None
        persisted = False
        if end > (self._stored or 0) and end >= self._persist_from:
            self._due = end
            if self._persist_every_block:
                persisted = self.persist()
        if end >= self._persist_from:
            self._floors.clear()  # every floor is behind us
        if self._on_block is not None and end > self.floor:
            learned = sum(len(rows) for rows in fold.groups.values())
            self._on_block(
                BlockStats(
                    self.partition, fold.records, learned, fold.duplicates, fold.not_acted,
                    time.perf_counter() - started, persisted,
                )
            )  # fmt: skip

    def persist(self) -> bool:
        """Write what the folded blocks changed since the last write: every such model's state
        and the offset of the last folded block, in one write batch. Whether it wrote (nothing
        is due before a block is folded past the stored offset)."""
        end = self._due
        if end is None:
            return False
        states = self._states(sorted(self._unsaved))
        resets = {twd: self._reset_times[twd] for twd in sorted(self._unsaved_resets)}
        self.shard.apply(states, {(self.topic, self.partition): end}, resets)
        self._stored = end
        self._due = None
        self._unsaved.clear()
        self._unsaved_resets.clear()
        return True

    def _fold(self, block: int, updates: Iterable[Update]) -> _Fold:
        """Dedupe the block's updates and group the ones to learn by domain.

        Reads the window but does not change it (besides forgetting blocks that fell out of it,
        which is the same for every later block).
        """
        self._prune(block - self.window_blocks)
        seen = self._seen
        fold = _Fold()
        ids = fold.ids
        floors = self._floors
        floor = self.floor
        reset_times = fold.reset_times
        since = self._reset_times
        timed = bool(since)  # rows are checked against reset times once there are any
        for update in updates:
            event_id = update.event_id
            counted = update.offset >= floor
            fold.records += counted
            if event_id in seen or event_id in ids:
                fold.duplicates += counted
                continue
            ids.add(event_id)
            if update.mode == RESET:
                if counted:
                    twd = update.key[:3]
                    fold.resets.setdefault(twd, []).append((len(fold.groups.get(twd, ())), update.offset))
                    reset_times[twd] = max(update.time, reset_times.get(twd, since.get(twd, 0)))
                    timed = True
                continue
            if update.mode != "live":
                if counted:
                    fold.not_acted[update.mode] = fold.not_acted.get(update.mode, 0) + 1
                continue
            if update.offset < floors.get(update.key, floor):
                continue  # already in the state this shard started from
            twd = update.key[:3]
            if timed and update.time < reset_times.get(twd, since.get(twd, 0)):
                fold.not_acted[BEFORE_RESET] = fold.not_acted.get(BEFORE_RESET, 0) + 1
                continue  # decided before the domain's reset: what the reset discarded
            fold.groups.setdefault(twd, []).append(update)
        return fold

    def _prune(self, oldest_block: int) -> None:
        window, seen = self._window, self._seen
        while window and window[0][0] < oldest_block:
            block, ids = window.popleft()
            for event_id in ids:
                if seen.get(event_id) == block:
                    del seen[event_id]

    def _apply(self, fold: _Fold, policies: dict[tuple[str, str, str], Policy]) -> list[ArmKey]:
        """One rank-k ``update_batch`` per domain, rows in offset order, cut where the domain
        was reset; the touched keys."""
        touched: list[ArmKey] = []
        for twd in dict.fromkeys([*fold.groups, *fold.resets]):
            rows = fold.groups.get(twd, [])
            start = 0
            for cut, offset in fold.resets.get(twd, ()):
                touched += self._learn(twd, rows[start:cut], policies)
                touched += self._reset(twd, offset, policies)
                start = cut
            touched += self._learn(twd, rows[start:], policies)
        return touched

    def _learn(self, twd: tuple[str, str, str], rows: list[Update], policies: dict) -> list[ArmKey]:
        if not rows:
            return []
        policy = policies[twd] if twd in policies else self._policy(ArmKey(*twd))
        X = np.array([u.features for u in rows], dtype=np.float64)
        arms = [u.key.arm for u in rows]
        rewards = np.array([u.reward for u in rows], dtype=np.float64)
        weights = np.array([u.weight for u in rows], dtype=np.float64)
        times = np.array([u.time for u in rows], dtype=np.int64)
        return [ArmKey(*twd, arm) for arm in policy.update_batch(X, arms, rewards, weights, times)]

    def _reset(self, twd: tuple[str, str, str], offset: int, policies: dict) -> list[ArmKey]:
        """Every model of ``twd`` back to its priors at the marker at ``offset``: a fresh policy
        holding the same arms, the reset ones at their priors. The reset keys."""
        old = policies.get(twd)
        if old is None:
            return []
        reset = set(self._resettable(twd, offset, policies))
        fresh = self.domains[twd[2]].settings.make_policy()
        for arm in old.arm_ids():
            if ArmKey(*twd, arm) in reset:
                fresh.add_arm(arm)
            else:  # its state was published after the marker: it starts from the reset already
                fresh.load_arm_state(arm, old.arm_state_bytes(arm))
        policies[twd] = fresh
        return sorted(reset)

    def _resettable(self, twd: tuple[str, str, str], offset: int, policies: Mapping) -> list[ArmKey]:
        """The models of ``twd`` a marker at ``offset`` resets: those whose state is from before it."""
        policy = policies.get(twd)
        keys = [ArmKey(*twd, arm) for arm in policy.arm_ids()] if policy is not None else []
        return [key for key in keys if offset >= self._floors.get(key, self.floor)]

    # -- publishing ------------------------------------------------------------------------

    def snapshot(self, keys: Iterable[ArmKey]) -> list[ModelState]:
        """The current state of ``keys`` (those that exist), the trailing block included.

        The trailing block is folded into scratch copies of the models it touches, so the
        persisted base stays at the block boundary.
        """
        scratch: dict[tuple[str, str, str], Policy] = {}
        in_scratch: set[ArmKey] = set()
        pending_resets: dict[tuple[str, str, str], int] = {}  # reset times the trailing block moves
        if self._pending:
            fold = self._fold(self._pending_block, self._pending)
            pending_resets = fold.reset_times
            for twd in dict.fromkeys([*fold.groups, *fold.resets]):
                copy = self.domains[twd[2]].settings.make_policy()
                base = self._policies.get(twd)
                held = set(base.arm_ids()) if base is not None else set()
                # a reset touches every arm of the domain; rows only their own
                wanted = base.arm_ids() if twd in fold.resets and base is not None else [u.key.arm for u in fold.groups.get(twd, ())]
                for arm in dict.fromkeys(wanted):
                    if arm in held:
                        copy.load_arm_state(arm, base.arm_state_bytes(arm))
                scratch[twd] = copy
            in_scratch.update(self._apply(fold, scratch))
        out = []
        for key in keys:
            twd = key[:3]
            policy = scratch[twd] if key in in_scratch else self._policies.get(twd)
            try:
                state = self._state_of(policy, key) if policy is not None else None
            except KeyError:  # dirty, but every update of it was a duplicate
                state = None
            if state is not None:
                reset_time = pending_resets.get(twd, self._reset_times.get(twd, 0))
                out.append(ModelState(key, state, policy.drift(key.arm), reset_time))
        return out

    @property
    def publishable(self) -> bool:
        """Whether every model's state is at :attr:`position` (a rebuilt shard is not until
        it has read past every model's own watermark)."""
        return self.position >= self._persist_from

    # -- helpers ---------------------------------------------------------------------------

    def _load(self, key: ArmKey, policy: str, state: bytes) -> bool:
        """One arm's state into its domain's policy. State of a policy the domain's portfolio
        adopts (its model before it became a portfolio) is taken in by the members of that
        policy, then stored and published as the portfolio's at the next chance: True then."""
        target = self._policy(key)
        if policy == self.domains[key.domain].policy:
            try:
                target.load_arm_state(key.arm, state)
            except PolicyError as exc:
                raise StateMismatch(f"state of {key} does not load into the domain's {policy}: {exc}") from None
            return False
        try:
            target.adopt_arm_state(key.arm, policy, state)
        except PolicyError as exc:
            raise StateMismatch(f"state of {key} ({policy}) cannot be taken into the domain's portfolio: {exc}") from None
        self._unsaved.add(key)
        self.dirty.add(key)
        return True

    def _policy(self, key: ArmKey) -> Policy:
        twd = key[:3]
        policy = self._policies.get(twd)
        if policy is None:
            policy = self._policies[twd] = self.domains[key.domain].settings.make_policy()
        return policy

    def _states(self, keys: list[ArmKey]) -> dict[ArmKey, ArmState]:
        """The arms' states to store, each domain's encoded in one pass over its arrays."""
        by_domain: dict[tuple[str, str, str], list[ArmKey]] = {}
        for key in keys:
            by_domain.setdefault(key[:3], []).append(key)
        states = {}
        for twd, group in by_domain.items():
            policy = self._policies[twd]
            blobs = policy.arm_states_bytes([key.arm for key in group])
            states.update((key, self._state_of(policy, key, blob)) for key, blob in zip(group, blobs))
        return {key: states[key] for key in keys}

    def _state_of(self, policy: Policy, key: ArmKey, blob: bytes | None = None) -> ArmState:
        """The arm's state as the store keeps it (``blob``: its policy state, when encoded already)."""
        model = self.domains[key.domain]
        return ArmState(
            policy=model.policy,
            dimension=model.dimension,
            update_count=policy.update_count(key.arm),
            state=policy.arm_state_bytes(key.arm) if blob is None else blob,
            feature_hash=model.feature_hash,
        )

    @property
    def stored_offset(self) -> int | None:
        """The offset the store holds (the last persisted block boundary)."""
        return self._stored

    @property
    def pending(self) -> int:
        """Records of the trailing block that are fed but not persisted."""
        return len(self._pending)

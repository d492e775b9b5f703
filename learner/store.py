"""The posterior store: policy state per arm, sharded like the updates topic, on RocksDB.

One partition of ``bandit.updates`` is one shard, and one shard is one RocksDB database
(rocksdict) under the store's root, ``ROOT/shard-0007/``. Exactly one worker owns a
partition at a time, so every shard has a single writer. A shard holds:

* the state of each model it owns, one value per ``(tenant, workspace, domain, arm)``
  (``arm`` is ``""`` for a model shared across arms), overwritten in place, so the size
  is bounded by the number of arms, never by the number of events;
* the consumed offsets: per source ``(topic, partition)``, the next offset to read.

The workflow of a worker, and the one guarantee it relies on::

    store = PosteriorStore("/var/lib/banditstream/posterior")
    shard = store.shard(7)                        # opened on assignment, cached
    resume_from = shard.offsets()                 # {("bandit.updates", 7): 120000}
    states = dict(shard.arms())                   # warm the policies
    ...                                           # fold a batch of updates
    shard.apply({ArmKey("default", "main", "route", "gpt"): ArmState(...), ...},
                {("bandit.updates", 7): 121000})  # state + offset: ONE atomic write batch
    store.close_shard(7)                          # on revocation

:meth:`Shard.apply` writes the touched arms' states and the offsets in a single RocksDB
``WriteBatch``, so after a crash the shard holds either all of a batch or none of it, and
the stored offset always says exactly which updates the stored state contains: replaying
the topic from it applies nothing twice and loses nothing.

Durability comes in three settings; in each, what survives a crash is a prefix of the
batches applied, whole, with the offsets that say exactly where it ends, so the worker
replays the rest from Kafka and ends with the same bytes:

* ``wal=True, sync=False`` (the store's default): the write-ahead log is on, and a batch is
  in the operating system's page cache when ``apply`` returns. It survives the process
  being killed (``kill -9``, OOM, a crash) but not a power loss or kernel panic, which may
  drop the last batches (RocksDB recovers the log to a point in time).
* ``sync=True``: the log is fsynced every batch (survives power loss; costs an fsync).
* ``wal=False`` (the learner's default, ``learn.wal``): no log. Batches live in RocksDB's
  memtable until :meth:`Shard.flush` (or a full memtable, or ``close``) writes them to a
  table file; a crash loses the batches since the last flush, which Kafka replays. The
  updates topic is the log, as Kafka Streams does with its changelog. It saves writing and
  checksumming every state twice: about a third of the default policy's update time.

Keys sort by tenant, workspace, domain, arm (NUL-separated UTF-8; ids may not contain
NUL), so "every arm of a domain" is a prefix scan. Values are wrapped in an envelope
(magic ``BSAS``, envelope version, policy name, feature hash, dimension, update count and
a CRC-32 over all of it), so a damaged or foreign value raises
:class:`~learner.errors.StoreCorruption` naming the shard and the key instead of handing
garbage to a policy.
"""

from __future__ import annotations

import json
import operator
import struct
import threading
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import rocksdict

from learner.errors import (
    InvalidKey,
    OffsetRegression,
    ShardClosed,
    StoreCorruption,
    StoreError,
)

__all__ = ["ArmKey", "ArmState", "PosteriorStore", "Shard", "TopicPartition"]

#: A source of updates: (topic, partition).
TopicPartition = tuple[str, int]


class ArmKey(NamedTuple):
    """Which model a state belongs to; ``arm`` is ``""`` for a model shared across arms."""

    tenant: str
    workspace: str
    domain: str
    arm: str = ""

    def __str__(self) -> str:
        return "/".join(self) if self.arm else "/".join(self[:3])


@dataclass(frozen=True, slots=True)
class ArmState:
    """One model's state as the store keeps it.

    ``state`` is opaque here: the policy's own ``to_bytes()`` output. The other fields are
    what the worker and publisher need without decoding it.
    """

    policy: str
    dimension: int
    update_count: int
    state: bytes
    feature_hash: str = ""


# -- key space -----------------------------------------------------------------------------
#
#   m\0<name>                              store metadata (format, version, partition)
#   o\0<topic>\0<partition: u32 BE>        next offset to read (u64 BE)
#   s\0<tenant>\0<workspace>\0<domain>\0<arm>   an ArmState envelope
#   r\0<tenant>\0<workspace>\0<domain>     the time of the domain's newest reset (u64 BE, epoch ms)
#
# NUL is the separator and sorts below every other byte, so the s\0...<domain>\0 prefix
# of a domain is never a prefix of another domain's keys ("route" vs "router").

_SEP = b"\x00"
_META = b"m\x00"
_OFFSETS = b"o\x00"
_STATES = b"s\x00"
_RESETS = b"r\x00"
_META_FORMAT = _META + b"format"

_FORMAT = "banditstream.posterior-shard"
_FORMAT_VERSION = 1


def _int_in(value: object, low: int, high: int) -> int | None:
    """``value`` as an int if it is integral (numpy's too) and in ``[low, high)``, else None."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None
    return number if low <= number < high and not isinstance(value, bool) else None


def _id_bytes(value: str, what: str, *, empty_ok: bool = False) -> bytes:
    if not isinstance(value, str):
        raise InvalidKey(f"{what} must be a string, got {type(value).__name__}")
    if not value and not empty_ok:
        raise InvalidKey(f"{what} must not be empty")
    if "\x00" in value:
        raise InvalidKey(f"{what} {value!r} contains NUL, the store's key separator")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidKey(f"{what} {value!r} is not valid UTF-8: {error.reason}") from None


def _domain_prefix(tenant: str, workspace: str, domain: str) -> bytes:
    return _STATES + _SEP.join(
        (
            _id_bytes(tenant, "tenant"),
            _id_bytes(workspace, "workspace"),
            _id_bytes(domain, "domain"),
            b"",
        )
    )


def _state_key(key: ArmKey) -> bytes:
    if len(key) != 4:
        raise InvalidKey(f"an arm key is (tenant, workspace, domain, arm), got {key!r}")
    tenant, workspace, domain, arm = key
    return _domain_prefix(tenant, workspace, domain) + _id_bytes(arm, "arm", empty_ok=True)


def _parse_state_key(raw: bytes) -> ArmKey | None:
    parts = raw[len(_STATES) :].split(_SEP)
    if len(parts) != 4:
        return None
    try:
        return ArmKey(*(part.decode("utf-8") for part in parts))
    except UnicodeDecodeError:
        return None


def _reset_key(tenant: str, workspace: str, domain: str) -> bytes:
    return _RESETS + _domain_prefix(tenant, workspace, domain)[len(_STATES) : -1]


def _offset_key(topic: str, partition: int) -> bytes:
    if _int_in(partition, 0, 2**31) is None:
        raise InvalidKey(
            f"partition of topic {topic!r} must be an int in [0, 2^31), got {partition!r}"
        )
    return _OFFSETS + _id_bytes(topic, "topic") + _SEP + int(partition).to_bytes(4, "big")


def _describe_key(raw: bytes) -> str:
    if raw.startswith(_STATES):
        parsed = _parse_state_key(raw)
        if parsed is not None:
            return str(parsed) if parsed.arm else f"{parsed} (shared model)"
    if raw.startswith(_OFFSETS) and len(raw) > len(_OFFSETS) + 5:
        topic = raw[len(_OFFSETS) : -5].decode("utf-8", "replace")
        return f"offset of {topic}[{int.from_bytes(raw[-4:], 'big')}]"
    return repr(raw)


# -- value envelope ------------------------------------------------------------------------
#
#   offset size  field
#        0    4  magic b"BSAS" (banditstream arm state)
#        4    1  envelope version (1)
#        5    1  length of the policy name (UTF-8)
#        6    1  length of the feature hash (UTF-8)
#        7    1  reserved (0)
#        8    4  dimension                          little-endian u32
#       12    8  update_count                       little-endian u64
#       20    4  length of the payload              little-endian u32
#       24    4  CRC-32 of bytes 0..24 and everything after byte 28
#       28       policy name, feature hash, payload

_MAGIC = b"BSAS"
_ENVELOPE_VERSION = 1
_HEADER = struct.Struct("<4sBBBxIQI")
_CRC = struct.Struct("<I")
_ENVELOPE = _HEADER.size + _CRC.size


def _encode_state(state: ArmState, key: ArmKey) -> bytes:
    policy = state.policy.encode("utf-8")
    feature_hash = state.feature_hash.encode("utf-8")
    payload = state.state
    problems = []
    if not 0 < len(policy) < 256:
        problems.append(f"policy name must be 1..255 UTF-8 bytes, got {len(policy)}")
    if len(feature_hash) > 255:
        problems.append(f"feature_hash must be at most 255 UTF-8 bytes, got {len(feature_hash)}")
    dimension = _int_in(state.dimension, 0, 2**32)
    update_count = _int_in(state.update_count, 0, 2**64)
    if dimension is None:
        problems.append(f"dimension must be an int in [0, 2^32), got {state.dimension!r}")
    if update_count is None:
        problems.append(f"update_count must be an int in [0, 2^64), got {state.update_count!r}")
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        problems.append(f"state must be bytes, got {type(payload).__name__}")
    elif len(payload) >= 2**32:
        problems.append(f"state of {len(payload)} bytes exceeds the 4 GiB envelope limit")
    if problems:
        raise ValueError(f"cannot store the state of {key}: " + "; ".join(problems))
    header = _HEADER.pack(
        _MAGIC,
        _ENVELOPE_VERSION,
        len(policy),
        len(feature_hash),
        dimension,
        update_count,
        len(payload),
    )
    crc = zlib.crc32(payload, zlib.crc32(feature_hash, zlib.crc32(policy, zlib.crc32(header))))
    return b"".join((header, _CRC.pack(crc), policy, feature_hash, payload))


def _decode_state(value: bytes, shard: str, raw_key: bytes) -> ArmState:
    def corrupt(reason: str) -> StoreCorruption:
        return StoreCorruption(shard, _describe_key(raw_key), reason)

    if len(value) < _ENVELOPE:
        raise corrupt(f"value of {len(value)} bytes is shorter than the {_ENVELOPE}-byte envelope")
    magic, version, policy_len, hash_len, dimension, update_count, payload_len = (
        _HEADER.unpack_from(value)
    )
    if magic != _MAGIC:
        raise corrupt(f"not a banditstream arm state (magic {magic!r}, expected {_MAGIC!r})")
    if version != _ENVELOPE_VERSION:
        raise corrupt(
            f"envelope version {version} is not readable here (this reader knows "
            f"{_ENVELOPE_VERSION})"
        )
    body = _ENVELOPE + policy_len + hash_len
    if body + payload_len != len(value):
        raise corrupt(
            f"value is {len(value)} bytes but its envelope declares {body + payload_len}"
        )
    view = memoryview(value)
    (stored_crc,) = _CRC.unpack_from(value, _HEADER.size)
    crc = zlib.crc32(view[_ENVELOPE:], zlib.crc32(view[: _HEADER.size]))
    if crc != stored_crc:
        raise corrupt(f"checksum mismatch (stored {stored_crc:#010x}, computed {crc:#010x})")
    try:
        policy = bytes(view[_ENVELOPE : _ENVELOPE + policy_len]).decode("utf-8")
        feature_hash = bytes(view[_ENVELOPE + policy_len : body]).decode("utf-8")
    except UnicodeDecodeError as error:
        raise corrupt(f"policy name or feature hash is not UTF-8: {error.reason}") from None
    return ArmState(policy, dimension, update_count, bytes(view[body:]), feature_hash)


# -- the store -----------------------------------------------------------------------------


def _check_durability(sync: bool, wal: bool) -> None:
    if sync and not wal:
        raise ValueError("sync=True fsyncs the write-ahead log, so it needs wal=True")


class PosteriorStore:
    """The shards of one worker, each a RocksDB database under ``root``.

    ``sync``: fsync every :meth:`Shard.apply`; ``wal``: write the write-ahead log (see the
    module's durability note; ``sync`` needs the log).
    ``write_buffer_bytes``: RocksDB memtable size per shard; the live state of a shard is
    its arms' state, so a few times that is plenty (default 64 MiB).
    """

    def __init__(
        self,
        root: str | Path,
        *,
        sync: bool = False,
        wal: bool = True,
        write_buffer_bytes: int = 64 << 20,
    ) -> None:
        _check_durability(sync, wal)
        self.root = Path(root)
        self.sync = sync
        self.wal = wal
        self.write_buffer_bytes = write_buffer_bytes
        self._shards: dict[int, Shard] = {}
        self._lock = threading.Lock()

    def shard_path(self, partition: int) -> Path:
        """Where partition ``partition``'s database lives."""
        number = _int_in(partition, 0, 2**31)
        if number is None:
            raise InvalidKey(f"a shard is a partition number in [0, 2^31), got {partition!r}")
        return self.root / f"shard-{number:04d}"

    def shard(self, partition: int) -> Shard:
        """The shard of ``partition``, opened (and created if new) on first use, then cached."""
        path = self.shard_path(partition)
        partition = int(partition)
        with self._lock:
            shard = self._shards.get(partition)
            if shard is None:
                shard = Shard(
                    path,
                    partition,
                    sync=self.sync,
                    wal=self.wal,
                    write_buffer_bytes=self.write_buffer_bytes,
                )
                self._shards[partition] = shard
            return shard

    @property
    def open_partitions(self) -> list[int]:
        """Partitions whose shard is open, ascending."""
        with self._lock:
            return sorted(self._shards)

    def close_shard(self, partition: int) -> None:
        """Close one shard (its partition was revoked); a no-op if it is not open."""
        with self._lock:
            shard = self._shards.pop(partition, None)
        if shard is not None:
            shard.close()

    def all_domain_arms(self, tenant: str, workspace: str, domain: str) -> dict[str, ArmState]:
        """Every arm of a domain across the open shards.

        An arm found in two shards means the updates topic's partitioning changed under the
        store; that is refused (:class:`~learner.errors.StoreError`) rather than guessed.
        """
        found: dict[str, ArmState] = {}
        where: dict[str, str] = {}
        for partition in self.open_partitions:
            shard = self.shard(partition)
            for arm, state in shard.domain_arms(tenant, workspace, domain).items():
                if arm in found:
                    raise StoreError(
                        f"arm {arm!r} of {tenant}/{workspace}/{domain} is stored in both "
                        f"{where[arm]} and {shard.name}; did the updates topic's partition "
                        "count change?"
                    )
                found[arm] = state
                where[arm] = shard.name
        return found

    def close(self) -> None:
        """Close every open shard."""
        with self._lock:
            shards, self._shards = list(self._shards.values()), {}
        for shard in shards:
            shard.close()

    def __enter__(self) -> PosteriorStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Shard:
    """One partition's database. Obtain it from :meth:`PosteriorStore.shard`.

    Single writer: the offsets are cached in memory after opening, which is only correct
    because one worker owns a partition at a time.
    """

    def __init__(
        self,
        path: Path,
        partition: int,
        *,
        sync: bool = False,
        wal: bool = True,
        write_buffer_bytes: int = 64 << 20,
    ) -> None:
        _check_durability(sync, wal)
        self.path = Path(path)
        self.partition = partition
        self.name = self.path.name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(write_buffer_bytes)
        # After a crash, recover the WAL up to the last complete batch and drop a torn tail.
        options.set_wal_recovery_mode(rocksdict.DBRecoveryMode.point_in_time())
        options.set_keep_log_file_num(4)
        self._write_options = rocksdict.WriteOptions()
        self._write_options.sync = sync
        self._write_options.disable_wal = not wal
        self.wal = wal
        try:
            self._db: rocksdict.Rdict | None = rocksdict.Rdict(str(self.path), options)
        except Exception as error:  # rocksdict raises bare Exception (lock held, foreign DB)
            raise StoreError(f"{self.name}: cannot open {self.path}: {error}") from error
        try:
            self._check_format()
            self._offsets = self._read_offsets()
        except BaseException:
            self.close()
            raise

    # -- writing ---------------------------------------------------------------------------

    def apply(
        self,
        arm_states: Mapping[ArmKey, ArmState],
        offsets: Mapping[TopicPartition, int],
        resets: Mapping[tuple[str, str, str], int] | None = None,
    ) -> None:
        """Write the touched arms' states and the consumed offsets in one atomic batch.

        ``offsets`` maps each source ``(topic, partition)`` to the next offset to read;
        ``resets`` each (tenant, workspace, domain) to the time of its newest model reset.
        Everything is validated before anything is written; an offset below the stored one
        raises :class:`~learner.errors.OffsetRegression` and writes nothing.
        """
        db = self._open_db()
        batch = rocksdict.WriteBatch(raw_mode=True)
        advanced: dict[TopicPartition, int] = {}
        for (topic, partition), offset in offsets.items():
            key = _offset_key(topic, partition)
            partition = int(partition)
            number = _int_in(offset, 0, 2**63)
            if number is None:
                raise ValueError(
                    f"offset of {topic}[{partition}] must be an int >= 0, got {offset!r}"
                )
            offset = number
            stored = self._offsets.get((topic, partition))
            if stored is not None and offset < stored:
                raise OffsetRegression(
                    f"{self.name}: offset of {topic}[{partition}] would move back from "
                    f"{stored} to {offset}"
                )
            batch.put(key, offset.to_bytes(8, "big"))
            advanced[(topic, partition)] = offset
        for key, state in arm_states.items():
            batch.put(_state_key(key), _encode_state(state, ArmKey(*key)))
        for (tenant, workspace, domain), at in (resets or {}).items():
            number = _int_in(at, 0, 2**63)
            if number is None:
                raise ValueError(f"reset time of {tenant}/{workspace}/{domain} must be an int >= 0, got {at!r}")
            batch.put(_reset_key(tenant, workspace, domain), number.to_bytes(8, "big"))
        if batch.is_empty():
            return
        db.write(batch, self._write_options)
        self._offsets.update(advanced)

    # -- reading ---------------------------------------------------------------------------

    def get(self, key: ArmKey) -> ArmState | None:
        """The state of one model, or None if this shard has never stored it."""
        raw_key = _state_key(key)
        value = self._open_db().get(raw_key)
        return None if value is None else _decode_state(value, self.name, raw_key)

    def domain_arms(self, tenant: str, workspace: str, domain: str) -> dict[str, ArmState]:
        """Every arm of one domain in this shard (``""`` is the shared model), by arm id."""
        prefix = _domain_prefix(tenant, workspace, domain)
        return {
            raw_key[len(prefix) :].decode("utf-8"): _decode_state(value, self.name, raw_key)
            for raw_key, value in self._scan(prefix)
        }

    def arms(self) -> Iterator[tuple[ArmKey, ArmState]]:
        """Every model state in this shard, in key order (tenant, workspace, domain, arm)."""
        for raw_key, value in self._scan(_STATES):
            key = _parse_state_key(raw_key)
            if key is None:
                raise StoreCorruption(self.name, repr(raw_key), "malformed state key")
            yield key, _decode_state(value, self.name, raw_key)

    def resets(self) -> dict[tuple[str, str, str], int]:
        """Per (tenant, workspace, domain), the time of its newest model reset, as last applied."""
        out = {}
        for raw_key, value in self._scan(_RESETS):
            parts = raw_key[len(_RESETS) :].split(_SEP)
            if len(parts) != 3 or len(value) != 8:
                raise StoreCorruption(self.name, repr(raw_key), "malformed reset entry")
            out[tuple(part.decode("utf-8", "replace") for part in parts)] = int.from_bytes(value, "big")
        return out

    def offsets(self) -> dict[TopicPartition, int]:
        """The next offset to read per source ``(topic, partition)``, as last applied."""
        self._open_db()
        return dict(self._offsets)

    # -- maintenance -----------------------------------------------------------------------

    def checkpoint(self, dest: str | Path) -> Path:
        """A consistent copy of the shard in ``dest`` (which must not exist yet).

        SST files are hard-linked when ``dest`` is on the same filesystem, so it is cheap.
        The copy is a complete shard: place it as ``ROOT/shard-NNNN`` and open it with
        ``PosteriorStore(ROOT).shard(NNNN)``.
        """
        dest = Path(dest)
        if dest.exists():
            raise FileExistsError(f"checkpoint destination {dest} already exists")
        dest.parent.mkdir(parents=True, exist_ok=True)
        rocksdict.Checkpoint(self._open_db()).create_checkpoint(str(dest))
        return dest

    def flush(self, *, wait: bool = True) -> None:
        """Write the memtable to a table file. With ``wal=False`` this is what makes the batches
        applied so far survive a crash; ``wait=False`` schedules it in RocksDB's background
        thread (batches applied meanwhile go to a new memtable, so whatever a crash keeps is
        still a prefix of whole batches)."""
        self._open_db().flush(wait)

    def compact(self) -> None:
        """Flush and compact the whole shard, dropping overwritten state versions now."""
        db = self._open_db()
        db.flush()
        db.compact_range(None, None)

    def close(self) -> None:
        """Flush and close the database; later calls raise :class:`ShardClosed`."""
        db, self._db = self._db, None
        if db is not None:
            if not self.wal:
                db.flush(True)
            db.close()

    def __enter__(self) -> Shard:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self._db is not None else "closed"
        return f"Shard({str(self.path)!r}, partition={self.partition}, {state})"

    # -- internals -------------------------------------------------------------------------

    def _open_db(self) -> rocksdict.Rdict:
        if self._db is None:
            raise ShardClosed(f"{self.name} is closed")
        return self._db

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        # prefix ends in NUL, so bumping that byte to \x01 bounds exactly the prefix's keys
        read_options = rocksdict.ReadOptions()
        read_options.set_iterate_lower_bound(prefix)
        read_options.set_iterate_upper_bound(prefix[:-1] + b"\x01")
        yield from self._open_db().items(from_key=prefix, read_opt=read_options)

    def _check_format(self) -> None:
        db = self._open_db()
        meta = db.get(_META_FORMAT)
        if meta is None:
            if any(True for _ in db.keys()):
                raise StoreCorruption(
                    self.name, None, f"{self.path} holds data but no banditstream metadata"
                )
            record = {"format": _FORMAT, "version": _FORMAT_VERSION, "partition": self.partition}
            sync = rocksdict.WriteOptions()
            sync.sync = True
            batch = rocksdict.WriteBatch(raw_mode=True)
            batch.put(_META_FORMAT, json.dumps(record, sort_keys=True).encode("utf-8"))
            db.write(batch, sync)
            return
        try:
            record = json.loads(meta)
            known = (record["format"], record["version"], record["partition"])
        except (ValueError, TypeError, KeyError):
            raise StoreCorruption(self.name, "metadata", "unreadable store metadata") from None
        if known[0] != _FORMAT:
            raise StoreCorruption(self.name, "metadata", f"not a posterior shard ({known[0]!r})")
        if known[1] != _FORMAT_VERSION:
            raise StoreCorruption(
                self.name,
                "metadata",
                f"format version {known[1]} is not readable here (this reader knows "
                f"{_FORMAT_VERSION})",
            )
        if known[2] != self.partition:
            raise StoreCorruption(
                self.name,
                "metadata",
                f"holds partition {known[2]} but was opened as partition {self.partition}",
            )

    def _read_offsets(self) -> dict[TopicPartition, int]:
        offsets: dict[TopicPartition, int] = {}
        for raw_key, value in self._scan(_OFFSETS):
            body = raw_key[len(_OFFSETS) :]
            if len(body) < 6 or body[-5:-4] != _SEP or len(value) != 8:
                raise StoreCorruption(self.name, _describe_key(raw_key), "malformed offset entry")
            topic = body[:-5].decode("utf-8", "replace")
            offsets[(topic, int.from_bytes(body[-4:], "big"))] = int.from_bytes(value, "big")
        return offsets

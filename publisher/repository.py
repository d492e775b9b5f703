"""The snapshot repository of one tenant/workspace/domain, in The Update Framework's roles.

Layout in the store (``<tenant>/<workspace>/<domain>/``), as python-tuf's ngclient and any
TUF client expect it with consistent snapshots::

    metadata/1.root.json            root: the keys and thresholds of every role (signed offline)
    metadata/root.json              the same bytes, for bootstrapping tools
    metadata/timestamp.json         timestamp: the current snapshot version, short expiry
    metadata/N.snapshot.json        snapshot: the current targets version (+ length and hashes)
    metadata/N.targets.json         targets: every kept snapshot, its hashes and custom fields
    targets/<sha256>.snapshot-1.4.2.avro.zst     the snapshot blobs, hash-prefixed
    manifest.jsonl                  append-only audit log: one JSON line per change

The root document is shared by every domain of a deployment: it is created once
(:func:`create_root`, by ``banditstream keys generate``) and copied verbatim into each
repository, so one trusted ``root.json`` lets a client verify every domain.

Each target's custom fields carry ``version`` (semantic), ``state_major``, ``git_commit``,
``dimension``, ``arms``, ``samples``, ``source_offsets``, ``created_at``, ``channels`` and
``derived_from``. A channel (``canary``, ``stable``) has one head: the target whose
``channels`` lists it; publishing into or promoting to a channel moves its label, and never
backwards (a rollback publishes a *new* version carrying older state).

**Committing a change**, the steps of :meth:`Repository._commit`:

1. sign the new targets (version T+1) and *claim* it: write ``T+1.targets.json`` only if
   absent (S3 ``IfNoneMatch="*"``). Of two publishers that read the same head, exactly one
   claims T+1; the other gets :class:`~publisher.errors.VersionConflict` and nothing of it
   becomes visible. (A claim left behind by a publisher that died mid-commit is skipped once
   it is older than ``claim_timeout``.)
2. sign and write the snapshot (version S+1) pointing at T+1 (length and SHA-256);
3. sign the timestamp (V+1) pointing at S+1 and swap it in only if ``timestamp.json`` is still
   the one the head was read from (S3 ``IfMatch``); this is the moment the change is visible.

Blobs are uploaded before step 1 (content-addressed, so harmless if the commit loses) and
pruned blobs and metadata are deleted after step 3.

    >>> import tempfile
    >>> from publisher.signing import KeyRing
    >>> from publisher.stores import DirectoryStore
    >>> keys = KeyRing.generate()
    >>> repo = Repository(DirectoryStore(tempfile.mkdtemp()), keys=keys, root=create_root(keys), domain="route")
    >>> commit = repo.publish(b"state", {"version": "1.0.0", "state_major": 1}, channels=["canary"])
    >>> commit.entry.path, commit.entry.channels, commit.targets_version
    ('snapshot-1.0.0.avro.zst', ('canary',), 1)
    >>> repo.fetch(repo.channel_head("canary"))
    b'state'
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from tuf.api import exceptions as tuf_exceptions
from tuf.api.metadata import (
    MetaFile,
    Metadata,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization import DeserializationError

from publisher.errors import (
    AlreadyExists,
    ChannelError,
    KeyFileError,
    ObjectNotFound,
    PreconditionFailed,
    RepositoryError,
    VersionConflict,
    VersionNotFound,
)
from publisher.signing import ROLES, KeyRing
from publisher.snapshot import SemVer
from publisher.stores import SnapshotStore

__all__ = [
    "CHANNELS",
    "Commit",
    "Head",
    "Repository",
    "RepositoryConfig",
    "TargetEntry",
    "create_root",
    "repository_prefix",
    "target_name",
]

log = logging.getLogger(__name__)

#: The release channels: new state goes to canary, stable follows by promotion (or directly).
CHANNELS = ("canary", "stable")
_HASH = "sha256"


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def repository_prefix(tenant: str, workspace: str, domain: str) -> str:
    """Where a domain's repository lives in a store: ``tenant/workspace/domain``."""
    for what, value in (("tenant", tenant), ("workspace", workspace), ("domain", domain)):
        if not value or "/" in value or value in (".", ".."):
            raise ValueError(f"{what} must be a non-empty name without '/', got {value!r}")
    return f"{tenant}/{workspace}/{domain}"


def target_name(version: str | SemVer) -> str:
    """The TUF target path of a snapshot version: ``snapshot-1.4.2.avro.zst``."""
    return f"snapshot-{version}.avro.zst"


@dataclass(frozen=True)
class RepositoryConfig:
    """Lifetimes, retention and channels of a repository."""

    root_expiry: timedelta = timedelta(days=365)
    targets_expiry: timedelta = timedelta(days=30)
    snapshot_expiry: timedelta = timedelta(days=7)
    #: Short: a client refuses a timestamp older than this (freeze attacks), so the publisher
    #: re-signs it (:meth:`Repository.refresh`) well before it runs out.
    timestamp_expiry: timedelta = timedelta(days=1)
    #: Re-sign a role once less than this share of its lifetime is left.
    refresh_margin: float = 0.5
    #: Snapshots kept in targets (channel heads are always kept on top of these).
    keep_versions: int = 10
    #: Versioned snapshot/targets metadata files kept (clients mid-refresh may still read them).
    keep_metadata: int = 10
    #: A claimed targets version still unreferenced after this long was abandoned by its publisher.
    claim_timeout: timedelta = timedelta(minutes=10)
    channels: tuple[str, ...] = CHANNELS

    def __post_init__(self) -> None:
        for name in ("root_expiry", "targets_expiry", "snapshot_expiry", "timestamp_expiry", "claim_timeout"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.keep_versions < 1 or self.keep_metadata < 1:
            raise ValueError("keep_versions and keep_metadata must be >= 1")
        if not 0.0 < self.refresh_margin < 1.0:
            raise ValueError(f"refresh_margin must be in (0, 1), got {self.refresh_margin}")

    def expiry(self, role: str) -> timedelta:
        return getattr(self, f"{role}_expiry")


def create_root(
    keys: KeyRing,
    *,
    thresholds: Mapping[str, int] | None = None,
    expires: datetime | None = None,
    public_keys: Mapping[str, Sequence[Any]] | None = None,
    version: int = 1,
) -> bytes:
    """Signed root metadata naming every role's keys and threshold (default 1), as bytes.

    Keys come from ``keys`` (or ``public_keys`` per role, for keys held elsewhere); the root
    role's signers in ``keys`` sign it. Consistent snapshots are on.
    """
    expires = expires or _utcnow() + RepositoryConfig().root_expiry
    root = Root(version=version, expires=expires, consistent_snapshot=True)
    thresholds = dict(thresholds or {})
    for role in ROLES:
        role_keys = list(public_keys[role]) if public_keys and role in public_keys else keys.public_keys(role)
        for key in role_keys:
            root.add_key(key, role)
        threshold = int(thresholds.get(role, 1))
        if not 1 <= threshold <= len(role_keys):
            raise KeyFileError(f"threshold {threshold} for {role} needs at least that many keys, got {len(role_keys)}")
        root.roles[role].threshold = threshold
    metadata = Metadata(root)
    for signer in keys.signers("root"):
        metadata.sign(signer, append=True)
    root.verify_delegate(Root.type, metadata.signed_bytes, metadata.signatures)
    return metadata.to_bytes()


@dataclass(frozen=True)
class TargetEntry:
    """One kept snapshot as targets metadata lists it."""

    path: str
    version: SemVer
    length: int
    sha256: str
    custom: Mapping[str, Any]

    @property
    def channels(self) -> tuple[str, ...]:
        return tuple(self.custom.get("channels", ()))

    @property
    def blob_key(self) -> str:
        """Where the blob lives under the repository (consistent snapshots: hash-prefixed)."""
        directory, sep, base = self.path.rpartition("/")
        return f"targets/{directory}{sep}{self.sha256}.{base}"

    @classmethod
    def from_target(cls, target: TargetFile) -> TargetEntry:
        custom = target.custom or {}
        try:
            version = SemVer.parse(custom.get("version", ""))
        except ValueError as exc:
            raise RepositoryError(f"target {target.path} has no valid custom version: {exc}") from None
        return cls(target.path, version, target.length, target.hashes.get(_HASH, ""), custom)

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "length": self.length, _HASH: self.sha256, **self.custom}


@dataclass
class Head:
    """The repository as last read: verified metadata, and the tag to swap the timestamp on."""

    root: Metadata[Root]
    timestamp: Metadata[Timestamp] | None = None
    timestamp_tag: str | None = None
    snapshot: Metadata[Snapshot] | None = None
    targets: Metadata[Targets] | None = None

    @property
    def empty(self) -> bool:
        return self.targets is None

    def entries(self) -> list[TargetEntry]:
        """Every kept snapshot, oldest version first."""
        if self.targets is None:
            return []
        return sorted((TargetEntry.from_target(t) for t in self.targets.signed.targets.values()), key=lambda e: e.version)

    def channel_head(self, channel: str) -> TargetEntry | None:
        heads = [e for e in self.entries() if channel in e.channels]
        return heads[-1] if heads else None


@dataclass(frozen=True)
class Commit:
    """What a committed change produced."""

    entry: TargetEntry | None
    targets_version: int
    snapshot_version: int
    timestamp_version: int
    removed: tuple[TargetEntry, ...] = field(default_factory=tuple)


class Repository:
    """One tenant/workspace/domain repository in a store, read and written through TUF metadata.

    ``keys`` must hold the targets, snapshot and timestamp signers (root is only needed to
    create the root document); ``root`` is the signed root metadata this deployment trusts.
    ``clock`` returns the current UTC time (tests move it to sign expired metadata).
    """

    def __init__(
        self,
        store: SnapshotStore,
        *,
        keys: KeyRing,
        root: bytes,
        domain: str,
        tenant: str = "default",
        workspace: str = "main",
        config: RepositoryConfig | None = None,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.store = store
        self.keys = keys
        self.tenant, self.workspace, self.domain = tenant, workspace, domain
        self.prefix = repository_prefix(tenant, workspace, domain)
        self.config = config or RepositoryConfig()
        self.clock = clock
        self._trusted_root_bytes = root
        try:
            self._trusted_root: Metadata[Root] = Metadata[Root].from_bytes(root)
        except (DeserializationError, ValueError) as exc:
            raise KeyFileError(f"trusted root is not TUF root metadata: {exc}") from None

    # --- keys in the store -----------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def _meta_key(self, role: str, version: int | None = None) -> str:
        return self._key(f"metadata/{role}.json" if version is None else f"metadata/{version}.{role}.json")

    @property
    def manifest_key(self) -> str:
        return self._key("manifest.jsonl")

    # --- reading ---------------------------------------------------------------------------------

    def head(self) -> Head:
        """The current repository state, every document verified against the (latest) root."""
        root = self._load_root()
        head = Head(root)
        try:
            data, tag = self.store.get_tagged(self._meta_key("timestamp"))
        except ObjectNotFound:
            return head
        head.timestamp, head.timestamp_tag = self._verified(root, Timestamp, data), tag
        snapshot_meta = head.timestamp.signed.snapshot_meta
        data = self._get_meta("snapshot", snapshot_meta.version)
        self._check_meta(snapshot_meta, data, "snapshot")
        head.snapshot = self._verified(root, Snapshot, data)
        targets_meta = head.snapshot.signed.meta["targets.json"]
        data = self._get_meta("targets", targets_meta.version)
        self._check_meta(targets_meta, data, "targets")
        head.targets = self._verified(root, Targets, data)
        return head

    def versions(self) -> list[TargetEntry]:
        return self.head().entries()

    def latest(self) -> TargetEntry | None:
        entries = self.versions()
        return entries[-1] if entries else None

    def channel_head(self, channel: str) -> TargetEntry | None:
        self._check_channel(channel)
        return self.head().channel_head(channel)

    def entry(self, version: str | SemVer, head: Head | None = None) -> TargetEntry:
        wanted = SemVer.parse(str(version))
        for entry in (head or self.head()).entries():
            if entry.version == wanted:
                return entry
        raise VersionNotFound(f"{self.prefix} keeps no snapshot {wanted}", subject=self.prefix)

    def fetch(self, entry: TargetEntry) -> bytes:
        """A kept snapshot's blob, checked against the length and hash that targets signed."""
        data = self.store.get(self._key(entry.blob_key))
        if len(data) != entry.length or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise RepositoryError(f"{self.prefix}/{entry.blob_key} does not match its targets entry", subject=entry.path)
        return data

    def drift_acknowledged_at(self) -> datetime | None:
        """When an operator last acknowledged this domain's drift (None: never)."""
        try:
            data = json.loads(self.store.get(self._key("drift-ack.json")))
        except ObjectNotFound:
            return None
        return datetime.fromisoformat(data["acknowledged_at"])

    def acknowledge_drift(self, note: str = "") -> datetime:
        """Record that the drift the guard flags is accepted: the guard judges from the data
        the next snapshot carries on (see :mod:`publisher.guards`). Noted in the audit log."""
        at = self.clock()
        stamp = at.isoformat(timespec="milliseconds")
        self.store.put(self._key("drift-ack.json"), json.dumps({"acknowledged_at": stamp, "note": note}).encode("utf-8"))
        line = {"at": stamp, "event": "ack-drift", "note": note}
        self.store.append(self.manifest_key, (json.dumps(line, sort_keys=True) + "\n").encode("utf-8"))
        return at

    def manifest(self) -> list[dict[str, Any]]:
        """The audit log, one dict per line, oldest first."""
        try:
            text = self.store.get(self.manifest_key).decode("utf-8")
        except ObjectNotFound:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _load_root(self) -> Metadata[Root]:
        """The newest root in the store, each version verified by its predecessor and itself.

        An empty repository gets the trusted root written as ``1.root.json``.
        """
        trusted = self._trusted_root
        try:
            first = self.store.get(self._meta_key("root", 1))
        except ObjectNotFound:
            if trusted.signed.version != 1:
                raise RepositoryError(f"{self.prefix} has no 1.root.json and the trusted root is v{trusted.signed.version}") from None
            self._write_new_or_same(self._meta_key("root", 1), self._trusted_root_bytes)
            self.store.put(self._meta_key("root"), self._trusted_root_bytes)
            first = self._trusted_root_bytes
        current = self._verified_root(trusted, first, expect_version=1) if trusted.signed.version == 1 else trusted
        version = current.signed.version
        while True:
            try:
                data = self.store.get(self._meta_key("root", version + 1))
            except ObjectNotFound:
                return current
            current = self._verified_root(current, data, expect_version=version + 1)
            version += 1

    def _verified_root(self, trusted: Metadata[Root], data: bytes, expect_version: int) -> Metadata[Root]:
        new = self._parse(Root, data)
        if new.signed.version != expect_version:
            raise RepositoryError(f"{self.prefix}: expected root v{expect_version}, found v{new.signed.version}")
        try:
            trusted.signed.verify_delegate(Root.type, new.signed_bytes, new.signatures)
            new.signed.verify_delegate(Root.type, new.signed_bytes, new.signatures)
        except tuf_exceptions.UnsignedMetadataError as exc:
            raise RepositoryError(f"{self.prefix}: root v{expect_version} does not verify: {exc}") from None
        return new

    def _get_meta(self, role: str, version: int) -> bytes:
        try:
            return self.store.get(self._meta_key(role, version))
        except ObjectNotFound:
            raise RepositoryError(f"{self.prefix}: {version}.{role}.json is referenced but missing") from None

    def _parse(self, cls: type, data: bytes) -> Metadata:
        try:
            metadata = Metadata.from_bytes(data)
        except (DeserializationError, ValueError) as exc:
            raise RepositoryError(f"{self.prefix}: metadata does not parse: {exc}") from None
        if not isinstance(metadata.signed, cls):
            raise RepositoryError(f"{self.prefix}: expected {cls.type} metadata, got {metadata.signed.type}")
        return metadata

    def _verified(self, root: Metadata[Root], cls: type, data: bytes) -> Metadata:
        metadata = self._parse(cls, data)
        try:
            root.signed.verify_delegate(cls.type, metadata.signed_bytes, metadata.signatures)
        except tuf_exceptions.UnsignedMetadataError as exc:
            raise RepositoryError(f"{self.prefix}: {cls.type} does not verify: {exc}") from None
        return metadata

    def _check_meta(self, meta: MetaFile, data: bytes, role: str) -> None:
        try:
            meta.verify_length_and_hashes(data)
        except tuf_exceptions.LengthOrHashMismatchError as exc:
            raise RepositoryError(f"{self.prefix}: {role} does not match its meta: {exc}") from None

    # --- changing --------------------------------------------------------------------------------

    def publish(
        self,
        blob: bytes,
        custom: Mapping[str, Any],
        *,
        channels: Iterable[str] = CHANNELS,
        head: Head | None = None,
        event: str = "publish",
    ) -> Commit:
        """Add a snapshot blob as a new target (``custom["version"]`` names it) and commit.

        ``head`` is the state the caller chose the version from; if another publisher
        committed since, this raises :class:`VersionConflict`. Channels listed move to the new
        version; versions beyond ``keep_versions`` that head no channel are pruned.
        """
        head = head or self.head()
        channels = tuple(dict.fromkeys(channels))
        for channel in channels:
            self._check_channel(channel)
        version = SemVer.parse(str(custom.get("version", "")))
        entries = head.entries()
        if entries and version <= entries[-1].version:
            raise VersionConflict(f"{self.prefix}: version {version} is not newer than {entries[-1].version}", subject=self.prefix)
        path = target_name(version)
        target = TargetFile.from_data(path, blob, [_HASH])
        target.unrecognized_fields["custom"] = {**custom, "version": str(version), "channels": list(channels)}
        entry = TargetEntry.from_target(target)
        self._write_new_or_same(self._key(entry.blob_key), blob)  # content-addressed: a retry rewrites the same bytes

        targets = self._next_targets(head)
        for existing in targets.targets.values():  # a channel has one head
            existing_channels = (existing.custom or {}).get("channels", [])
            if any(c in channels for c in existing_channels):
                existing.unrecognized_fields["custom"]["channels"] = [c for c in existing_channels if c not in channels]
        targets.targets[path] = target
        removed = self._retain(targets)
        commit = self._commit(head, targets, entry=entry, removed=removed)
        self._record(event, commit, entry.describe())
        self._clean_up(commit)
        return commit

    def promote(self, version: str | SemVer, channel: str = "stable", *, head: Head | None = None) -> Commit | None:
        """Make a kept version the head of ``channel``; None if it already is.

        Refuses a version older than the channel's current head: clients never move back
        (publish a rollback instead, which is a new version).
        """
        self._check_channel(channel)
        head = head or self.head()
        entry = self.entry(version, head)
        current = head.channel_head(channel)
        if current is not None and current.version == entry.version:
            return None
        if current is not None and entry.version < current.version:
            raise ChannelError(
                f"{self.prefix}: promoting {entry.version} would move {channel} back from {current.version}; "
                "roll back instead (a new version carrying the older state)",
                subject=channel,
            )
        targets = self._next_targets(head)
        for target in targets.targets.values():
            custom = target.unrecognized_fields.setdefault("custom", {})
            chans = [c for c in custom.get("channels", []) if c != channel]
            if target.path == entry.path:
                chans.append(channel)
            custom["channels"] = chans
        promoted = TargetEntry.from_target(targets.targets[entry.path])
        commit = self._commit(head, targets, entry=promoted)
        self._record("promote", commit, {"version": str(entry.version), "channel": channel, "path": entry.path})
        return commit

    def prune(self, keep: int | None = None, *, head: Head | None = None) -> Commit | None:
        """Drop all but the newest ``keep`` versions (and channel heads); None if nothing to drop."""
        head = head or self.head()
        if head.empty:
            return None
        targets = self._next_targets(head)
        removed = self._retain(targets, keep)
        if not removed:
            return None
        commit = self._commit(head, targets, removed=removed)
        self._record("prune", commit, {})
        self._clean_up(commit)
        return commit

    def refresh(self, *, force: bool = False, head: Head | None = None) -> list[str]:
        """Re-sign what is about to expire (``force``: everything); returns the roles re-signed.

        Targets or snapshot close to expiry: a full commit with unchanged targets. Otherwise,
        the timestamp alone gets a new version pointing at the same snapshot.
        """
        head = head or self.head()
        if head.empty:
            return []
        due = [r for r in ("targets", "snapshot", "timestamp") if force or self._expiring(getattr(head, r).signed, r)]
        if not due:
            return []
        if "targets" in due or "snapshot" in due:
            self._commit(head, self._next_targets(head))
            return ["targets", "snapshot", "timestamp"]
        self._swap_timestamp(head, head.timestamp.signed.snapshot_meta)
        return ["timestamp"]

    def _expiring(self, signed: Any, role: str) -> bool:
        left = signed.expires - self.clock()
        return left < self.config.expiry(role) * self.config.refresh_margin

    def _check_channel(self, channel: str) -> None:
        if channel not in self.config.channels:
            raise ChannelError(f"unknown channel {channel!r}; channels are {', '.join(self.config.channels)}", subject=channel)

    def _next_targets(self, head: Head) -> Targets:
        """A copy of the current targets to edit (a fresh one for an empty repository)."""
        if head.targets is None:
            return Targets(version=1, expires=self.clock())
        return copy.deepcopy(head.targets.signed)

    def _retain(self, targets: Targets, keep: int | None = None) -> tuple[TargetEntry, ...]:
        """Remove from ``targets`` the versions beyond the newest ``keep`` that head no channel."""
        keep = self.config.keep_versions if keep is None else keep
        entries = sorted((TargetEntry.from_target(t) for t in targets.targets.values()), key=lambda e: e.version)
        newest = {e.path for e in entries[-keep:]} if keep > 0 else set()
        removed = tuple(e for e in entries if e.path not in newest and not e.channels)
        for entry in removed:
            del targets.targets[entry.path]
        return removed

    # --- the commit protocol (see the module docstring) ------------------------------------------

    def _commit(
        self,
        head: Head,
        targets: Targets,
        *,
        entry: TargetEntry | None = None,
        removed: tuple[TargetEntry, ...] = (),
    ) -> Commit:
        now = self.clock()
        base_targets = head.targets.signed.version if head.targets else 0
        base_snapshot = head.snapshot.signed.version if head.snapshot else 0
        targets_version, targets_bytes = self._claim_targets(targets, base_targets + 1, now)
        snapshot_version = None
        try:
            snapshot_version, snapshot_bytes = self._write_snapshot(base_snapshot + 1, targets_version, targets_bytes, now)
            timestamp_version = self._swap_timestamp(head, MetaFile.from_data(snapshot_version, snapshot_bytes, [_HASH]))
        except VersionConflict:
            # Unreferenced by any timestamp: no client can have trusted them.
            self.store.delete(self._meta_key("targets", targets_version))
            if snapshot_version is not None:
                self.store.delete(self._meta_key("snapshot", snapshot_version))
            raise
        log.info(
            "%s: committed targets v%d, snapshot v%d, timestamp v%d", self.prefix, targets_version, snapshot_version, timestamp_version
        )
        return Commit(entry, targets_version, snapshot_version, timestamp_version, removed)

    def _sign(self, signed: Any, role: str) -> bytes:
        metadata = Metadata(signed)
        signers = self.keys.signers(role)
        for signer in signers:
            metadata.sign(signer, append=True)
        return metadata.to_bytes()

    def _claim_targets(self, targets: Targets, version: int, now: datetime) -> tuple[int, bytes]:
        """Step 1: write ``N.targets.json`` only if absent; skip claims abandoned long ago."""
        targets.expires = now + self.config.targets_expiry
        for _ in range(100):
            targets.version = version
            data = self._sign(targets, "targets")
            key = self._meta_key("targets", version)
            try:
                self.store.put_new(key, data)
                return version, data
            except AlreadyExists:
                age = now.timestamp() - self._modified(key)
                if age < self.config.claim_timeout.total_seconds():
                    raise VersionConflict(
                        f"{self.prefix}: targets v{version} was claimed by another publisher {age:.1f}s ago", subject=self.prefix
                    ) from None
                log.warning("%s: skipping targets v%d, claimed %.0fs ago and never committed", self.prefix, version, age)
                version += 1
        raise VersionConflict(f"{self.prefix}: no free targets version near {version}", subject=self.prefix)

    def _modified(self, key: str) -> float:
        try:
            return self.store.stat(key).modified
        except ObjectNotFound:
            return 0.0

    def _write_snapshot(self, version: int, targets_version: int, targets_bytes: bytes, now: datetime) -> tuple[int, bytes]:
        """Step 2: the snapshot pointing at the claimed targets; an orphan at N is skipped."""
        snapshot = Snapshot(version=version, expires=now + self.config.snapshot_expiry)
        snapshot.meta["targets.json"] = MetaFile.from_data(targets_version, targets_bytes, [_HASH])
        for _ in range(100):
            snapshot.version = version
            data = self._sign(snapshot, "snapshot")
            try:
                self.store.put_new(self._meta_key("snapshot", version), data)
                return version, data
            except AlreadyExists:
                version += 1
        raise VersionConflict(f"{self.prefix}: no free snapshot version near {version}", subject=self.prefix)

    def _swap_timestamp(self, head: Head, snapshot_meta: MetaFile) -> int:
        """Step 3: the new timestamp replaces exactly the one the head was read from."""
        version = head.timestamp.signed.version + 1 if head.timestamp else 1
        timestamp = Timestamp(version=version, expires=self.clock() + self.config.timestamp_expiry, snapshot_meta=snapshot_meta)
        data = self._sign(timestamp, "timestamp")
        key = self._meta_key("timestamp")
        try:
            if head.timestamp_tag is None:
                self.store.put_new(key, data)
            else:
                self.store.put_if_match(key, data, head.timestamp_tag)
        except (AlreadyExists, PreconditionFailed):
            raise VersionConflict(f"{self.prefix}: the timestamp moved while committing", subject=self.prefix) from None
        return version

    def _write_new_or_same(self, key: str, data: bytes) -> None:
        try:
            self.store.put_new(key, data)
        except AlreadyExists:
            if self.store.get(key) != data:
                raise RepositoryError(f"{self.prefix}: {key} exists with other content") from None

    def _record(self, event: str, commit: Commit, details: Mapping[str, Any]) -> None:
        """Append one line to the audit log (after the commit: the log lists what happened)."""
        line = {
            "at": self.clock().isoformat(timespec="milliseconds"),
            "event": event,
            **details,
            "targets_version": commit.targets_version,
            "snapshot_version": commit.snapshot_version,
            "timestamp_version": commit.timestamp_version,
        }
        if commit.removed:
            line["removed"] = [str(e.version) for e in commit.removed]
        self.store.append(self.manifest_key, (json.dumps(line, sort_keys=True) + "\n").encode("utf-8"))

    def _clean_up(self, commit: Commit) -> None:
        """After a commit: delete pruned blobs nobody references and old versioned metadata."""
        if commit.removed:
            referenced = {e.blob_key for e in self.versions()}
            for entry in commit.removed:
                if entry.blob_key not in referenced:
                    self.store.delete(self._key(entry.blob_key))
        keep = self.config.keep_metadata
        for role, current in (("targets", commit.targets_version), ("snapshot", commit.snapshot_version)):
            for info in self.store.list(self._key("metadata/")):
                name = info.key.rsplit("/", 1)[-1]
                number, _, rest = name.partition(".")
                if rest == f"{role}.json" and number.isdigit() and int(number) <= current - keep:
                    self.store.delete(info.key)


def manifest_versions(lines: Iterable[Mapping[str, Any]]) -> list[str]:
    """Versions the audit log says were published (in order), rollbacks, restores and resets included."""
    return [line["version"] for line in lines if line.get("event") in ("publish", "rollback", "restore", "reset")]


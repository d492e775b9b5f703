"""The verifying pull client: nothing from the repository is trusted before the whole chain checks.

:meth:`SnapshotClient.refresh` follows The Update Framework's client workflow, through
python-tuf's ngclient ``Updater`` reading our store:

1. **root**: start from the trusted root (given, never downloaded), then walk ``N+1.root.json``
   while it exists, each version signed by a threshold of the previous one's root keys and
   of its own;
2. **timestamp**: signed by a threshold of timestamp keys, not expired (freeze attack), version
   not below the one cached locally (rollback attack);
3. **snapshot**: length and hash as the timestamp says, signed, not expired, no role version
   going backwards;
4. **targets**: length and hash as the snapshot says, signed, not expired;

then for the domain's channel:

5. **choose** the target that heads the channel; its version must not be older than the
   snapshot this client already holds, and its major must be the one this code reads;
6. **fetch** it (from the local cache when it already holds it), checking the length and the
   SHA-256 that targets signed;
7. **load** it: decode, check that it is the domain asked for and its state major.

A failure at any step raises a typed :class:`~publisher.errors.PullError`, counts
``banditstream_snapshot_verification_failures_total{kind=...}``, and leaves the last good
snapshot in place (:attr:`SnapshotClient.current`). Verified metadata and the last good blob
are cached under ``cache_dir``, so rollback protection survives restarts and
:meth:`SnapshotClient.load_cached` can start a service while the repository is unreachable.

    client = SnapshotClient("s3://snapshots/prod", "/var/cache/banditstream", "root.json",
                            domain="route", channel="stable", s3={"endpoint_url": ...})
    loaded = client.refresh()          # LoadedSnapshot: .snapshot, .policy, .version, .expires
    choice = loaded.policy.probabilities(X, arms)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from tuf.api import exceptions as tuf_exceptions
from tuf.api.metadata import Metadata, Root, Snapshot as SnapshotRole, Targets, Timestamp
from tuf.api.serialization import DeserializationError
from tuf.ngclient import FetcherInterface, Updater, UpdaterConfig

from learner.policies import Policy
from publisher.errors import (
    ExpiredMetadataError,
    HashMismatchError,
    KeyFileError,
    LengthMismatchError,
    MajorVersionError,
    MetadataFormatError,
    ObjectNotFound,
    PullError,
    RepositoryUnavailable,
    RollbackError,
    SignatureError,
    SnapshotFormatError,
    SnapshotNotFound,
    StoreError,
)
from publisher.repository import CHANNELS, TargetEntry, repository_prefix
from publisher.snapshot import DEFAULT_MAX_DECOMPRESSED, STATE_MAJOR, SemVer, Snapshot
from publisher.stores import SnapshotStore, open_store

__all__ = ["ClientConfig", "ClientMetrics", "LoadedSnapshot", "SnapshotClient", "StoreFetcher"]

log = logging.getLogger(__name__)

_SCHEME = "bsstore"


@dataclass(frozen=True)
class ClientConfig:
    """Limits of the pull client."""

    #: Largest snapshot blob accepted (targets metadata states the length; this caps it).
    max_snapshot_bytes: int = 1 << 30
    #: Largest decompressed snapshot accepted.
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED
    #: State major this code reads.
    state_major: int = STATE_MAJOR
    #: ngclient's limits on metadata files (root, timestamp, snapshot, targets sizes, rotations).
    updater: UpdaterConfig = field(default_factory=UpdaterConfig)


class ClientMetrics:
    """The pull client's metrics: failures by kind, refreshes by outcome, the held version."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.failures = Counter(
            "banditstream_snapshot_verification_failures", "Refreshes refused, by kind (signature, expired, rollback, ...).",
            ["domain", "kind"], registry=r,
        )  # fmt: skip
        self.refreshes = Counter(
            "banditstream_snapshot_refreshes", "Refreshes, by outcome (updated, unchanged, failed).", ["domain", "outcome"], registry=r
        )
        self.version = Gauge(
            "banditstream_snapshot_loaded_info", "The snapshot version held (value 1).", ["domain", "version"], registry=r
        )
        self.created = Gauge(
            "banditstream_snapshot_created_timestamp_seconds", "Creation time of the snapshot held.", ["domain"], registry=r
        )


@dataclass(frozen=True)
class LoadedSnapshot:
    """A verified snapshot and what vouched for it."""

    snapshot: Snapshot
    #: The snapshot's scoring-only policy, loaded (and so checked) during verification.
    policy: Policy
    target: TargetEntry
    channel: str
    #: Earliest expiry of the timestamp, snapshot and targets metadata that vouched for it.
    expires: datetime
    verified_at: datetime

    @property
    def version(self) -> str:
        return self.snapshot.version

    def expired(self, now: datetime | None = None) -> bool:
        return (now or datetime.now(timezone.utc)) >= self.expires


class StoreFetcher(FetcherInterface):
    """ngclient transport over a :class:`~publisher.stores.SnapshotStore`.

    URLs are ``bsstore:///<key>``; a missing object answers HTTP 404 as a server would, so
    ngclient's root walk stops at the newest root.
    """

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store

    @staticmethod
    def url(key: str) -> str:
        return f"{_SCHEME}:///{urllib.parse.quote(key)}"

    def _fetch(self, url: str) -> Iterator[bytes]:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme != _SCHEME:
            raise tuf_exceptions.DownloadError(f"StoreFetcher reads {_SCHEME}:/// URLs, got {url}")
        key = urllib.parse.unquote(parsed.path.lstrip("/"))
        try:
            data = self.store.get(key)
        except ObjectNotFound:
            raise tuf_exceptions.DownloadHTTPError(f"{key} not found in {self.store.location}", 404) from None
        except StoreError as exc:
            raise tuf_exceptions.DownloadError(f"{self.store.location}: {exc}") from exc
        return iter((data,))


def _translate(exc: Exception, what: str) -> PullError:
    """A python-tuf or store failure as the typed error callers catch by meaning."""
    message = f"{what}: {exc}"
    if isinstance(exc, PullError):
        return exc
    if isinstance(exc, tuf_exceptions.UnsignedMetadataError):
        return SignatureError(message, subject=what)
    if isinstance(exc, tuf_exceptions.ExpiredMetadataError):
        return ExpiredMetadataError(message, subject=what)
    if isinstance(exc, tuf_exceptions.BadVersionNumberError):
        return RollbackError(message, subject=what)
    if isinstance(exc, tuf_exceptions.LengthOrHashMismatchError):
        if "length" in str(exc).lower():
            return LengthMismatchError(message, subject=what)
        return HashMismatchError(message, subject=what)
    if isinstance(exc, tuf_exceptions.DownloadLengthMismatchError):
        return LengthMismatchError(message, subject=what)
    if isinstance(exc, tuf_exceptions.DownloadHTTPError) and exc.status_code == 404:
        return SnapshotNotFound(f"{what}: the repository has no such metadata yet ({exc})", subject=what)
    if isinstance(exc, (tuf_exceptions.DownloadError, StoreError)):
        return RepositoryUnavailable(message, subject=what)
    if isinstance(exc, (tuf_exceptions.RepositoryError, DeserializationError, SnapshotFormatError, ValueError, KeyError)):
        return MetadataFormatError(message, subject=what)
    if isinstance(exc, OSError):
        return PullError(f"{what}: local cache: {exc}", subject=what)
    raise exc


class SnapshotClient:
    """Pulls, verifies, caches and loads one domain's snapshot from a channel.

    ``repository`` is a store or a location (path, ``file://``, ``s3://bucket/prefix`` with
    boto3 kwargs in ``s3``, ``http(s)://``); ``trusted_root`` the deployment's root metadata
    (bytes or a path); ``cache_dir`` holds verified metadata and the last good blob. Not
    safe for concurrent refreshes: one client per process and domain (``refresh`` holds a lock).
    """

    def __init__(
        self,
        repository: str | os.PathLike[str] | SnapshotStore,
        cache_dir: str | os.PathLike[str],
        trusted_root: bytes | str | os.PathLike[str],
        *,
        domain: str,
        tenant: str = "default",
        workspace: str = "main",
        channel: str = "stable",
        config: ClientConfig | None = None,
        metrics: ClientMetrics | None = None,
        s3: Mapping[str, Any] | None = None,
    ) -> None:
        if channel not in CHANNELS:
            raise ValueError(f"unknown channel {channel!r}; channels are {', '.join(CHANNELS)}")
        self.store = open_store(repository, s3=s3)
        self.domain, self.tenant, self.workspace, self.channel = domain, tenant, workspace, channel
        self.prefix = repository_prefix(tenant, workspace, domain)
        self.config = config or ClientConfig()
        self.metrics = metrics or ClientMetrics()
        self._root = _read_root(trusted_root)
        self._dir = Path(cache_dir) / self.prefix
        self._metadata_dir = self._dir / "metadata"
        self._targets_dir = self._dir / "targets"
        self._metadata_dir.mkdir(parents=True, exist_ok=True)
        self._targets_dir.mkdir(parents=True, exist_ok=True)
        self._fetcher = StoreFetcher(self.store)
        self._lock = threading.Lock()
        self._current: LoadedSnapshot | None = None
        self.last_error: PullError | None = None

    @property
    def current(self) -> LoadedSnapshot | None:
        """The last good snapshot (survives failed refreshes), or None."""
        return self._current

    # --- the workflow ----------------------------------------------------------------------------

    def refresh(self) -> LoadedSnapshot:
        """Verify the repository's newest metadata and load the channel's snapshot.

        Returns the snapshot now held (the same object when nothing changed). Raises a
        :class:`~publisher.errors.PullError` subclass and keeps :attr:`current` on failure.
        """
        with self._lock, self._failures_counted():
            updater = self._open_updater()
            self._load_metadata(updater)
            target = self._choose_target(updater)
            if self._current is not None and self._current.target.sha256 == target.sha256:
                self._current = self._vouched(self._current.snapshot, self._current.policy, target)
                self.metrics.refreshes.labels(self.domain, "unchanged").inc()
                return self._current
            data = self._fetch_target(target)
            loaded = self._vouched(*self._load(target, data), target)
            self._accept(loaded, data)
            return loaded

    def _open_updater(self) -> Updater:
        """ngclient's Updater over our store, rooted in the trusted root; metadata cached locally."""
        base = StoreFetcher.url(f"{self.prefix}/metadata/")
        try:
            return Updater(
                str(self._metadata_dir), base, str(self._targets_dir), StoreFetcher.url(f"{self.prefix}/targets/"),
                fetcher=self._fetcher, config=self.config.updater, bootstrap=self._root,
            )  # fmt: skip
        except (tuf_exceptions.RepositoryError, OSError) as exc:
            raise _translate(exc, "trusted root") from exc

    def _load_metadata(self, updater: Updater) -> None:
        """Steps 1-4: root -> timestamp -> snapshot -> targets, every check of the TUF workflow."""
        try:
            updater.refresh()
        except (tuf_exceptions.RepositoryError, tuf_exceptions.DownloadError, OSError) as exc:
            raise _translate(exc, f"{self.prefix} metadata") from exc

    def _choose_target(self, updater: Updater) -> TargetEntry:
        """Step 5: the head of the channel, no older than what is held, of our state major."""
        targets = self._trusted_targets()
        heads = [e for e in targets if self.channel in e.channels]
        if not heads:
            raise SnapshotNotFound(f"{self.prefix} has no {self.channel} snapshot", subject=self.prefix)
        path = max(heads, key=lambda e: e.version).path
        info = updater.get_targetinfo(path)  # from here on, only what the verified set says
        if info is None:
            raise MetadataFormatError(f"{self.prefix}: {path} is not in the verified targets", subject=path)
        entry = TargetEntry.from_target(info)
        if self.channel not in entry.channels:
            raise MetadataFormatError(f"{self.prefix}: {path} does not head {self.channel} in the verified targets", subject=path)
        if entry.version.major != self.config.state_major or int(entry.custom.get("state_major", -1)) != self.config.state_major:
            raise MajorVersionError(
                f"{self.prefix} {self.channel} is at {entry.version} (state major {entry.custom.get('state_major')}); "
                f"this code reads state major {self.config.state_major}",
                subject=entry.path,
            )
        held = self._held_version()
        if held is not None and entry.version < held:
            raise RollbackError(
                f"{self.prefix} {self.channel} offers {entry.version}, older than {held} already loaded", subject=entry.path
            )
        if entry.length > self.config.max_snapshot_bytes:
            raise LengthMismatchError(
                f"{entry.path} is {entry.length} bytes; the limit is {self.config.max_snapshot_bytes}", subject=entry.path
            )
        return entry

    def _fetch_target(self, target: TargetEntry) -> bytes:
        """Step 6: the blob from the cache or the store, exactly as long and hashed as signed."""
        cached = self._targets_dir / _cache_name(target)
        with contextlib.suppress(OSError):
            data = cached.read_bytes()
            if len(data) == target.length and hashlib.sha256(data).hexdigest() == target.sha256:
                return data
        try:
            data = self._fetcher.download_bytes(StoreFetcher.url(f"{self.prefix}/{target.blob_key}"), target.length)
        except (tuf_exceptions.DownloadError, OSError) as exc:
            raise _translate(exc, f"{self.prefix}/{target.blob_key}") from exc
        if len(data) != target.length:
            raise LengthMismatchError(f"{target.path} is {len(data)} bytes; targets signed {target.length}", subject=target.path)
        digest = hashlib.sha256(data).hexdigest()
        if digest != target.sha256:
            raise HashMismatchError(f"{target.path} hashes to {digest}; targets signed {target.sha256}", subject=target.path)
        return data

    def _load(self, target: TargetEntry, data: bytes) -> tuple[Snapshot, Policy]:
        """Step 7: decode; it must be this domain's snapshot at the version targets named."""
        try:
            snapshot = Snapshot.from_bytes(
                data, max_decompressed=self.config.max_decompressed_bytes, expect_major=self.config.state_major
            )
        except SnapshotFormatError as exc:
            raise MetadataFormatError(f"{target.path}: {exc}", subject=target.path) from exc
        identity = (snapshot.tenant, snapshot.workspace, snapshot.domain, snapshot.version)
        expected = (self.tenant, self.workspace, self.domain, str(target.version))
        if identity != expected:
            raise MetadataFormatError(f"{target.path} holds {'/'.join(identity)}, expected {'/'.join(expected)}", subject=target.path)
        try:
            policy = snapshot.load_policy()  # the state itself must load before anyone decides with it
        except SnapshotFormatError as exc:
            raise MetadataFormatError(str(exc), subject=target.path) from exc
        return snapshot, policy

    def _accept(self, loaded: LoadedSnapshot, data: bytes) -> None:
        """Hold it, cache it (blob and a pointer), forget older cached blobs."""
        name = _cache_name(loaded.target)
        _write_atomic(self._targets_dir / name, data)
        pointer = {"path": loaded.target.path, "sha256": loaded.target.sha256, "version": loaded.version, "channel": self.channel}
        _write_atomic(self._dir / "current.json", json.dumps(pointer).encode("utf-8"))
        for old in self._targets_dir.iterdir():
            if old.name != name:
                with contextlib.suppress(OSError):
                    old.unlink()
        previous = self._current
        self._current = loaded
        if previous is not None:
            with contextlib.suppress(KeyError):
                self.metrics.version.remove(self.domain, previous.version)
        self.metrics.version.labels(self.domain, loaded.version).set(1)
        self.metrics.created.labels(self.domain).set(loaded.snapshot.created_at / 1000)
        self.metrics.refreshes.labels(self.domain, "updated").inc()
        log.info("%s: loaded %s %s", self.prefix, self.channel, loaded.version)

    # --- the local cache -------------------------------------------------------------------------

    def load_cached(self) -> LoadedSnapshot | None:
        """The last good snapshot from ``cache_dir``, re-verified offline; None if there is none.

        The cached metadata is checked again (signatures against the cached root chain,
        expiry), so a service can start while the repository is down but never on expired or
        altered data.
        """
        with self._lock, self._failures_counted():
            try:
                pointer = json.loads((self._dir / "current.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            targets = {e.path: e for e in self._trusted_targets(verify=True)}
            target = targets.get(pointer.get("path"))
            if target is None or target.sha256 != pointer.get("sha256"):
                return None
            try:
                data = (self._targets_dir / _cache_name(target)).read_bytes()
            except OSError:
                return None
            if hashlib.sha256(data).hexdigest() != target.sha256:
                raise HashMismatchError(f"cached {target.path} does not match its targets entry", subject=target.path)
            loaded = self._vouched(*self._load(target, data), target)
            if loaded.expired():
                raise ExpiredMetadataError(f"cached metadata for {self.prefix} expired at {loaded.expires}", subject=self.prefix)
            self._current = loaded
            self.metrics.version.labels(self.domain, loaded.version).set(1)
            return loaded

    def _trusted_targets(self, *, verify: bool = False) -> list[TargetEntry]:
        """Targets entries from the metadata ngclient persisted (only ever after verifying it)."""
        data = self._read_cached("targets")
        try:
            metadata = Metadata[Targets].from_bytes(data)
            if verify:
                self._verify_cached(metadata)
            return [TargetEntry.from_target(t) for t in metadata.signed.targets.values()]
        except (DeserializationError, ValueError, KeyError, tuf_exceptions.RepositoryError) as exc:
            raise _translate(exc, f"{self.prefix} cached targets") from exc

    def _verify_cached(self, targets: Metadata[Targets]) -> None:
        """Offline re-check of the cached chain: root versions from the trusted root on, then
        timestamp -> snapshot -> targets signatures and the hashes linking them."""
        root = Metadata[Root].from_bytes(self._root)
        while True:
            try:
                data = (self._metadata_dir / "root_history" / f"{root.signed.version + 1}.root.json").read_bytes()
            except OSError:
                break
            new = Metadata[Root].from_bytes(data)
            root.signed.verify_delegate(Root.type, new.signed_bytes, new.signatures)
            new.signed.verify_delegate(Root.type, new.signed_bytes, new.signatures)
            root = new
        timestamp_bytes, snapshot_bytes = self._read_cached("timestamp"), self._read_cached("snapshot")
        timestamp = Metadata[Timestamp].from_bytes(timestamp_bytes)
        snapshot = Metadata[SnapshotRole].from_bytes(snapshot_bytes)
        for role, metadata in (("timestamp", timestamp), ("snapshot", snapshot), ("targets", targets)):
            root.signed.verify_delegate(role, metadata.signed_bytes, metadata.signatures)
        timestamp.signed.snapshot_meta.verify_length_and_hashes(snapshot_bytes)
        snapshot.signed.meta["targets.json"].verify_length_and_hashes(self._read_cached("targets"))

    def _read_cached(self, role: str) -> bytes:
        try:
            return (self._metadata_dir / f"{role}.json").read_bytes()
        except OSError as exc:
            raise SnapshotNotFound(f"no verified {role} metadata cached for {self.prefix}", subject=self.prefix) from exc

    def _vouched(self, snapshot: Snapshot, policy: Policy, target: TargetEntry) -> LoadedSnapshot:
        """The snapshot with the expiry of the metadata that vouches for it now."""
        expiries = []
        for role, cls in (("timestamp", Timestamp), ("snapshot", SnapshotRole), ("targets", Targets)):
            with contextlib.suppress(SnapshotNotFound, DeserializationError, ValueError):
                expiries.append(Metadata[cls].from_bytes(self._read_cached(role)).signed.expires)
        expires = min(expiries) if expiries else datetime.now(timezone.utc)
        return LoadedSnapshot(snapshot, policy, target, self.channel, expires, datetime.now(timezone.utc))

    def _held_version(self) -> SemVer | None:
        if self._current is not None:
            return self._current.snapshot.semver
        with contextlib.suppress(OSError, ValueError, KeyError):
            pointer = json.loads((self._dir / "current.json").read_text(encoding="utf-8"))
            if pointer.get("channel") == self.channel:
                return SemVer.parse(pointer["version"])
        return None

    @contextlib.contextmanager
    def _failures_counted(self) -> Iterator[None]:
        try:
            yield
        except PullError as exc:
            self.last_error = exc
            self.metrics.failures.labels(self.domain, exc.reason).inc()
            self.metrics.refreshes.labels(self.domain, "failed").inc()
            held = self._current.version if self._current else "nothing"
            log.warning("%s: refresh refused (%s): %s; keeping %s", self.prefix, exc.reason, exc, held)
            raise
        else:
            self.last_error = None


def _read_root(trusted_root: bytes | str | os.PathLike[str]) -> bytes:
    if isinstance(trusted_root, (bytes, bytearray)):
        data = bytes(trusted_root)
    else:
        try:
            data = Path(trusted_root).read_bytes()
        except OSError as exc:
            raise KeyFileError(f"cannot read the trusted root {trusted_root}: {exc}") from exc
    try:
        metadata = Metadata.from_bytes(data)
    except (DeserializationError, ValueError) as exc:
        raise KeyFileError(f"the trusted root is not TUF metadata: {exc}") from None
    if not isinstance(metadata.signed, Root):
        raise KeyFileError(f"the trusted root is {metadata.signed.type} metadata, not root")
    return data


def _cache_name(target: TargetEntry) -> str:
    return f"{target.sha256}.{urllib.parse.quote(target.path, '')}"


def _write_atomic(path: Path, data: bytes) -> None:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise

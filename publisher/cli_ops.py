"""Library calls behind ``banditstream keys`` and ``banditstream snapshot ...``.

The CLI is a thin layer over these: each takes plain arguments, returns plain data (dicts,
lists of dicts, small dataclasses) and raises a typed
:class:`~publisher.errors.PublisherError` for expected failures. Filters are the same
everywhere: ``tenant``, ``workspace`` (None: any) and ``domains`` (None: all).

=====================  =====================================================================
``generate_keys``      Ed25519 keys for every TUF role and the signed ``root.json``
``load_keys``          a publisher's signers and the trusted root from a key directory
``list_snapshots``     the kept versions of every repository in a store
``verify_snapshots``   pull every channel like a client would, and check every kept blob
``dump_snapshot``      one verified snapshot as data, optionally written out as a backup
``restore_snapshots``  re-publish backed-up snapshots (unknown domains and other majors skipped)
``promote``            move a version to a channel (default: canary's head to stable)
``rollback``           publish a new version carrying an older version's state
``reset_model``        reset a domain's model: markers for the learners, a version of the priors
=====================  =====================================================================
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from learner.domain import DomainSettings
from publisher.errors import KeyFileError, PublisherError, PullError, RepositoryError, SnapshotFormatError
from publisher.publish import Publisher, PublisherConfig
from publisher.pull import SnapshotClient
from publisher.repository import CHANNELS, Repository, create_root, target_name
from publisher.signing import ROLES, KeyRing
from publisher.snapshot import STATE_MAJOR, Snapshot
from publisher.stores import SnapshotStore, open_store
from streams.reset import send_reset
from streams.serde import AvroSerde
from streams.settings import KafkaSettings

__all__ = [
    "KeysReport",
    "RestoreReport",
    "discover",
    "dump_snapshot",
    "generate_keys",
    "list_snapshots",
    "load_keys",
    "open_store",
    "promote",
    "reset_model",
    "restore_snapshots",
    "rollback",
    "verify_snapshots",
]

#: Name of the signed root metadata in a key directory (public: give it to every client).
ROOT_FILE = "root.json"
_PUBLISHER_ROLES = ("targets", "snapshot", "timestamp")


# --- keys ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeysReport:
    """Where ``generate_keys`` wrote what."""

    directory: Path
    key_files: tuple[Path, ...]
    root_file: Path
    keyids: Mapping[str, tuple[str, ...]]
    thresholds: Mapping[str, int]
    root_expires: datetime


def generate_keys(
    directory: str | os.PathLike[str],
    *,
    keys_per_role: int | Mapping[str, int] = 1,
    thresholds: Mapping[str, int] | None = None,
    root_expiry_days: int = 365,
    overwrite: bool = False,
) -> KeysReport:
    """Generate Ed25519 keys for root, timestamp, snapshot and targets and sign ``root.json``.

    Key files are private (mode 0600): keep the root key offline; the publisher needs the
    other three. ``root.json`` is public: every client is given it as its trusted root.
    """
    directory = Path(directory)
    root_path = directory / ROOT_FILE
    if root_path.exists() and not overwrite:
        raise KeyFileError(f"{root_path} exists; refusing to replace a deployment's root of trust", subject=str(root_path))
    keys = KeyRing.generate(keys_per_role)
    thresholds = {role: int((thresholds or {}).get(role, 1)) for role in ROLES}
    expires = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=root_expiry_days)
    root = create_root(keys, thresholds=thresholds, expires=expires)
    files = keys.save(directory, overwrite=overwrite)
    directory.mkdir(parents=True, exist_ok=True)
    root_path.write_bytes(root)
    return KeysReport(
        directory, tuple(files), root_path, {r: tuple(k.keyid for k in keys.public_keys(r)) for r in ROLES}, thresholds, expires
    )


def load_keys(directory: str | os.PathLike[str]) -> tuple[KeyRing, bytes]:
    """The publisher's signers (targets, snapshot, timestamp) and the trusted root bytes."""
    directory = Path(directory)
    keys = KeyRing.load(directory, roles=_PUBLISHER_ROLES)
    missing = [r for r in _PUBLISHER_ROLES if r not in keys.roles()]
    if missing:
        raise KeyFileError(f"{directory} lacks private keys for {', '.join(missing)}", subject=str(directory))
    try:
        root = (directory / ROOT_FILE).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"{directory / ROOT_FILE} cannot be read: {exc}", subject=str(directory)) from exc
    return keys, root


# --- discovery -------------------------------------------------------------------------------------


def discover(
    store: SnapshotStore,
    *,
    tenant: str | None = None,
    workspace: str | None = None,
    domains: Sequence[str] | None = None,
) -> list[tuple[str, str, str]]:
    """(tenant, workspace, domain) of every repository in the store that passes the filters."""
    found = set()
    for info in store.list(f"{tenant}/" if tenant else ""):
        parts = info.key.split("/")
        if len(parts) == 5 and parts[3] == "metadata" and parts[4] == "timestamp.json":
            t, w, d = parts[:3]
            if (workspace is None or w == workspace) and (domains is None or d in domains):
                found.add((t, w, d))
    return sorted(found)


def _reader(store: SnapshotStore, tenant: str, workspace: str, domain: str, trusted_root: bytes | None) -> Repository:
    """A read-only Repository (no keys); without a trusted root the repository's own is used."""
    root = trusted_root if trusted_root is not None else store.get(f"{tenant}/{workspace}/{domain}/metadata/1.root.json")
    return Repository(store, keys=KeyRing({}), root=root, tenant=tenant, workspace=workspace, domain=domain)


def _root_bytes(trusted_root: bytes | str | os.PathLike[str] | None) -> bytes | None:
    if trusted_root is None or isinstance(trusted_root, bytes):
        return trusted_root
    try:
        return Path(trusted_root).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read the trusted root {trusted_root}: {exc}") from exc


# --- list, verify, dump ----------------------------------------------------------------------------


def list_snapshots(
    store: SnapshotStore,
    *,
    tenant: str | None = None,
    workspace: str | None = None,
    domains: Sequence[str] | None = None,
    trusted_root: bytes | str | os.PathLike[str] | None = None,
    verbose: bool = False,
) -> list[dict[str, Any]]:
    """One row per kept version, newest last per domain.

    Rows: tenant, workspace, domain, version, channels, samples, arms, dimension, policy,
    created_at, git_commit, derived_from, length (and ``acting``, a portfolio's member); with ``verbose`` also sha256, target,
    source_offsets, config/feature/reward hashes and the metadata versions.
    """
    root = _root_bytes(trusted_root)
    rows = []
    for t, w, d in discover(store, tenant=tenant, workspace=workspace, domains=domains):
        head = _reader(store, t, w, d, root).head()
        for entry in head.entries():
            c = entry.custom
            row = {
                "tenant": t, "workspace": w, "domain": d, "version": str(entry.version), "channels": list(entry.channels),
                "samples": c.get("samples"), "arms": c.get("arms"), "dimension": c.get("dimension"), "policy": c.get("policy"),
                "created_at": c.get("created_at"), "git_commit": c.get("git_commit"), "derived_from": c.get("derived_from"),
                "length": entry.length,
            }  # fmt: skip
            if "acting" in c:  # a portfolio: the member that acts in this version
                row["acting"] = c["acting"]
            if verbose:
                row.update(
                    target=entry.path, sha256=entry.sha256, source_offsets=c.get("source_offsets"), config_hash=c.get("config_hash"),
                    feature_hash=c.get("feature_hash"), reward_hash=c.get("reward_hash"), drift_flag=c.get("drift_flag"),
                    targets_version=head.targets.signed.version, timestamp_expires=head.timestamp.signed.expires.isoformat(),
                )  # fmt: skip
            rows.append(row)
    return rows


def verify_snapshots(
    store: SnapshotStore,
    trusted_root: bytes | str | os.PathLike[str],
    *,
    tenant: str | None = None,
    workspace: str | None = None,
    domains: Sequence[str] | None = None,
    channels: Iterable[str] = CHANNELS,
    verbose: bool = False,
) -> list[dict[str, Any]]:
    """Verify each repository as a fresh client would (per channel), then every kept blob.

    Rows: tenant, workspace, domain, check (``channel:<name>`` or ``version:<v>``), ok,
    version, kind (the error's reason when not ok), message. Nothing raises for a failed
    check: the rows say what failed; the caller decides the exit code.
    """
    root = _root_bytes(trusted_root)
    rows: list[dict[str, Any]] = []
    for t, w, d in discover(store, tenant=tenant, workspace=workspace, domains=domains):
        base = {"tenant": t, "workspace": w, "domain": d}
        with tempfile.TemporaryDirectory(prefix="banditstream-verify-") as cache:
            for channel in channels:
                client = SnapshotClient(store, cache, root, tenant=t, workspace=w, domain=d, channel=channel)
                try:
                    loaded = client.refresh()
                    rows.append({**base, "check": f"channel:{channel}", "ok": True, "version": loaded.version, "kind": "", "message": "verified"})
                except PullError as exc:
                    rows.append({**base, "check": f"channel:{channel}", "ok": exc.reason == "not_found", "version": None,
                                 "kind": exc.reason, "message": str(exc)})  # fmt: skip
        try:
            repo = _reader(store, t, w, d, root)
            entries = repo.head().entries()
        except PublisherError as exc:
            rows.append({**base, "check": "metadata", "ok": False, "version": None, "kind": exc.reason, "message": str(exc)})
            continue
        for entry in entries:
            try:
                Snapshot.from_bytes(repo.fetch(entry), expect_major=None)
                row = {**base, "check": f"version:{entry.version}", "ok": True, "version": str(entry.version), "kind": "", "message": "blob matches"}
            except PublisherError as exc:
                row = {**base, "check": f"version:{entry.version}", "ok": False, "version": str(entry.version), "kind": exc.reason, "message": str(exc)}
            if verbose or not row["ok"]:
                rows.append(row)
    return rows


def load_snapshot(
    store: SnapshotStore,
    trusted_root: bytes | str | os.PathLike[str],
    *,
    domain: str,
    tenant: str = "default",
    workspace: str = "main",
    channel: str = "stable",
    version: str | None = None,
) -> tuple[Snapshot, Any]:
    """One snapshot and its signed target entry, verified as a client verifies them: the head
    of ``channel``, or a kept ``version``."""
    root = _root_bytes(trusted_root)
    with tempfile.TemporaryDirectory(prefix="banditstream-load-") as cache:
        client = SnapshotClient(store, cache, root, tenant=tenant, workspace=workspace, domain=domain, channel=channel)
        loaded = client.refresh()
        snapshot, entry = loaded.snapshot, loaded.target
        if version is not None and version != loaded.version:
            repo = _reader(store, tenant, workspace, domain, root)
            entry = repo.entry(version)
            snapshot = Snapshot.from_bytes(repo.fetch(entry), expect_major=None)
    return snapshot, entry


def dump_snapshot(
    store: SnapshotStore,
    trusted_root: bytes | str | os.PathLike[str],
    *,
    domain: str,
    tenant: str = "default",
    workspace: str = "main",
    channel: str = "stable",
    version: str | None = None,
    out: str | os.PathLike[str] | None = None,
    verbose: bool = False,
) -> dict[str, Any]:
    """One snapshot, verified like a client verifies it, as data (arrays left out).

    Without ``version`` it is the head of ``channel``. With ``out`` (a directory) the verified
    blob is written to ``out/<tenant>/<workspace>/<domain>/snapshot-<version>.avro.zst`` with
    the summary beside it as ``.json``: a backup ``restore_snapshots`` reads back.
    """
    root = _root_bytes(trusted_root)
    snapshot, entry = load_snapshot(store, root, domain=domain, tenant=tenant, workspace=workspace, channel=channel,
                                    version=version)
    summary = snapshot.summary(verbose=verbose)
    summary["channels"] = list(entry.channels)
    summary["sha256"] = entry.sha256
    summary["length"] = entry.length
    if out is not None:
        folder = Path(out) / tenant / workspace / domain
        folder.mkdir(parents=True, exist_ok=True)
        blob_path = folder / target_name(snapshot.version)
        blob_path.write_bytes(_reader(store, tenant, workspace, domain, root).fetch(entry))  # checked against signed targets
        blob_path.with_suffix(".json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
        summary["written"] = str(blob_path)
    return summary


# --- restore, promote, rollback --------------------------------------------------------------------


@dataclass
class RestoreReport:
    """What ``restore_snapshots`` did: one row per restored snapshot, one message per file."""

    restored: list[dict[str, Any]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


def _publisher(
    store: SnapshotStore, keys: KeyRing, root: bytes, domains_config: Mapping[str, DomainSettings], tenant: str, workspace: str,
    config: PublisherConfig | None,
) -> Publisher:  # fmt: skip
    return Publisher(store, keys, root, domains=domains_config, tenant=tenant, workspace=workspace, config=config)


def restore_snapshots(
    source: str | os.PathLike[str],
    store: SnapshotStore,
    keys: KeyRing,
    root: bytes,
    *,
    domains_config: Mapping[str, DomainSettings],
    tenant: str = "default",
    workspace: str = "main",
    domains: Sequence[str] | None = None,
    channels: Iterable[str] | None = None,
    config: PublisherConfig | None = None,
    verbose: bool = False,
) -> RestoreReport:
    """Re-publish the snapshots backed up under ``source`` (``*.avro.zst``, e.g. from
    ``dump_snapshot(out=...)``) as each domain's next version in this tenant/workspace.

    A snapshot of a domain that is not configured is ignored, and one of another state major
    skipped, each with a message; of several backups of one domain the newest is restored.
    """
    report = RestoreReport()
    newest: dict[str, tuple[Snapshot, Path]] = {}
    for path in sorted(Path(source).rglob("*.avro.zst")):
        try:
            snapshot = Snapshot.from_bytes(path.read_bytes(), expect_major=None)
        except (OSError, SnapshotFormatError) as exc:
            report.messages.append(f"skipped {path}: not a readable snapshot ({exc})")
            continue
        name = f"{snapshot.domain} {snapshot.version}"
        if domains is not None and snapshot.domain not in domains:
            if verbose:
                report.messages.append(f"skipped {path}: {snapshot.domain} is not among the selected domains")
            continue
        if snapshot.domain not in domains_config:
            report.messages.append(f"ignored {path}: unknown domain {snapshot.domain!r} (not configured)")
            continue
        if snapshot.state_major != STATE_MAJOR:
            report.messages.append(
                f"skipped {path}: {name} has state major {snapshot.state_major}; this code reads {STATE_MAJOR}"
            )
            continue
        held = newest.get(snapshot.domain)
        if held is not None and held[0].semver >= snapshot.semver:
            report.messages.append(f"skipped {path}: a newer backup of {snapshot.domain} ({held[0].version}) is restored")
            continue
        if held is not None:
            report.messages.append(f"skipped {held[1]}: a newer backup of {snapshot.domain} ({snapshot.version}) is restored")
        newest[snapshot.domain] = (snapshot, path)
    publisher = _publisher(store, keys, root, domains_config, tenant, workspace, config)
    for domain in sorted(newest):
        snapshot, path = newest[domain]
        result = publisher.restore(snapshot, channels=channels)
        report.restored.append({"domain": domain, "from": str(path), "source_version": snapshot.version, "version": result.version,
                                "channels": list(result.entry.channels)})  # fmt: skip
        report.messages.append(f"restored {domain} {snapshot.version} from {path} as {result.version}")
    return report


def promote(
    store: SnapshotStore,
    keys: KeyRing,
    root: bytes,
    *,
    domains_config: Mapping[str, DomainSettings],
    tenant: str = "default",
    workspace: str = "main",
    domains: Sequence[str] | None = None,
    version: str | None = None,
    channel: str = "stable",
    source: str = "canary",
) -> list[dict[str, Any]]:
    """Make ``version`` (default: each domain's ``source`` head) the head of ``channel``."""
    publisher = _publisher(store, keys, root, domains_config, tenant, workspace, None)
    rows = []
    for t, w, d in discover(store, tenant=tenant, workspace=workspace, domains=_selected(domains, domains_config)):
        commit = publisher.promote(d, version, channel, source=source)
        head = publisher.repository(d).channel_head(channel)
        rows.append({"domain": d, "channel": channel, "version": str(head.version) if head else None, "changed": commit is not None,
                     "message": f"{d}: {channel} is {'now' if commit else 'already'} at {head.version if head else '-'}"})  # fmt: skip
    return rows


def rollback(
    store: SnapshotStore,
    keys: KeyRing,
    root: bytes,
    *,
    domains_config: Mapping[str, DomainSettings],
    tenant: str = "default",
    workspace: str = "main",
    domains: Sequence[str] | None = None,
    to_version: str | None = None,
    channels: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """For each domain, publish a new version carrying ``to_version``'s state (default: the
    version before the newest). Clients move forward to it; nothing moves back."""
    publisher = _publisher(store, keys, root, domains_config, tenant, workspace, None)
    rows = []
    for t, w, d in discover(store, tenant=tenant, workspace=workspace, domains=_selected(domains, domains_config)):
        result = publisher.rollback(d, to_version, channels=channels)
        rows.append({"domain": d, "version": result.version, "state_of": result.snapshot.derived_from, "channels": list(result.entry.channels),
                     "message": f"{d}: published {result.version} with the state of {result.snapshot.derived_from}"})  # fmt: skip
    return rows


def reset_model(publisher: Publisher, domain: str, kafka: KafkaSettings, updates_topic: str, serde: AvroSerde) -> dict[str, Any]:
    """Reset ``domain``'s model to its priors, everywhere: a reset marker on every partition of
    the updates topic (each learner returns the domain's models to their priors there, and
    learns on from the updates after it), then a new version holding the priors (to the canary
    only on a gated domain). Markers first: if they cannot all be written nothing is published
    (:class:`~streams.reset.ResetError`), and sending again is harmless.

    Until every learner has read its marker, the publisher worker may still publish a version
    with the old learning of the partitions that have not; it is replaced as soon as they have.
    """
    landed = send_reset(kafka, updates_topic, serde, publisher.tenant, publisher.workspace, domain)
    result = publisher.reset(domain)
    return {"domain": domain, "version": result.version, "channels": list(result.entry.channels), "markers": landed,
            "message": f"{domain}: reset to its priors: {len(landed)} markers on {updates_topic}, published {result.version} "
                       f"to {', '.join(result.entry.channels)}"}  # fmt: skip


def _selected(domains: Sequence[str] | None, domains_config: Mapping[str, DomainSettings]) -> list[str]:
    chosen = list(domains) if domains is not None else sorted(domains_config)
    unknown = [d for d in chosen if d not in domains_config]
    if unknown:
        raise RepositoryError(f"unknown domain(s) {', '.join(unknown)}; configured: {', '.join(sorted(domains_config)) or 'none'}")
    return chosen

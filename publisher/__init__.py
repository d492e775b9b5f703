"""Distribution: signed, versioned policy snapshots and the client that verifies them.

- :mod:`publisher.snapshot`: the format (Avro + zstd), :class:`Snapshot`, :data:`STATE_MAJOR`;
- :mod:`publisher.guards`: what a snapshot must pass before it is published;
- :mod:`publisher.signing`: Ed25519 keys through pynacl as securesystemslib signers;
- :mod:`publisher.repository`: TUF metadata (root, targets, snapshot, timestamp), channels,
  retention and the audit log, per tenant/workspace/domain;
- :mod:`publisher.stores`: where repositories live (directory, S3, read-only HTTP);
- :mod:`publisher.publish`: the publish workflow, rollback, restore, promote;
- :mod:`publisher.pull`: the verifying pull client the SDK uses;
- :mod:`publisher.cli_ops`: what ``banditstream keys`` and ``banditstream snapshot`` call;
- :mod:`publisher.worker`: the worker that reads the posterior topic (the only Kafka reader).

Importing this package imports no Kafka client: the SDK's pull path stays light.
"""

from __future__ import annotations

from publisher.errors import (
    ExpiredMetadataError,
    GuardFailed,
    HashMismatchError,
    LengthMismatchError,
    MajorVersionError,
    PublisherError,
    PullError,
    RepositoryUnavailable,
    RollbackError,
    SignatureError,
    SnapshotNotFound,
    VerificationError,
    VersionConflict,
)
from publisher.pull import ClientConfig, ClientMetrics, LoadedSnapshot, SnapshotClient
from publisher.snapshot import STATE_MAJOR, SemVer, Snapshot
from publisher.stores import DirectoryStore, HttpStore, S3Store, SnapshotStore, open_store

__all__ = [
    "STATE_MAJOR",
    "ClientConfig",
    "ClientMetrics",
    "DirectoryStore",
    "ExpiredMetadataError",
    "GuardFailed",
    "HashMismatchError",
    "HttpStore",
    "LengthMismatchError",
    "LoadedSnapshot",
    "MajorVersionError",
    "PublisherError",
    "PullError",
    "RepositoryUnavailable",
    "RollbackError",
    "S3Store",
    "SemVer",
    "SignatureError",
    "Snapshot",
    "SnapshotClient",
    "SnapshotNotFound",
    "SnapshotStore",
    "VerificationError",
    "VersionConflict",
    "open_store",
]

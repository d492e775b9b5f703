"""Typed errors of the publisher and the pull client: callers catch by meaning.

::

    PublisherError                       (a BanditstreamError: the CLI prints it on one line)
    ├── StoreError                       the object store
    │   ├── ObjectNotFound               no object under that key
    │   ├── AlreadyExists                a write-once key is taken (IfNoneMatch="*" lost)
    │   ├── PreconditionFailed           a compare-and-swap lost (IfMatch)
    │   └── StoreUnavailable             the store did not answer
    ├── KeyFileError                     a signing key or root file is missing or malformed
    ├── SnapshotFormatError              bytes that are not a snapshot this code reads
    ├── GuardFailed                      a publish aborted before anything was written
    │   ├── NonFiniteState               NaN or inf in the state or its statistics
    │   ├── DriftGuardFailed             an arm's statistics left their history's band
    │   └── TooFewSamples                fewer samples than the configured minimum
    ├── RepositoryError                  the publisher's own repository operations
    │   ├── VersionConflict              another publisher claimed this version first
    │   ├── VersionNotFound              no kept snapshot has that version
    │   └── ChannelError                 unknown channel, or a promotion that moves backwards
    └── PullError                        what the pull client refuses or cannot do
        ├── RepositoryUnavailable        metadata or target could not be fetched
        ├── SnapshotNotFound             the channel has no snapshot (yet)
        └── VerificationError            the repository's answer is not trustworthy
            ├── SignatureError           too few valid signatures by trusted keys
            ├── ExpiredMetadataError     expired metadata (freeze attack)
            ├── RollbackError            a version older than one already trusted
            ├── HashMismatchError        content does not hash to what was signed
            ├── LengthMismatchError      content is not as long as what was signed
            ├── MajorVersionError        a state major this code does not understand
            └── MetadataFormatError      metadata or snapshot that does not parse

Every error has a ``reason``: a short slug for Prometheus labels
(``banditstream_snapshot_verification_failures_total{kind="hash_mismatch"}``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from streams.errors import BanditstreamError

__all__ = [
    "AlreadyExists",
    "ChannelError",
    "DriftGuardFailed",
    "ExpiredMetadataError",
    "GuardFailed",
    "HashMismatchError",
    "KeyFileError",
    "LengthMismatchError",
    "MajorVersionError",
    "MetadataFormatError",
    "NonFiniteState",
    "ObjectNotFound",
    "PreconditionFailed",
    "PublisherError",
    "PullError",
    "RepositoryError",
    "RepositoryUnavailable",
    "RollbackError",
    "SignatureError",
    "SnapshotFormatError",
    "SnapshotNotFound",
    "StoreError",
    "StoreUnavailable",
    "TooFewSamples",
    "VerificationError",
    "VersionConflict",
    "VersionNotFound",
]


class PublisherError(BanditstreamError):
    """Base of every error the publisher package raises on purpose; ``str()`` is the message."""

    reason: ClassVar[str] = "publisher"

    def __init__(self, message: str, *, subject: str = "") -> None:
        Exception.__init__(self, message)
        # BanditstreamError's fields: what the error is about, and the explanation.
        self.field = subject
        self.value = None
        self.explanation = message

    @property
    def kind(self) -> str:
        """The reason slug under the name metrics use for it (``verification_failures{kind}``)."""
        return self.reason

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across process pools
        return (type(self), (self.explanation,), dict(self.__dict__))


# --- stores ----------------------------------------------------------------------------------------


class StoreError(PublisherError):
    reason: ClassVar[str] = "store"


class ObjectNotFound(StoreError):
    reason: ClassVar[str] = "not_found"


class AlreadyExists(StoreError):
    reason: ClassVar[str] = "already_exists"


class PreconditionFailed(StoreError):
    reason: ClassVar[str] = "precondition_failed"


class StoreUnavailable(StoreError):
    reason: ClassVar[str] = "unavailable"


# --- keys and format -------------------------------------------------------------------------------


class KeyFileError(PublisherError):
    reason: ClassVar[str] = "key_file"


class SnapshotFormatError(PublisherError):
    reason: ClassVar[str] = "snapshot_format"


# --- guards ----------------------------------------------------------------------------------------


class GuardFailed(PublisherError):
    """A guard refused the snapshot; nothing was uploaded."""

    reason: ClassVar[str] = "guard"


class NonFiniteState(GuardFailed):
    reason: ClassVar[str] = "non_finite"


class DriftGuardFailed(GuardFailed):
    reason: ClassVar[str] = "drift"

    def __init__(self, message: str, *, subject: str = "", features: tuple[str, ...] = ()) -> None:
        super().__init__(message, subject=subject)
        self.features = features  # the context features that drifted


class TooFewSamples(GuardFailed):
    reason: ClassVar[str] = "min_samples"


# --- the publisher's repository --------------------------------------------------------------------


class RepositoryError(PublisherError):
    reason: ClassVar[str] = "repository"


class VersionConflict(RepositoryError):
    """Another publisher claimed the version first; re-read the head and try again."""

    reason: ClassVar[str] = "conflict"


class VersionNotFound(RepositoryError):
    reason: ClassVar[str] = "version_not_found"


class ChannelError(RepositoryError):
    reason: ClassVar[str] = "channel"


# --- the pull client -------------------------------------------------------------------------------


class PullError(PublisherError):
    reason: ClassVar[str] = "pull"


class RepositoryUnavailable(PullError):
    reason: ClassVar[str] = "unavailable"


class SnapshotNotFound(PullError):
    reason: ClassVar[str] = "not_found"


class VerificationError(PullError):
    reason: ClassVar[str] = "verification"


class SignatureError(VerificationError):
    reason: ClassVar[str] = "signature"


class ExpiredMetadataError(VerificationError):
    reason: ClassVar[str] = "expired"


class RollbackError(VerificationError):
    reason: ClassVar[str] = "rollback"


class HashMismatchError(VerificationError):
    reason: ClassVar[str] = "hash_mismatch"


class LengthMismatchError(VerificationError):
    reason: ClassVar[str] = "length_mismatch"


class MajorVersionError(VerificationError):
    reason: ClassVar[str] = "major_version"


class MetadataFormatError(VerificationError):
    reason: ClassVar[str] = "format"

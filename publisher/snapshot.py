"""The snapshot format: what a service needs to decide, built from policy state, as Avro + zstd.

A :class:`Snapshot` holds one domain's scoring view (posterior means and covariance factors,
so deciding never inverts anything), its arms with priors, counts and drift statistics, the
feature and reward configuration with their hashes, frozen normaliser statistics, a semantic
version and provenance (git commit, creation time, source offsets).

On the wire it is one ``PolicySnapshot`` record (``schemas/snapshot.avsc``) in the Avro
single-object encoding (``0xC3 0x01``, the schema's 8-byte CRC-64-AVRO fingerprint, the
body), compressed as one zstd frame. The fingerprint lets a reader resolve a snapshot written
with an older schema from ``schemas/history``; ``state_major`` tells whether this code can
read the state at all (:data:`STATE_MAJOR`).

    >>> from learner.domain import DomainSettings
    >>> settings = DomainSettings(policy="lin_ts", features={"dimension": 4})
    >>> policy = settings.make_policy(seed=1)
    >>> _ = policy.update_batch(np.eye(4), ["a", "b", "a", "b"], [1.0, 0.0, 1.0, 0.5])
    >>> snap = Snapshot.build(policy, settings, domain="route", version="1.0.0", created_at=0)
    >>> again = Snapshot.from_bytes(snap.to_bytes())
    >>> again.version, again.samples, [a.arm for a in again.arms]
    ('1.0.0', 4, ['a', 'b'])
    >>> again.load_policy().arm_ids()
    ['a', 'b']
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import fastavro
import numpy as np
import zstandard

import schemas
from learner.domain import DomainSettings
from learner.features import FeatureConfig, Normalizer
from learner.policies import Drift, Policy, PolicyError, Portfolio
from learner.policies.portfolio import describe_state
from learner.reward import RewardConfig
from publisher.errors import MajorVersionError, NonFiniteState, SnapshotFormatError

__all__ = [
    "STATE_MAJOR",
    "ArmSummary",
    "SemVer",
    "Snapshot",
    "SourceOffset",
    "git_commit",
]

#: Major version of the snapshot state layout this code reads and writes.
STATE_MAJOR = 1

_SINGLE_OBJECT_MAGIC = b"\xc3\x01"
#: zstd level: 1 already halves a d=64 scoring view (L is triangular: half zeros), 3x faster than 3.
_ZSTD_LEVEL = 1
#: Refuse to decompress beyond this: a hostile frame cannot exhaust memory.
DEFAULT_MAX_DECOMPRESSED = 1 << 30


class SemVer(NamedTuple):
    """MAJOR.MINOR.PATCH: patch = more data, minor = hyper-parameters, major = state layout."""

    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> SemVer:
        parts = str(text).split(".")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"a version is MAJOR.MINOR.PATCH, got {text!r}")
        return cls(*(int(p) for p in parts))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    def bump_patch(self) -> SemVer:
        return SemVer(self.major, self.minor, self.patch + 1)

    def bump_minor(self) -> SemVer:
        return SemVer(self.major, self.minor + 1, 0)


class ArmSummary(NamedTuple):
    """One arm as the snapshot lists it (beside its arrays inside the policy state)."""

    arm: str
    prior_mean: float
    prior_strength: float
    count: int
    cov_trace: float
    spectral_norm: float
    drifted: bool = False


class SourceOffset(NamedTuple):
    """Per updates-topic partition, the next offset the state has not consumed."""

    topic: str
    partition: int
    offset: int


@functools.cache
def git_commit(path: str | None = None) -> str:
    """``git rev-parse HEAD`` of the code's checkout (or of ``path``), or ``"unknown"``."""
    where = path or str(Path(__file__).resolve().parent)
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out if len(out) == 40 else "unknown"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One domain's policy as services decide with it; see the module docstring."""

    tenant: str
    workspace: str
    domain: str
    version: str
    policy: str
    params: Mapping[str, Any]
    dimension: int
    policy_state: bytes
    arms: tuple[ArmSummary, ...]
    feature_config: Mapping[str, Any]
    feature_hash: str
    reward_config: Mapping[str, Any]
    reward_hash: str
    samples: int
    created_at: int
    normalizer: Mapping[str, Any] | None = None
    drift_flag: bool = False
    drift_reason: str = ""
    git_commit: str = "unknown"
    source_offsets: tuple[SourceOffset, ...] = ()
    derived_from: str | None = None
    state_major: int = STATE_MAJOR

    # --- building --------------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        policy: Policy,
        settings: DomainSettings,
        *,
        domain: str,
        version: str = f"{STATE_MAJOR}.0.0",
        tenant: str = "default",
        workspace: str = "main",
        normalizer: Normalizer | None = None,
        drift: Mapping[str, Drift] | None = None,
        source_offsets: Iterable[SourceOffset | tuple[str, int, int]] = (),
        commit: str | None = None,
        created_at: int | None = None,
    ) -> Snapshot:
        """The snapshot of ``policy`` (full or scoring view) learned under ``settings``.

        ``drift`` gives each arm's statistics when the caller has them (the learner ships them
        in every PosteriorShard); otherwise they are computed from the policy. Non-finite state
        raises :class:`~publisher.errors.NonFiniteState` (a guard: nothing is published).
        """
        if policy.name != settings.policy:
            raise SnapshotFormatError(f"policy is {policy.name!r} but the domain is configured for {settings.policy!r}")
        if policy.dim != settings.features.dimension:
            raise SnapshotFormatError(
                f"policy has dim {policy.dim}, the domain's features have dimension {settings.features.dimension}"
            )
        try:
            view = policy if policy.scoring_only else policy.scoring_view()
            state = view.to_bytes()
        except PolicyError as exc:  # NaN/inf in the statistics, or a precision that lost definiteness
            raise NonFiniteState(f"{domain}: the policy state cannot be scored: {exc}", subject=domain) from exc
        arms = []
        for arm in policy.arm_ids():
            stats = drift.get(arm) if drift is not None else None
            if stats is None:
                try:
                    stats = policy.drift(arm)
                except PolicyError as exc:
                    raise NonFiniteState(f"{domain}: arm {arm!r}: {exc}", subject=domain) from exc
            prior = policy.prior_of(arm)
            arms.append(
                ArmSummary(arm, prior.mean, prior.strength, policy.update_count(arm), float(stats.cov_trace), float(stats.spectral_norm))
            )
        params = policy.get_params()
        return cls(
            tenant=tenant,
            workspace=workspace,
            domain=domain,
            version=str(SemVer.parse(version)),
            policy=policy.name,
            params=json.loads(_json(params)),
            dimension=policy.dim,
            policy_state=state,
            arms=tuple(arms),
            feature_config=settings.features.to_dict(),
            feature_hash=settings.features.config_hash(),
            reward_config=settings.reward.model_dump(mode="json"),
            reward_hash=settings.reward_engine().config_hash(),
            samples=sum(a.count for a in arms),
            created_at=_now_ms() if created_at is None else int(created_at),
            normalizer=None if normalizer is None else normalizer.export(),
            git_commit=commit if commit is not None else git_commit(),
            source_offsets=tuple(SourceOffset(*o) for o in source_offsets),
        )

    def replace(self, **changes: Any) -> Snapshot:
        return dataclasses.replace(self, **changes)

    # --- what the SDK uses -----------------------------------------------------------------------

    @property
    def semver(self) -> SemVer:
        return SemVer.parse(self.version)

    def load_policy(self) -> Policy:
        """The scoring-only policy (decides, never learns); raises SnapshotFormatError if damaged."""
        try:
            return Policy.from_bytes(self.policy_state)
        except PolicyError as exc:
            raise SnapshotFormatError(f"{self.domain} {self.version}: policy state does not load: {exc}") from exc

    def features(self) -> FeatureConfig:
        return FeatureConfig.from_dict(self.feature_config)

    def reward(self) -> RewardConfig:
        return RewardConfig.model_validate(self.reward_config)

    def frozen_normalizer(self) -> Normalizer | None:
        return None if self.normalizer is None else Normalizer.from_export(self.normalizer, frozen=True)

    def arm(self, arm: str) -> ArmSummary:
        for summary in self.arms:
            if summary.arm == arm:
                return summary
        raise KeyError(arm)

    def config_signature(self) -> str:
        """What a minor version tracks: policy, hyper-parameters, feature and reward config."""
        return _json({"policy": self.policy, "params": self.params, "features": self.feature_hash, "reward": self.reward_hash})

    def summary(self, *, verbose: bool = False) -> dict[str, Any]:
        """Plain data for listings and dumps (arrays left out; per-arm rows with ``verbose``)."""
        out: dict[str, Any] = {
            "tenant": self.tenant,
            "workspace": self.workspace,
            "domain": self.domain,
            "version": self.version,
            "state_major": self.state_major,
            "policy": self.policy,
            "params": dict(self.params),
            "dimension": self.dimension,
            "arms": len(self.arms),
            "samples": self.samples,
            "feature_hash": self.feature_hash,
            "reward_hash": self.reward_hash,
            "normalized": self.normalizer is not None,
            "drift_flag": self.drift_flag,
            "drift_reason": self.drift_reason,
            "git_commit": self.git_commit,
            "created_at": self.created_at,
            "source_offsets": [o._asdict() for o in self.source_offsets],
            "derived_from": self.derived_from,
            "state_bytes": len(self.policy_state),
        }
        if self.policy == Portfolio.name:  # who acts, and the switches that made it so
            out["portfolio"] = describe_state(self.policy_state)
        if verbose:
            out["arm_rows"] = [a._asdict() for a in self.arms]
            out["feature_config"] = dict(self.feature_config)
            out["reward_config"] = dict(self.reward_config)
        return out

    # --- bytes -----------------------------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "workspace": self.workspace,
            "domain": self.domain,
            "version": self.version,
            "state_major": self.state_major,
            "policy": self.policy,
            "params_json": _json(self.params),
            "dimension": self.dimension,
            "policy_state": self.policy_state,
            "arms": [a._asdict() for a in self.arms],
            "feature_config_json": _json(self.feature_config),
            "feature_hash": self.feature_hash,
            "normalizer_json": None if self.normalizer is None else _json(self.normalizer),
            "reward_config_json": _json(self.reward_config),
            "reward_hash": self.reward_hash,
            "samples": self.samples,
            "drift_flag": self.drift_flag,
            "drift_reason": self.drift_reason,
            "git_commit": self.git_commit,
            "created_at": self.created_at,
            "source_offsets": [o._asdict() for o in self.source_offsets],
            "derived_from": self.derived_from,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Snapshot:
        try:
            normalizer = record.get("normalizer_json")
            return cls(
                tenant=record["tenant"],
                workspace=record["workspace"],
                domain=record["domain"],
                version=record["version"],
                state_major=int(record["state_major"]),
                policy=record["policy"],
                params=json.loads(record["params_json"]),
                dimension=int(record["dimension"]),
                policy_state=bytes(record["policy_state"]),
                arms=tuple(ArmSummary(**a) for a in record["arms"]),
                feature_config=json.loads(record["feature_config_json"]),
                feature_hash=record["feature_hash"],
                normalizer=None if normalizer is None else json.loads(normalizer),
                reward_config=json.loads(record["reward_config_json"]),
                reward_hash=record["reward_hash"],
                samples=int(record["samples"]),
                drift_flag=bool(record["drift_flag"]),
                drift_reason=record["drift_reason"],
                git_commit=record["git_commit"],
                created_at=_millis(record["created_at"]),
                source_offsets=tuple(SourceOffset(**o) for o in record["source_offsets"]),
                derived_from=record.get("derived_from"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotFormatError(f"snapshot record is malformed: {exc}") from exc

    def to_bytes(self, *, level: int = _ZSTD_LEVEL) -> bytes:
        """Avro single-object encoding of the record, as one zstd frame (content size included)."""
        buf = io.BytesIO()
        buf.write(_SINGLE_OBJECT_MAGIC)
        buf.write(schemas.fingerprint("snapshot"))
        fastavro.schemaless_writer(buf, schemas.parsed("snapshot"), self.to_record())
        return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(buf.getbuffer())

    @classmethod
    def from_bytes(
        cls, data: bytes, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED, expect_major: int | None = STATE_MAJOR
    ) -> Snapshot:
        """Read :meth:`to_bytes`; refuse another state major (``expect_major=None`` reads any)."""
        raw = _decompress(data, max_decompressed)
        if raw[:2] != _SINGLE_OBJECT_MAGIC or len(raw) < 10:
            raise SnapshotFormatError("not a banditstream snapshot (no Avro single-object header)")
        writer = _writer_schema(raw[2:10])
        try:
            record = fastavro.schemaless_reader(io.BytesIO(raw[10:]), writer, schemas.parsed("snapshot"))
        except (EOFError, ValueError, TypeError, IndexError, UnicodeDecodeError) as exc:
            raise SnapshotFormatError(f"snapshot body does not decode: {exc}") from exc
        snapshot = cls.from_record(record)
        if expect_major is not None and snapshot.state_major != expect_major:
            raise MajorVersionError(
                f"{snapshot.domain} {snapshot.version} has state major {snapshot.state_major}; this code reads {expect_major}",
                subject=snapshot.domain,
            )
        return snapshot


def _millis(value: Any) -> int:
    if isinstance(value, (int, np.integer)):
        return int(value)
    return int(round(value.timestamp() * 1000))  # fastavro returns datetime for timestamp-millis


def _decompress(data: bytes, limit: int) -> bytes:
    try:
        params = zstandard.get_frame_parameters(data)
    except zstandard.ZstdError as exc:
        raise SnapshotFormatError(f"snapshot is not a zstd frame: {exc}") from exc
    size = params.content_size
    if size == zstandard.CONTENTSIZE_UNKNOWN or size == zstandard.CONTENTSIZE_ERROR or size > limit:
        raise SnapshotFormatError(f"snapshot frame declares {size} bytes; the limit is {limit}")
    try:
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise SnapshotFormatError(f"snapshot frame does not decompress: {exc}") from exc


@functools.cache
def _writers() -> dict[bytes, Any]:
    known = {schemas.fingerprint("snapshot"): schemas.parsed("snapshot")}
    for version in schemas.history("snapshot"):
        known[schemas.fingerprint("snapshot", version)] = schemas.parsed("snapshot", version)
    return known


def _writer_schema(fingerprint: bytes) -> Any:
    try:
        return _writers()[bytes(fingerprint)]
    except KeyError:
        raise SnapshotFormatError(f"snapshot written with an unknown schema (fingerprint {bytes(fingerprint).hex()})") from None


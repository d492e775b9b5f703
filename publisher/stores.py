"""Where repositories live: one small interface, a local directory and S3.

Keys are ``/``-separated paths relative to the store's root (``default/main/route/metadata/
timestamp.json``). The interface offers exactly the primitives the repository's commit
protocol needs:

- :meth:`~SnapshotStore.get` / :meth:`~SnapshotStore.get_tagged`: read, optionally with a
  tag (S3: the ETag; directory: SHA-256 of the content) for a later compare-and-swap;
- :meth:`~SnapshotStore.put`: overwrite;
- :meth:`~SnapshotStore.put_new`: create only if absent (S3 ``IfNoneMatch="*"``; directory:
  ``link(2)``, which fails if the name exists) - how one publisher, and only one, claims a
  metadata version;
- :meth:`~SnapshotStore.put_if_match`: compare-and-swap on the tag (S3 ``IfMatch``);
- :meth:`~SnapshotStore.append`: append to a log (the audit manifest), race-free;
- :meth:`~SnapshotStore.delete`, :meth:`~SnapshotStore.list`, :meth:`~SnapshotStore.stat`.

Only :class:`S3Store` imports boto3, and only when built, so the pull path stays light.

    >>> import tempfile
    >>> store = DirectoryStore(tempfile.mkdtemp())
    >>> store.put_new("a/b.json", b"{}")
    >>> store.get("a/b.json")
    b'{}'
    >>> try:
    ...     store.put_new("a/b.json", b"[]")
    ... except AlreadyExists:
    ...     print("taken")
    taken
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import hashlib
import os
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from publisher.errors import AlreadyExists, ObjectNotFound, PreconditionFailed, StoreError, StoreUnavailable

__all__ = ["DirectoryStore", "HttpStore", "ObjectInfo", "S3Store", "SnapshotStore", "open_store"]


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: its key, size in bytes and last modification (epoch seconds)."""

    key: str
    size: int
    modified: float


class SnapshotStore(abc.ABC):
    """A flat namespace of immutable-or-replaceable objects with conditional writes."""

    #: Human-readable location, for messages and logs.
    location: str = ""

    @abc.abstractmethod
    def get_tagged(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and its tag; :class:`ObjectNotFound` if absent."""

    def get(self, key: str) -> bytes:
        """The object's bytes; :class:`ObjectNotFound` if absent."""
        return self.get_tagged(key)[0]

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write (or replace) an object atomically: readers see the old or the new bytes."""

    @abc.abstractmethod
    def put_new(self, key: str, data: bytes) -> None:
        """Create an object only if the key is free; :class:`AlreadyExists` otherwise."""

    @abc.abstractmethod
    def put_if_match(self, key: str, data: bytes, tag: str) -> None:
        """Replace an object only if its tag is still ``tag``; :class:`PreconditionFailed` if not."""

    def append(self, key: str, data: bytes, *, attempts: int = 20) -> None:
        """Append ``data`` to an object (created if absent), never losing a concurrent append.

        The default is an optimistic loop over :meth:`put_new` / :meth:`put_if_match`.
        """
        for _ in range(attempts):
            try:
                old, tag = self.get_tagged(key)
            except ObjectNotFound:
                try:
                    self.put_new(key, data)
                    return
                except AlreadyExists:
                    continue
            try:
                self.put_if_match(key, old + data, tag)
                return
            except PreconditionFailed:
                time.sleep(0.01)
        raise PreconditionFailed(f"could not append to {key} in {attempts} attempts", subject=key)

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; removing an absent one is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key."""

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size and modification time of one object; :class:`ObjectNotFound` if absent."""

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
            return True
        except ObjectNotFound:
            return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"store keys are relative '/'-separated paths without '.' or '..', got {key!r}")
    return key


# --- a local directory -----------------------------------------------------------------------------


class DirectoryStore(SnapshotStore):
    """Objects as files under ``root`` (serve ``root`` over HTTP and any TUF client reads it).

    Writes go to a temporary file in the same folder first: ``put`` renames it over the
    target (atomic replace), ``put_new`` hard-links it to the target name, which fails if the
    name exists, so the object appears complete or not at all. ``put_if_match`` and
    ``append`` hold an exclusive ``flock`` on a lock file under ``root/.locks``.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.location = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        locks = self.root / ".locks"
        locks.mkdir(exist_ok=True)
        name = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
        with open(locks / name, "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _temp(self, path: Path, data: bytes) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        return temp

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        try:
            data = self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(f"no object {key} in {self.location}", subject=key) from None
        return data, hashlib.sha256(data).hexdigest()

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        os.replace(self._temp(path, data), path)

    def put_new(self, key: str, data: bytes) -> None:
        path = self._path(key)
        temp = self._temp(path, data)
        try:
            os.link(temp, path)
        except FileExistsError:
            raise AlreadyExists(f"{key} already exists in {self.location}", subject=key) from None
        finally:
            os.unlink(temp)

    def put_if_match(self, key: str, data: bytes, tag: str) -> None:
        with self._locked(key):
            try:
                _, current = self.get_tagged(key)
            except ObjectNotFound:
                raise PreconditionFailed(f"{key} vanished before it could be replaced", subject=key) from None
            if current != tag:
                raise PreconditionFailed(f"{key} changed since it was read", subject=key)
            self.put(key, data)

    def append(self, key: str, data: bytes, *, attempts: int = 20) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked(key), open(path, "ab") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith(".tmp-"):
                    continue
                full = Path(dirpath, name)
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):
                        st = full.stat()
                        out.append(ObjectInfo(key, st.st_size, st.st_mtime))
        return sorted(out, key=lambda info: info.key)

    def stat(self, key: str) -> ObjectInfo:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(f"no object {key} in {self.location}", subject=key) from None
        return ObjectInfo(key, st.st_size, st.st_mtime)


# --- S3 --------------------------------------------------------------------------------------------


class S3Store(SnapshotStore):
    """Objects in an S3 bucket under ``prefix``, through boto3.

    ``put_new`` is ``PutObject`` with ``IfNoneMatch="*"`` and ``put_if_match`` is ``PutObject``
    with ``IfMatch=<ETag>``: the server decides which of two racing writers wins (HTTP 412 for
    the loser), so two publishers can never both claim a version. ``client`` is a boto3 S3
    client, or ``client_kwargs`` build one (``endpoint_url``, keys, ``region_name``).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: Any = None,
        create_bucket: bool = False,
        **client_kwargs: Any,
    ) -> None:
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=30)
            profile = client_kwargs.pop("profile_name", None)  # a named profile needs its own session
            client = (boto3.Session(profile_name=profile) if profile else boto3).client("s3", config=config, **client_kwargs)
        from botocore.exceptions import BotoCoreError, ClientError

        self._client = client
        self._client_error = ClientError
        self._transport_errors = (BotoCoreError, ConnectionError, OSError)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.location = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        if create_bucket:
            self._call("create_bucket", None, Bucket=bucket, _ignore=("BucketAlreadyOwnedByYou", "BucketAlreadyExists"))

    @property
    def client(self) -> Any:
        """The boto3 S3 client (for checks beyond the store's own calls, e.g. the server's clock)."""
        return self._client

    def _full(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, method: str, key: str | None, _ignore: tuple[str, ...] = (), **kwargs: Any) -> Any:
        try:
            return getattr(self._client, method)(**kwargs)
        except self._client_error as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _ignore:
                return None
            subject = key or self.bucket
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                raise ObjectNotFound(f"no object {key} in {self.location}", subject=subject) from None
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                if kwargs.get("IfNoneMatch") == "*":
                    raise AlreadyExists(f"{key} already exists in {self.location}", subject=subject) from None
                raise PreconditionFailed(f"{key} changed since it was read ({code})", subject=subject) from None
            if status is not None and status >= 500:
                raise StoreUnavailable(f"{self.location} answered {status} {code} to {method}", subject=subject) from exc
            raise StoreError(f"{method} {key} in {self.location} failed: {code} {error.get('Message', '')}", subject=subject) from exc
        except self._transport_errors as exc:
            raise StoreUnavailable(f"{self.location} unreachable during {method}: {exc}", subject=key or self.bucket) from exc

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        response = self._call("get_object", key, Bucket=self.bucket, Key=self._full(key))
        try:
            data = response["Body"].read()
        except self._transport_errors as exc:
            raise StoreUnavailable(f"{self.location} broke off reading {key}: {exc}", subject=key) from exc
        return data, response["ETag"]

    def put(self, key: str, data: bytes) -> None:
        self._call("put_object", key, Bucket=self.bucket, Key=self._full(key), Body=data)

    def put_new(self, key: str, data: bytes) -> None:
        self._call("put_object", key, Bucket=self.bucket, Key=self._full(key), Body=data, IfNoneMatch="*")

    def put_if_match(self, key: str, data: bytes, tag: str) -> None:
        self._call("put_object", key, Bucket=self.bucket, Key=self._full(key), Body=data, IfMatch=tag)

    def delete(self, key: str) -> None:
        self._call("delete_object", key, Bucket=self.bucket, Key=self._full(key))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        full_prefix = (f"{self.prefix}/" if self.prefix else "") + prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        out: list[ObjectInfo] = []
        token = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix}
            if token:
                kwargs["ContinuationToken"] = token
            response = self._call("list_objects_v2", prefix, **kwargs)
            for item in response.get("Contents", []):
                out.append(ObjectInfo(item["Key"][strip:], int(item["Size"]), item["LastModified"].timestamp()))
            if not response.get("IsTruncated"):
                break
            token = response.get("NextContinuationToken")
        return sorted(out, key=lambda info: info.key)

    def stat(self, key: str) -> ObjectInfo:
        response = self._call("head_object", key, Bucket=self.bucket, Key=self._full(key))
        return ObjectInfo(key, int(response["ContentLength"]), response["LastModified"].timestamp())


# --- read-only HTTP --------------------------------------------------------------------------------


class HttpStore(SnapshotStore):
    """A read-only view of a repository served over HTTP(S) (a CDN, nginx, ``http.server``)."""

    def __init__(self, base_url: str, *, timeout: float = 10.0, pool: Any = None) -> None:
        import urllib3

        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.location = self.base_url
        self._timeout = timeout
        self._pool = pool or urllib3.PoolManager(retries=urllib3.Retry(total=2, backoff_factor=0.1))
        self._urllib3 = urllib3

    def _url(self, key: str) -> str:
        return self.base_url + urllib.parse.quote(_check_key(key))

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        try:
            response = self._pool.request("GET", self._url(key), timeout=self._timeout, preload_content=True)
        except self._urllib3.exceptions.HTTPError as exc:
            raise StoreUnavailable(f"{self.location} unreachable: {exc}", subject=key) from exc
        if response.status in (403, 404):
            raise ObjectNotFound(f"no object {key} at {self.location} (HTTP {response.status})", subject=key)
        if response.status != 200:
            raise StoreUnavailable(f"{self.location} answered HTTP {response.status} for {key}", subject=key)
        data = response.data
        return data, response.headers.get("ETag") or hashlib.sha256(data).hexdigest()

    def _read_only(self, *_: Any, **__: Any) -> Any:
        raise StoreError(f"{self.location} is read-only (HTTP)", subject=self.location)

    put = put_new = put_if_match = delete = _read_only  # type: ignore[assignment]

    def append(self, key: str, data: bytes, *, attempts: int = 20) -> None:
        self._read_only()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self._read_only()
        return []

    def stat(self, key: str) -> ObjectInfo:
        data, _ = self.get_tagged(key)
        return ObjectInfo(key, len(data), 0.0)


def open_store(location: str | os.PathLike[str] | SnapshotStore, *, s3: Mapping[str, Any] | None = None) -> SnapshotStore:
    """A store from a location: a store (returned as is), ``s3://bucket/prefix``, ``http(s)://...``,
    ``file://...`` or a plain directory path. ``s3`` holds boto3 client kwargs for S3 locations.
    """
    if isinstance(location, SnapshotStore):
        return location
    text = os.fspath(location)
    parsed = urllib.parse.urlparse(text)
    if parsed.scheme == "s3":
        return S3Store(parsed.netloc, parsed.path.strip("/"), **dict(s3 or {}))
    if parsed.scheme in ("http", "https"):
        return HttpStore(text)
    if parsed.scheme == "file":
        return DirectoryStore(urllib.parse.unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:
        raise ValueError(f"unsupported repository location {text!r}: use a path, file://, s3:// or http(s)://")
    return DirectoryStore(text)


"""One worker per state directory: an exclusive ``flock`` on ``DIR/LOCK`` for the process's life.

Two workers on one state directory would both write its RocksDB state (each thinking it owns
the shards) and corrupt it, or, where RocksDB's own per-database lock stops the second, fail
later and far from the cause. So a worker takes the directory's lock before it touches any
state, and a second one is refused at once with :class:`~learner.errors.StateDirLocked`::

    lock = StateLock(config.state_dir / "learn")   # raises StateDirLocked if held elsewhere
    try:
        ...                                        # open the store, run
    finally:
        lock.close()

The lock is ``flock(LOCK_EX | LOCK_NB)`` on an open file, so the kernel releases it when the
process ends in any way, ``kill -9`` included: no stale lock to clean up. The holder writes its
pid into the file, for the message of the one refused. The file is never deleted (deleting it
would let a third process lock a new file while the second still holds the old one).

``flock`` is advisory and local: it guards against a second worker on the same host (or the
same mounted volume, seen from one kernel), which is the mistake it is for. On NFS it follows
the client's emulation of ``flock``.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from learner.errors import StateDirLocked

__all__ = ["LOCK_FILE", "StateLock"]

#: The lock file's name inside the state directory.
LOCK_FILE = "LOCK"


class StateLock:
    """The exclusive lock of one state directory, taken on construction (created if missing).

    Raises :class:`~learner.errors.StateDirLocked` when another open file holds it: another
    process, or another :class:`StateLock` in this one. Release with :meth:`close` (or use it
    as a context manager); process exit releases it too.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise StateDirLocked(str(self.directory), holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        """Release the lock (idempotent). The pid is cleared first, so a reader never sees
        a released lock's holder."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the last descriptor of the open file releases the flock

    def __enter__(self) -> StateLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StateLock({str(self.directory)!r}, {'held' if self.held else 'released'})"


def _read_pid(fd: int) -> int | None:
    """The holder's pid as it wrote it; None while it has not yet (it locks, then writes)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None

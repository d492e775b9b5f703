"""A bounded, crash-safe local spool: events wait here while Kafka is unreachable.

Records are appended to one file as ``length (4 bytes, big-endian) | crc32 (4) | body``;
a small cursor file says how many bytes from the start have been delivered (and which
file they belong to). The workflow, in order:

1. **Append.** ``append`` adds a record at the end. Past ``max_bytes`` of pending records
   the ``overflow`` policy decides: ``"drop_newest"`` (the default) refuses the new record,
   ``"drop_oldest"`` moves the cursor past the oldest pending records until it fits. Either
   way the loss is counted (``dropped_newest``, ``dropped_oldest``) and logged, at most one
   line per 10 s; nothing below the bound is ever lost.
2. **Peek.** ``peek`` reads pending records in append order, each with its *position*: a
   number that only grows for the life of the object (a drained, truncated file does not
   reuse old positions), so a position remembered by a drain can never name a newer record.
3. **Commit.** ``commit(position)`` marks everything before it delivered. When everything
   is, the file is truncated.
4. **Compact.** While the spool never empties (a long outage with ``drop_oldest``, or a
   drain that never catches up), the delivered or dropped prefix would grow the file
   without bound; ``compact`` rewrites the file without it, so the file stays under about
   twice the bound. The cursor file records the file's inode: a crash between the rewrite
   and the cursor update leaves a cursor naming the old file, which is then ignored.

A torn tail (a crash mid-append) is detected by its length or crc and dropped, never
delivered half.

    >>> spool = Spool(tmp_path / "events.spool", max_bytes=1 << 20)      # doctest: +SKIP
    >>> spool.append(b"topic\\x00key\\x00value")                          # doctest: +SKIP
    >>> for position, body in spool.peek(100): ...                        # doctest: +SKIP
    >>> spool.commit(position)                                            # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">II")
_READ_CHUNK = 1 << 20
#: at most one overflow line in this many seconds (an outage can overflow thousands a second)
_OVERFLOW_LOG_INTERVAL_S = 10.0

Overflow = Literal["drop_newest", "drop_oldest"]
OVERFLOW_POLICIES = ("drop_newest", "drop_oldest")


class Spool:
    """Append-only spool file with a delivered-bytes cursor; thread-safe. See the module docstring."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        max_bytes: int = 64 << 20,
        overflow: Overflow = "drop_newest",
        fsync: bool = False,
    ):
        if max_bytes < 1024:
            raise ValueError(f"max_bytes must be at least 1024, got {max_bytes}")
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {overflow!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.cursor_path = self.path.with_name(self.path.name + ".cursor")
        self._compact_path = self.path.with_name(self.path.name + ".compact")
        self.max_bytes = max_bytes
        self.overflow = overflow
        self.fsync = fsync
        #: records refused because the spool was full (``overflow="drop_newest"``, or a record
        #: larger than the whole bound)
        self.dropped_newest = 0
        #: pending records discarded to make room (``overflow="drop_oldest"``)
        self.dropped_oldest = 0
        self._next_overflow_log = 0.0
        self._lock = threading.Lock()
        # a compaction interrupted by a crash left this; the spool file itself is intact
        self._compact_path.unlink(missing_ok=True)
        self._file = open(self.path, "ab+")
        self._inode = os.fstat(self._file.fileno()).st_ino
        #: position of file offset 0: grows by the file's length at each truncation or
        #: compaction, so positions are never reused
        self._base = 0
        #: bumped whenever file offsets change meaning (truncation, compaction)
        self._epoch = 0
        self._cursor = self._read_cursor()
        self._end = self._valid_end()
        self._count = self._count_pending()

    # -- writing --------------------------------------------------------------------------

    def append(self, body: bytes) -> bool:
        """Add one record; False when it was refused (counted, and logged now and then).

        With ``overflow="drop_oldest"`` the record is accepted and the oldest pending records
        are dropped instead; a record larger than the whole bound is always refused.
        """
        record = _HEADER.pack(len(body), zlib.crc32(body)) + body
        with self._lock:
            if self._end - self._cursor + len(record) > self.max_bytes:
                if self.overflow == "drop_newest" or len(record) > self.max_bytes:
                    self.dropped_newest += 1
                    self._log_overflow()
                    return False
                self._drop_oldest_until_room(len(record))
            self._file.seek(self._end)
            self._file.write(record)
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
            self._end += len(record)
            self._count += 1
            return True

    def _drop_oldest_until_room(self, size: int) -> None:
        """Move the cursor past the oldest records until ``size`` more bytes fit (lock held)."""
        while self._end - self._cursor + size > self.max_bytes and self._cursor < self._end:
            self._file.seek(self._cursor)
            length, _crc = _HEADER.unpack(self._file.read(_HEADER.size))
            self._cursor += _HEADER.size + length
            self._count -= 1
            self.dropped_oldest += 1
        self._write_cursor()
        self._log_overflow()

    def _log_overflow(self) -> None:
        now = time.monotonic()
        if now >= self._next_overflow_log:
            self._next_overflow_log = now + _OVERFLOW_LOG_INTERVAL_S
            log.warning(
                "spool %s is full (%d bytes, overflow=%s): %d events dropped so far (%d oldest, %d newest)",
                self.path, self.max_bytes, self.overflow, self.overflowed, self.dropped_oldest, self.dropped_newest,
            )  # fmt: skip

    # -- draining -------------------------------------------------------------------------

    def peek(self, limit: int) -> Iterator[tuple[int, bytes]]:
        """Up to ``limit`` pending records in order, each with the position after it."""
        out: list[tuple[int, bytes]] = []
        with self._lock:
            offset, end, base = self._cursor, self._end, self._base
            self._file.seek(offset)
            buffer = b""
            # read in chunks, not the whole pending file: a drain peeks a batch at a time
            while len(out) < limit and offset < end:
                more = self._file.read(min(_READ_CHUNK, end - offset - len(buffer)))
                if not more:
                    break
                buffer += more
                start = 0
                while len(out) < limit and start + _HEADER.size <= len(buffer):
                    length, _crc = _HEADER.unpack_from(buffer, start)
                    stop = start + _HEADER.size + length
                    if stop > len(buffer):
                        break
                    offset += stop - start
                    out.append((base + offset, buffer[start + _HEADER.size : stop]))
                    start = stop
                buffer = buffer[start:]
        return iter(out)

    def commit(self, position: int) -> None:
        """Everything before ``position`` was delivered; truncate once all of it is.

        A position the cursor already passed (records dropped by ``drop_oldest`` meanwhile,
        or a file truncated since) is a no-op.
        """
        with self._lock:
            offset = position - self._base
            if offset <= self._cursor:
                return
            if offset > self._end:
                raise ValueError(f"commit position {position} is past the end {self._base + self._end}")
            self._file.seek(self._cursor)
            skipped = self._file.read(offset - self._cursor)
            self._count -= _count_records(skipped)
            self._cursor = offset
            if self._cursor == self._end:
                self._file.truncate(0)
                self._base += self._end
                self._epoch += 1
                self._cursor = self._end = 0
            self._write_cursor()

    def compact(self, min_dead_bytes: int | None = None) -> bool:
        """Rewrite the file without its delivered or dropped prefix, once that is large.

        ``min_dead_bytes`` defaults to the bound (at least 1 MiB). The pending part is copied
        without holding the lock (appends go on); only what was appended meanwhile is copied
        under it. Returns whether the file was rewritten.
        """
        threshold = max(self.max_bytes, 1 << 20) if min_dead_bytes is None else min_dead_bytes
        with self._lock:
            if self._cursor < max(threshold, 1) or self._file.closed:
                return False
            start, snapshot_end, epoch = self._cursor, self._end, self._epoch
        with open(self._compact_path, "wb") as out, open(self.path, "rb") as source:
            source.seek(start)
            _copy(source, out, snapshot_end - start)
            with self._lock:
                if self._epoch != epoch or self._file.closed:  # truncated meanwhile: nothing to save
                    out.close()
                    self._compact_path.unlink(missing_ok=True)
                    return False
                source.seek(snapshot_end)
                _copy(source, out, self._end - snapshot_end)
                out.flush()
                if self.fsync:
                    os.fsync(out.fileno())
                os.replace(self._compact_path, self.path)
                self._file.close()
                self._file = open(self.path, "ab+")
                self._inode = os.fstat(self._file.fileno()).st_ino
                self._base += start
                self._epoch += 1
                self._cursor -= start
                self._end -= start
                self._write_cursor()
        return True

    # -- state ----------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Records waiting."""
        return self._count

    @property
    def pending_bytes(self) -> int:
        return self._end - self._cursor

    @property
    def dead_bytes(self) -> int:
        """Delivered or dropped bytes still at the start of the file (what ``compact`` frees)."""
        return self._cursor

    @property
    def overflowed(self) -> int:
        """Events lost to the bound, either policy."""
        return self.dropped_newest + self.dropped_oldest

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def _read_cursor(self) -> int:
        """The delivered-bytes cursor; 0 when it is missing or names another file."""
        try:
            offset, _, inode = self.cursor_path.read_text().strip().partition(" ")
            if inode and int(inode) != self._inode:
                return 0  # the file was rewritten by a compaction after this cursor was written
            return int(offset or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _write_cursor(self) -> None:
        tmp = self.cursor_path.with_suffix(".tmp")
        tmp.write_text(f"{self._cursor} {self._inode}")
        tmp.replace(self.cursor_path)

    def _valid_end(self) -> int:
        """Scan from the cursor; drop a torn or corrupt tail left by a crash."""
        self._file.seek(0, os.SEEK_END)
        size = self._file.tell()
        if self._cursor > size:
            self._cursor = 0
        self._file.seek(self._cursor)
        data = self._file.read()
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, offset)
            body = data[offset + _HEADER.size : offset + _HEADER.size + length]
            if len(body) < length or zlib.crc32(body) != crc:
                break
            offset += _HEADER.size + length
        end = self._cursor + offset
        if end < size:
            log.warning("spool %s: dropping %d bytes of torn tail", self.path, size - end)
            self._file.truncate(end)
        return end

    def _count_pending(self) -> int:
        self._file.seek(self._cursor)
        return _count_records(self._file.read(self._end - self._cursor))


def _count_records(data: bytes) -> int:
    count = offset = 0
    while offset + _HEADER.size <= len(data):
        length, _ = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size + length
        count += 1
    return count


def _copy(source, target, size: int) -> None:
    while size > 0:
        chunk = source.read(min(_READ_CHUNK, size))
        if not chunk:
            break
        target.write(chunk)
        size -= len(chunk)

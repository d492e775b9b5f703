"""A bounded, crash-safe local spool: events wait here while Kafka is unreachable.

Records are appended to one file as ``length (4 bytes, big-endian) | crc32 (4) | body``;
a small cursor file says how many bytes from the start have been delivered. Draining reads
in append order, so events leave in the order they were made. When everything is drained
the file is truncated. A torn tail (a crash mid-append) is detected by its length or crc
and dropped, never delivered half.

The bound is in bytes: an append that would pass it is refused, counted in ``overflowed``
and logged; nothing below the bound is ever lost.

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
import zlib
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">II")


class Spool:
    """Append-only spool file with a delivered-bytes cursor; thread-safe."""

    def __init__(self, path: str | os.PathLike, *, max_bytes: int = 64 << 20, fsync: bool = False):
        if max_bytes < 1024:
            raise ValueError(f"max_bytes must be at least 1024, got {max_bytes}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.cursor_path = self.path.with_name(self.path.name + ".cursor")
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.overflowed = 0
        self._lock = threading.Lock()
        self._file = open(self.path, "ab+")
        self._cursor = self._read_cursor()
        self._end = self._valid_end()
        self._count = self._count_pending()

    # -- writing --------------------------------------------------------------------------

    def append(self, body: bytes) -> bool:
        """Add one record; False (and counted, and logged) when the spool is full."""
        record = _HEADER.pack(len(body), zlib.crc32(body)) + body
        with self._lock:
            if self._end - self._cursor + len(record) > self.max_bytes:
                self.overflowed += 1
                if self.overflowed == 1 or self.overflowed % 1000 == 0:
                    log.warning("spool %s is full (%d bytes): %d events dropped so far", self.path, self.max_bytes, self.overflowed)
                return False
            self._file.seek(self._end)
            self._file.write(record)
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
            self._end += len(record)
            self._count += 1
            return True

    # -- draining -------------------------------------------------------------------------

    def peek(self, limit: int) -> Iterator[tuple[int, bytes]]:
        """Up to ``limit`` pending records in order, each with the position after it."""
        with self._lock:
            position, end = self._cursor, self._end
            self._file.seek(position)
            data = self._file.read(end - position) if limit > 0 else b""
        out = []
        offset = 0
        while offset < len(data) and len(out) < limit:
            length, _crc = _HEADER.unpack_from(data, offset)
            body = data[offset + _HEADER.size : offset + _HEADER.size + length]
            offset += _HEADER.size + length
            out.append((position + offset, body))
        return iter(out)

    def commit(self, position: int) -> None:
        """Everything before ``position`` was delivered; truncate once all of it is."""
        with self._lock:
            if position <= self._cursor:
                return
            if position > self._end:
                raise ValueError(f"commit position {position} is past the end {self._end}")
            self._file.seek(self._cursor)
            skipped = self._file.read(position - self._cursor)
            self._count -= _count_records(skipped)
            self._cursor = position
            if self._cursor == self._end:
                self._file.truncate(0)
                self._cursor = self._end = 0
            self._write_cursor()

    # -- state ----------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Records waiting."""
        return self._count

    @property
    def pending_bytes(self) -> int:
        return self._end - self._cursor

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def _read_cursor(self) -> int:
        try:
            return int(self.cursor_path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _write_cursor(self) -> None:
        tmp = self.cursor_path.with_suffix(".tmp")
        tmp.write_text(str(self._cursor))
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

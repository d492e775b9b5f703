"""Offsets a read skipped are read again before they count as a hole in the log.

A Kafka log has holes: a transaction's control records, compacted or aborted records. A
reader takes the record after one as the continuation, and a real broker never shows a hole
that is not one (a fetch reads only up to the high watermark, which moves once the records
below it are stored). Tansu's memory engine does: a produce raises the partition's end
*before* it stores its batch, so while two producers write to one partition a fetch can be
answered with the later batch alone, stepping over records that are there a moment later.
A reader that takes that gap never reads them. (CI, 2026-11-30: the join read offset 4698
of an example's decisions right after 4631, and the 66 decisions between, sent by its three
SDKs, were never joined. Not reproduced since; Tansu's produce and fetch read as above.)

:class:`GapCheck` stands between a librdkafka consumer and its reader. A record past the
offset expected next is held back: the partition is sought back to the expected offset and
paused for ``confirm_s``, then read again. The gap counts as a hole only if the read that
began that long after it was first seen finds it still there. With ``confirm_s`` 0 (a broker
that shows no passing holes: the ``kafka`` profile) every gap is taken at once, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

log = logging.getLogger("banditstream.gaps")

Key = tuple[str, int]


class GapCheck:
    """Hold back what follows a gap until the gap is confirmed (see the module's docstring).

    :meth:`admit` is asked for every record in the order the consumer returned them;
    :meth:`tick` (each poll) resumes the partitions whose wait is over. The consumer's own
    pauses (flow control) are the caller's: ``blocked`` keeps :meth:`tick` off them, and
    :attr:`held` tells the caller which partitions not to resume itself.
    """

    def __init__(self, consumer: Any, confirm_s: float, *, clock: Callable[[], float] = time.monotonic,
                 on_gap: Callable[[str, str], None] | None = None) -> None:
        self.consumer = consumer
        self.confirm_s = confirm_s
        self.clock = clock
        #: Told (topic, "reread" or "hole") of each gap: the workers' ``banditstream_log_gaps``.
        self.on_gap = on_gap
        #: (topic, partition) -> the offset read next; unknown until assigned or first read.
        self.expected: dict[Key, int] = {}
        #: (topic, partition) -> (offset missing, when its gap was first seen)
        self.sighted: dict[Key, tuple[int, float]] = {}
        #: (topic, partition) -> when to read it again: paused and sought back meanwhile.
        self.held: dict[Key, float] = {}
        #: Gaps read again (passing or not) and gaps taken as holes, since the start.
        self.rereads = 0
        self.holes = 0

    def expect(self, starts: dict[Key, int | None]) -> None:
        """Reading starts over at these offsets (None: unknown, the first record read sets it);
        whatever was held or sighted before is forgotten."""
        if self.held:
            self._resume(self.held)
        self.held.clear()
        self.sighted.clear()
        self.expected = {key: offset for key, offset in starts.items() if offset is not None and offset >= 0}

    def admit(self, message: Any) -> bool:
        """Whether to hand ``message`` (a record, not an error event) on now."""
        key = (message.topic(), message.partition())
        if self.held and key in self.held:
            return False  # fetched before its partition was sought back
        offset = message.offset()
        expected = self.expected.get(key)
        if offset == expected or expected is None or self._taken(key, offset):
            self.expected[key] = offset + 1
            if self.sighted:
                self.sighted.pop(key, None)
            return True
        return False

    def end(self, key: Key, offset: int) -> int | None:
        """The partition's end was reported at ``offset`` (an end-of-partition event): the
        offset after its last record, up to which it is read; None while the gap before
        the end is read again. (A transaction's last control record leaves such a gap at the
        end of the log, with no record after it to show it.)"""
        if key in self.held:
            return None  # fetched before its partition was sought back
        expected = self.expected.get(key)
        if not self._taken(key, offset):
            return None
        if expected is None or offset > expected:  # (past a hole: reading goes on at the end)
            self.expected[key] = offset
        return offset if expected is None else min(expected, offset)

    def _taken(self, key: Key, offset: int) -> bool:
        """Whether reading goes on at ``offset``: it is the offset expected; or further back
        (an assignment, a rebalance: the reader skips what it has); or past a gap that is a
        hole. Else the gap is read again: the partition sought back and paused."""
        expected = self.expected.get(key)
        if expected is None or offset <= expected:
            self.sighted.pop(key, None)
            return True
        if self.confirm_s <= 0:  # a broker whose gaps are holes
            self._count(key, "hole")
            return True
        now = self.clock()
        sighted = self.sighted.get(key)
        if sighted is not None and sighted[0] == expected and now - sighted[1] >= self.confirm_s:
            log.info("%s/%d: offsets %d..%d still missing %.1fs after first seen: a hole in the log",
                     key[0], key[1], expected, offset - 1, now - sighted[1])  # fmt: skip
            self._count(key, "hole")
            del self.sighted[key]
            return True
        if sighted is None or sighted[0] != expected:
            sighted = self.sighted[key] = (expected, now)
            log.debug("%s/%d: offsets %d..%d missing; read again in %.1fs", key[0], key[1], expected, offset - 1, self.confirm_s)
        self._count(key, "reread")
        self.consumer.pause([TopicPartition(key[0], key[1])])
        self.consumer.seek(TopicPartition(key[0], key[1], expected))
        self.held[key] = sighted[1] + self.confirm_s
        return False

    def tick(self, blocked: Iterable[Key] = ()) -> None:
        """Resume the held partitions whose wait is over (and that the caller has not paused)."""
        if not self.held:
            return
        now, blocked = self.clock(), set(blocked)
        due = [key for key, at in self.held.items() if at <= now]
        for key in due:
            del self.held[key]
        self._resume(key for key in due if key not in blocked)

    def forget(self, keys: Iterable[Key]) -> None:
        """These partitions are no longer read here (being revoked). Those held are resumed:
        nothing of this check outlives the assignment."""
        held = []
        for key in keys:
            self.expected.pop(key, None)
            self.sighted.pop(key, None)
            if self.held.pop(key, None) is not None:
                held.append(key)
        self._resume(held)

    def _count(self, key: Key, outcome: str) -> None:
        if outcome == "hole":
            self.holes += 1
        else:
            self.rereads += 1
        if self.on_gap is not None:
            self.on_gap(key[0], outcome)

    def _resume(self, keys: Iterable[Key]) -> None:
        tps = [TopicPartition(topic, partition) for topic, partition in keys]
        if tps:
            try:
                self.consumer.resume(tps)
            except KafkaException as error:  # no longer assigned: nothing to resume
                log.debug("resuming %s: %s", tps, error)

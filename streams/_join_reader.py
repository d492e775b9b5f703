"""How the join reads its source partitions: librdkafka, in time order, in batches.

faust runs the join's consumer group (the assignment that keeps the table's changelog
co-partitioned with the sources, the recovery, the commits); the source records themselves
are read by a librdkafka consumer assigned the same partitions by hand
(:class:`SourceReader`). Through faust's aiokafka consumer each record cost Python work twice,
parsing in the consumer's thread (holding the GIL) and wrapping on the event loop: about a
fifth of the join's CPU. librdkafka parses in its own threads, in C.

:class:`RewardHold` hands each partition's rewards over in time order with its decisions.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from streams._gaps import GapCheck

_EOF = KafkaError._PARTITION_EOF

log = logging.getLogger("banditstream.join")


class RewardHold:
    """Rewards wait here, undecoded, until their partition's decisions are read past their time.

    A fetch hands over up to a megabyte of one partition at a time, and a reward is a fifth of
    a decision's size: when the join was behind, it read rewards seconds ahead of their
    decisions, each opened an early-reward entry for its decision to find, and with a big
    enough backlog those outgrew memory (written, read back). Handed over in time order, a
    reward finds its decision waiting. A partition's rewards go as soon as its decisions are
    read to their end (nothing to wait for), and when more than ``max_held`` wait the
    partition is paused (:meth:`over`) so memory stays bounded.
    """

    def __init__(self, lead_ms: int, max_held: int) -> None:
        self.lead_ms = lead_ms
        self.max_held = max_held
        #: Partition -> (producer time ms, record) in offset order.
        self.held: dict[int, deque[tuple[int, Any]]] = {}
        #: Partition -> producer time (ms) of the newest decision read.
        self.decisions_at: dict[int, int] = {}

    def decision(self, partition: int, timestamp_ms: int) -> None:
        if timestamp_ms > self.decisions_at.get(partition, -(1 << 62)):
            self.decisions_at[partition] = timestamp_ms

    def reward(self, partition: int, timestamp_ms: int, record: Any) -> None:
        held = self.held.get(partition)
        if held is None:
            held = self.held[partition] = deque()
        held.append((timestamp_ms, record))

    def release(self, read_to_end: Callable[[int], bool]) -> list:
        """The rewards to handle now, per partition in offset order: those stamped up to
        ``lead_ms`` after the newest decision read, all of them once ``read_to_end(partition)``
        says its decisions have nothing left."""
        out: list = []
        for partition, held in self.held.items():
            if not held:
                continue
            if read_to_end(partition):
                out.extend(record for _, record in held)
                held.clear()
                continue
            limit = self.decisions_at.get(partition, -(1 << 62)) + self.lead_ms
            while held and held[0][0] <= limit:
                out.append(held.popleft()[1])
        return out

    def over(self) -> set[int]:
        """Partitions with more than ``max_held`` rewards waiting (to pause)."""
        return {partition for partition, held in self.held.items() if len(held) > self.max_held}

    def count(self, partition: int) -> int:
        held = self.held.get(partition)
        return 0 if held is None else len(held)

    def clear(self) -> None:
        self.held.clear()
        self.decisions_at.clear()


def _report_wall_ms(ts_us: Any) -> float:
    """Wall ms at which librdkafka wrote a statistics report, from its ``ts`` (its monotonic
    clock, CLOCK_MONOTONIC in us, as Python's on Linux): a report waits in the queue until
    the next poll, and its ``rxidle`` counts to when it was written, not to when it is read."""
    now = time.time() * 1000.0
    if isinstance(ts_us, (int, float)):
        age_ms = (time.monotonic() * 1e6 - ts_us) / 1000.0
        if 0.0 <= age_ms < 3_600_000.0:
            return now - age_ms
    return now


class SourceReader:
    """The join's source partitions, read by a librdkafka consumer assigned by hand.

    :meth:`read` is one poll (blocking up to ``timeout``: run it off the event loop); it
    returns the records to join now, decisions as read and rewards as :class:`RewardHold`
    releases them. Every :meth:`assign` starts over (what was read and not returned is read
    again from the given offsets).

    "Read to the end": librdkafka reports each partition's end when a fetch finds nothing
    more (an EOF event), and keeps fetching it every ``fetch_wait_ms`` at most. So a partition
    that reached its end, with no record since, and whose records are all handled
    (``position >= end``), holds everything that reached the broker before the start of the
    last poll that drained the queue, less one fetch wait (:meth:`complete_at`).

    A gap in a partition's offsets is read again for ``gap_confirm_s`` before it counts as a
    hole in the log (:class:`~streams._gaps.GapCheck`); meanwhile the partition is not read to
    its end.
    """

    def __init__(self, config: dict[str, Any], decisions: str, rewards: str, *, hold: RewardHold,
                 fetch_wait_ms: int, batch_max: int, stats_interval_ms: int = 500, gap_confirm_s: float = 0.0,
                 on_gap: Callable[[str, str], None] | None = None) -> None:
        self.consumer = Consumer({
            **config, "enable.partition.eof": True, "enable.auto.commit": False,
            "statistics.interval.ms": stats_interval_ms, "stats_cb": self._stats,
        })  # fmt: skip
        self.decisions, self.rewards = decisions, rewards
        self.hold = hold
        self.fetch_wait_ms = fetch_wait_ms
        self.batch_max = batch_max
        self.assigned: set[tuple[str, int]] = set()
        #: (topic, partition) -> its end offset, while no record came after the end was reported.
        self.at_end: dict[tuple[str, int], int] = {}
        #: Wall ms at the start of the last poll that drained what librdkafka had fetched.
        self.drained_at: float | None = None
        #: (topic, partition) -> wall ms its leader was last heard from (librdkafka statistics).
        self.contact: dict[tuple[str, int], float] = {}
        #: (topic, partition) -> wall ms its leader was heard again after a silence longer than
        #: ``silence_ms`` (frozen, restarting, unreachable): see :meth:`resumed_at`.
        self.resumed: dict[tuple[str, int], float] = {}
        #: Longer than this without a word from a broker that is fetched from every
        #: ``fetch_wait_ms`` is a silence, not a quiet partition.
        self.silence_ms = max(1000.0, 3.0 * fetch_wait_ms)
        #: node id -> the partitions its silence holds, for each node silent at the last report
        self._silent: dict[int, set[tuple[str, int]]] = {}
        self._last_heard: dict[int, float] = {}  # node id -> wall ms, as of the last report
        #: (topic, partition) -> wall ms its broker was last heard before its latest silence.
        self.silenced: dict[tuple[str, int], float] = {}
        self.generation = 0
        self.gaps = GapCheck(self.consumer, gap_confirm_s, on_gap=on_gap)
        self._paused: set[int] = set()
        self._lock = threading.Lock()  # assign() on the event loop, read() on the reading thread
        self._next_warning = 0.0

    def assign(self, starts: dict[tuple[str, int], int | None]) -> None:
        """Read exactly these partitions, each from its offset (None: the earliest)."""
        with self._lock:
            if self._paused:  # a partition must not stay paused across assignments
                self.consumer.resume(self._tps(self._paused))
            self.gaps.expect(starts)  # (resumes what it held)
            self.consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING if o is None else o) for (t, p), o in sorted(starts.items())])
            self.assigned = set(starts)
            self.hold.clear()
            self.at_end.clear()
            self.drained_at = None
            self._paused.clear()
            self.generation += 1

    def read(self, timeout: float) -> tuple[int, list, int]:
        """(generation, records to join, records fetched) of one poll; records of an older
        generation are stale (an assignment came meanwhile) and must be dropped."""
        generation = self.generation
        started = time.time() * 1000.0
        messages = self.consumer.consume(self.batch_max, timeout)
        with self._lock:
            if generation != self.generation:
                return generation, [], len(messages)
            return generation, self._take(messages, started), len(messages)

    def _take(self, messages: list, started: float) -> list:
        decisions, rewards, hold, at_end, gaps = self.decisions, self.rewards, self.hold, self.at_end, self.gaps
        gaps.tick(blocked=[(rewards, p) for p in self._paused])
        out: list = []
        for message in messages:
            error = message.error()
            topic, partition = message.topic(), message.partition()
            if error is not None:
                if error.code() == _EOF:
                    end = gaps.end((topic, partition), message.offset())
                    if end is not None:  # (else a gap before it is read again)
                        at_end[(topic, partition)] = end
                elif error.fatal():
                    raise RuntimeError(f"reading {topic}/{partition}: {error}")
                elif time.monotonic() >= self._next_warning:  # librdkafka retries by itself
                    self._next_warning = time.monotonic() + 10.0
                    log.warning("join: reading %s/%s: %s (retrying)", topic, partition, error)
                continue
            if at_end:
                at_end.pop((topic, partition), None)
            if not gaps.admit(message):
                continue
            if topic == rewards:
                hold.reward(partition, message.timestamp()[1], message)
            else:
                if topic == decisions:
                    hold.decision(partition, message.timestamp()[1])
                out.append(message)
        if len(messages) < self.batch_max:
            self.drained_at = started
        out.extend(hold.release(lambda p: (decisions, p) in at_end))
        self._flow()
        return out

    def complete_at(self, topic: str, partition: int, position: int | None) -> int | None:
        """Wall ms up to which everything of the partition that reached the broker is read and
        handled (``position``: the next offset handled), or None while records are left
        (rewards waiting in the hold are left, though fetched to their end)."""
        end = self.at_end.get((topic, partition))
        if end is None or self.drained_at is None or (position is not None and position < end):
            return None  # (nothing handled: read from the earliest, so the end means read)
        if topic == self.rewards and self.hold.count(partition):
            return None
        contact = self.contact.get((topic, partition))
        if contact is None:
            return None
        return int(min(self.drained_at, contact) - self.fetch_wait_ms)

    def _stats(self, report: str) -> None:
        """librdkafka's statistics (every ``stats_interval_ms``, served by ``consume``): when
        each partition's leader last answered. An empty poll proves nothing while the broker
        is away (restarting, frozen, unreachable): records produced meanwhile wait in their
        producers, so a partition is read to its end only up to the last answer heard."""
        try:
            stats = json.loads(report)
        except ValueError:
            return
        now = _report_wall_ms(stats.get("ts"))
        contact = {}
        for broker in stats.get("brokers", {}).values():
            node, idle_us = broker.get("nodeid", -1), broker.get("rxidle", -1)
            if node < 0:
                continue
            toppars = [(t["topic"], t["partition"]) for t in broker.get("toppars", {}).values()]
            away = idle_us is None or idle_us < 0 or idle_us / 1000.0 > self.silence_ms
            if away:
                if node not in self._silent:  # away, or not connected (yet): since it was last heard
                    held = self._silent[node] = set()
                    for key in toppars or list(self.contact):
                        heard = self.contact.get(key)
                        if heard is not None:
                            self.silenced[key] = heard
                            held.add(key)
                    log.info("join: broker %d silent (%s); clocks of %s hold", node,
                             "not connected" if idle_us is None or idle_us < 0 else f"nothing received for {idle_us / 1e6:.1f}s",
                             sorted(held) or "no partition")  # fmt: skip
                if idle_us is None or idle_us < 0:
                    continue
            heard = now - idle_us / 1000.0
            before = self._last_heard.get(node)
            if not away and (node in self._silent or (before is not None and heard - before > self.silence_ms)):
                # heard again after a silence; or no report for longer than one (this thread did
                # not poll), which cannot tell a broker away from one that answered: count it
                # as away (only ever later clocks)
                if node not in self._silent:
                    for key in toppars:
                        self.silenced[key] = before
                # records its producers held meanwhile come now; the partitions it held when it
                # went away too, though a reconnect lists them again only a report or more later
                resumed = {*toppars, *self._silent.pop(node, ())}
                for key in resumed:
                    self.resumed[key] = heard
                log.info("join: broker %d heard again; %s resume", node, sorted(resumed) or "no partition")
            self._last_heard[node] = heard
            for key in toppars:
                contact[key] = heard
        self.contact = contact

    def outage(self, topic: str, partition: int) -> tuple[float, float | None] | None:
        """The partition's latest broker silence: ``(last heard before it, heard again at)``,
        the second None while it lasts; None if its broker was never silent once heard."""
        silenced = self.silenced.get((topic, partition))
        if silenced is None:
            return None
        resumed = self.resumed.get((topic, partition))
        return silenced, resumed if resumed is not None and resumed >= silenced else None

    def resumed_at(self, topic: str, partition: int) -> float | None:
        """Wall ms the partition's broker was last heard again after a silence (None: never
        silent since this reader started, or not known). The records its producers held
        while it was away reach it from then on, stamped with their earlier event times; a
        partition read to its end right after that moment is not yet quiet
        (:meth:`streams._join_state.PartitionState.advance`)."""
        return self.resumed.get((topic, partition))

    def highwater(self, topic: str, partition: int) -> int | None:
        """The partition's end offset as the last fetch response said (None if unknown)."""
        try:
            _, high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        except Exception:  # not assigned (any more)
            return None
        return high if high >= 0 else None

    def _flow(self) -> None:
        """Pause a partition's rewards while too many wait in the hold; resume below half."""
        hold = self.hold
        over = hold.over() - self._paused
        if over:
            self.consumer.pause(self._tps(over))
            self._paused |= over
        resume = {p for p in self._paused if hold.count(p) <= hold.max_held // 2 and (self.rewards, p) not in self.gaps.held}
        if resume:
            self.consumer.resume(self._tps(resume))
            self._paused -= resume

    def _tps(self, partitions: Iterable[int]) -> list[TopicPartition]:
        return [TopicPartition(self.rewards, p) for p in sorted(partitions)]

    def close(self) -> None:
        self.consumer.close()

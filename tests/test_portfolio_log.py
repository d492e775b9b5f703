"""The portfolio judge's tail of the updates topic, on the real broker: it reads up to the offsets
a snapshot learned to before judging, so which rows are judged does not depend on how fast it
read; offsets it cannot reach within its budget are reported, not waited on forever."""

from __future__ import annotations

import time
from pathlib import Path

from publisher.portfolio import PortfolioLog
from streams.topics import ensure_topics
from tests import learn_helpers as h


def test_the_tail_reads_up_to_a_snapshots_offsets_and_gives_up_on_offsets_not_in_the_log(kafka, topics, tmp_path: Path):
    ensure_topics(kafka, topics)
    updates = h.make_updates(400, seed=4)
    produced = h.produce(kafka, topics.updates, h.encode_updates(updates))
    ends = produced.ends()
    tail = PortfolioLog(h.worker_config(kafka, topics, tmp_path), ["route"], max_rows=10_000)
    try:
        assert tail.read_until(ends)
        assert all(tail.position[p] >= end for p, end in ends.items())
        rows = tail.take("route", {}, ends)
        assert sorted(u["event_id"] for u in rows) == sorted(u["event_id"] for u in updates if u["domain"] == "route")
        # a snapshot that learned only the first half of each partition is judged on exactly those rows
        half = {p: end // 2 for p, end in ends.items()}
        first = {u["event_id"] for u in tail.take("route", {}, half)}
        expected = {u["event_id"] for u, (p, offset) in zip(updates, produced.placed) if u["domain"] == "route" and offset < half[p]}
        assert first == expected and 0 < len(first) < len(rows)
        started = time.monotonic()
        assert not tail.read_until({p: end + 5 for p, end in ends.items()}, budget_s=1.0)
        assert time.monotonic() - started < 5.0
    finally:
        tail.close()

"""Prometheus metrics every worker serves: one registry per worker, no globals.

Names (all prefixed ``banditstream_``): records in per topic, joins by status, late
rewards, dead letters by reason, batch sizes, apply latency, posterior shards emitted and
consumer lag per partition. Consumer lag comes from librdkafka's statistics (the end offset
carried with fetch responses), never from a queried end offset, which some brokers get wrong.
"""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class WorkerMetrics:
    """The metric families of one worker process, in their own registry."""

    def __init__(self, worker: str):
        self.worker = worker
        self.registry = CollectorRegistry()
        r = self.registry
        self.records_in = Counter("banditstream_records_in", "Records read, per topic.", ["worker", "topic"], registry=r)
        self.joins = Counter("banditstream_joins", "Decisions joined, by status (rewarded, default).", ["status"], registry=r)
        self.late_rewards = Counter("banditstream_late_rewards", "Rewards that arrived after their window.", registry=r)
        self.duplicates = Counter("banditstream_duplicates", "Duplicate events ignored, by kind.", ["worker", "kind"], registry=r)
        self.output_retries = Counter(
            "banditstream_output_retries", "Batches sent again after a broker outage or a producer error.",
            ["worker", "output"], registry=r,
        )
        self.log_gaps = Counter(
            "banditstream_log_gaps", "Gaps in a partition's offsets: read again (reread), then taken as a hole in "
            "the log if still there (hole).", ["worker", "topic", "outcome"], registry=r,
        )  # fmt: skip
        self.join_spilled = Counter(
            "banditstream_join_spilled_entries", "Open join entries written to the changelog and RocksDB because more "
            "were open than join.entry_cache, per partition (each is read back when it changes or finishes).",
            ["partition"], registry=r,
        )  # fmt: skip
        self.dead_letters = Counter("banditstream_dead_letters", "Records dead-lettered, by reason.", ["worker", "reason"], registry=r)
        self.batch_size = Histogram(
            "banditstream_batch_size", "Records per applied batch.", ["worker"], registry=r,
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000),
        )  # fmt: skip
        self.apply_latency = Histogram(
            "banditstream_apply_latency_seconds", "Time to apply one batch (math + state write).", ["worker"], registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
        )  # fmt: skip
        self.shards_emitted = Counter("banditstream_posterior_shards_emitted", "PosteriorShard records produced.", registry=r)
        self.consumer_lag = Gauge("banditstream_consumer_lag", "Records behind the end, per partition.", ["topic", "partition"], registry=r)
        self.normalizer_observations = Gauge(
            "banditstream_join_normalizer_observations",
            "Decisions in a normalising domain's feature statistics as the join holds them, over its partitions "
            "(compare banditstream_publisher_normalizer_observations: what a snapshot would ship).",
            ["domain"], registry=r,
        )  # fmt: skip
        self.port: int | None = None
        self._server = None

    def serve(self, port: int = 0, addr: str = "127.0.0.1") -> int:
        """Serve /metrics over HTTP; port 0 picks a free one. Returns the port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        self.port = server.server_port
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def dead_letter(self, reason: str) -> None:
        self.dead_letters.labels(self.worker, reason).inc()

    def on_stats(self, stats_json: str) -> None:
        """librdkafka ``stats_cb``: per-partition consumer lag from fetch responses."""
        stats = json.loads(stats_json)
        for topic, tstats in stats.get("topics", {}).items():
            for partition, pstats in tstats.get("partitions", {}).items():
                lag = pstats.get("consumer_lag", -1)
                if partition != "-1" and lag >= 0:
                    self.consumer_lag.labels(topic, partition).set(lag)

"""Prometheus collectors of the updater (prefix ``embedgate_updater_``), on their own registry.

===============================================  =========  =================================================
metric                                           type       labels / meaning
===============================================  =========  =================================================
``embedgate_updater_consumer_lag``               gauge      topic, partition: end offset - committable offset
``embedgate_updater_rows_applied_total``         counter    model, table, op: rows acknowledged by every replica
``embedgate_updater_apply_latency_seconds``      histogram  model: one group written to all replicas
``embedgate_updater_freshness_seconds``          histogram  model: producer timestamp -> applied on all replicas
``embedgate_updater_dead_letters_total``         counter    reason: messages sent to the dead-letter topic
``embedgate_updater_poison_messages_total``      counter    error: messages whose decoding raised something else
                                                            than a DeltaError (e.g. RecursionError, MemoryError);
                                                            dead-lettered with reason ``decoder_error``
``embedgate_updater_misplaced_messages_total``   counter    model: versioned messages applied from a partition other
                                                            than their shard's (``s % P``)
``embedgate_updater_apply_failures_total``       counter    model, shard, retriable: failed group writes
``embedgate_updater_paused_partitions``          gauge      partitions paused while a shard is down
``embedgate_updater_messages_total``             counter    kind (delta, hps, beacon, invalid)
``embedgate_updater_commits_total``              counter    offset commits after acknowledged writes
``embedgate_updater_replica_catchups_total``     counter    model, shard: replicas found behind and replayed; one
                                                            per finding (by the live loop, or by a running replay
                                                            that starts over: each restart noticed counts once),
                                                            not per extension of a replay
===============================================  =========  =================================================

Rows per second = ``rate(embedgate_updater_rows_applied_total[1m])``.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["UpdaterMetrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_FRESHNESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


class UpdaterMetrics:
    """The collectors, registered on ``registry`` (a fresh one by default, so several updaters can share a process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        p = "embedgate_updater_"
        self.lag = Gauge(
            p + "consumer_lag",
            "End offset minus the offset this member would commit now",
            ["topic", "partition"],
            registry=r,
        )
        self.rows_applied = Counter(
            p + "rows_applied", "Rows acknowledged by every replica", ["model", "table", "op"], registry=r
        )
        self.apply_latency = Histogram(
            p + "apply_latency_seconds",
            "Write of one group to all replicas",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.freshness = Histogram(
            p + "freshness_seconds",
            "Producer timestamp to applied on all replicas",
            ["model"],
            buckets=_FRESHNESS_BUCKETS,
            registry=r,
        )
        self.dead_letters = Counter(
            p + "dead_letters", "Messages sent to the dead-letter topic", ["reason"], registry=r
        )
        self.poison = Counter(
            p + "poison_messages",
            "Messages whose decoding raised an unexpected exception (dead-lettered as decoder_error), by its class",
            ["error"],
            registry=r,
        )
        self.misplaced = Counter(
            p + "misplaced_messages",
            "Versioned messages applied from a partition other than their shard's (s % partitions)",
            ["model"],
            registry=r,
        )
        self.catchups = Counter(
            p + "replica_catchups",
            "Replays of a PS replica alone started because it was found behind its acknowledged position (restarted,"
            " new version): by the live loop, or by its running replay starting over",
            ["model", "shard"],
            registry=r,
        )
        self.apply_failures = Counter(
            p + "apply_failures", "Failed group writes", ["model", "shard", "retriable"], registry=r
        )
        self.paused_partitions = Gauge(
            p + "paused_partitions", "Partitions paused while a shard is down", registry=r
        )
        self.messages = Counter(p + "messages", "Kafka messages consumed", ["kind"], registry=r)
        self.commits = Counter(p + "commits", "Offset commits", registry=r)
        self._server: Any = None

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics on ``host:port`` in a daemon thread; returns the bound port (0 = pick one)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

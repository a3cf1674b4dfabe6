"""Trainer-side metrics: what a :class:`~embedgate.train.RowPublisher` sent and how long it held the trainer.

One :class:`TrainerMetrics` per publisher, in its own Prometheus registry (several trainers in one process do not
collide). :meth:`TrainerMetrics.serve` starts an HTTP endpoint (``/metrics``) for it; ``StreamRows(metrics_port=...)``
does so (off by default). Rows/s and bytes/s are ``rate()`` of the counters.

======================================================  =========  ======================================================
metric                                                  type       meaning
======================================================  =========  ======================================================
``embedgate_trainer_rows_total{table}``                 counter    rows (or deletes) acknowledged by Kafka
``embedgate_trainer_bytes_total{table}``                counter    row payload bytes acknowledged (8 per id + 4 per float)
``embedgate_trainer_messages_total``                    counter    Kafka messages acknowledged
``embedgate_trainer_blocked_seconds_total``             counter    time publish/delete blocked the trainer (buffer full)
``embedgate_trainer_publish_lag_seconds``               histogram  publish call -> every message of it acknowledged
``embedgate_trainer_pending_rows``                      gauge      rows copied into the buffer, not yet acknowledged
``embedgate_trainer_retries_total``                     counter    sends retried after a retriable Kafka error
``embedgate_trainer_publish_failures_total``            counter    calls that failed for good (the publisher FAILED)
``embedgate_trainer_entry_refreshes_total``             counter    entry versions written by ``StreamRows``
======================================================  =========  ======================================================
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["TrainerMetrics"]

_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class TrainerMetrics:
    """The collectors of one publisher, in ``registry`` (default: a new one). Thread-safe (prometheus_client)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.rows = Counter(
            "embedgate_trainer_rows_total", "rows acknowledged by Kafka", ["table"], registry=r
        )
        self.bytes = Counter("embedgate_trainer_bytes_total", "row bytes acknowledged", ["table"], registry=r)
        self.messages = Counter("embedgate_trainer_messages_total", "Kafka messages acknowledged", registry=r)
        self.blocked = Counter(
            "embedgate_trainer_blocked_seconds_total", "time publish blocked the trainer", registry=r
        )
        self.lag = Histogram(
            "embedgate_trainer_publish_lag_seconds",
            "publish call to acknowledgement",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.pending = Gauge("embedgate_trainer_pending_rows", "rows not yet acknowledged", registry=r)
        self.retries = Counter("embedgate_trainer_retries_total", "sends retried", registry=r)
        self.failures = Counter(
            "embedgate_trainer_publish_failures_total", "calls failed for good", registry=r
        )
        self.entry_refreshes = Counter(
            "embedgate_trainer_entry_refreshes_total", "entry versions written", registry=r
        )
        self._server: Any = None

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port) from a daemon thread; returns the port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def close(self) -> None:
        """Stop the endpoint, if started."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

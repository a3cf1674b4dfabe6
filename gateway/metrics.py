"""Prometheus collectors of one app (own registry, so several apps can live in one test process).

Names follow Prometheus practice: ``embedgate_`` prefix, seconds, ``_total`` counters; label values are bounded
(configured model names, API names, status code names, configured targets). Probes and /metrics are not counted.

Several workers (``workers > 1``): ``embedgate gateway`` sets ``PROMETHEUS_MULTIPROC_DIR`` before the workers start,
so prometheus_client keeps every value in per-process files there, and :meth:`Metrics.render` answers with the
aggregate of all workers (counters and histograms summed, ``embedgate_requests_in_flight`` summed over live workers,
``embedgate_worker_requests`` one series per worker with a ``pid`` label).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

__all__ = ["MULTIPROC_ENV", "Metrics"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        # called before every render: counts kept elsewhere (the native gRPC gate's refusals) added to these metrics
        self.collect_hooks: list[Callable[[], None]] = []
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "embedgate_requests",
            "REST requests by model, version, API and outcome (OK or the error code name)",
            ["model", "version", "api", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "embedgate_request_duration_seconds",
            "REST request latency in seconds",
            ["model", "api"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.backend_latency = Histogram(
            "embedgate_backend_call_duration_seconds",
            "gRPC backend call latency in seconds",
            ["target", "method"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.backend_errors = Counter(
            "embedgate_backend_errors",
            "gRPC backend calls that failed, by status code",
            ["target", "method", "code"],
            registry=r,
        )
        self.in_flight = Gauge(
            "embedgate_requests_in_flight",
            "REST requests being processed",
            registry=r,
            multiprocess_mode="livesum",
        )

        self.rejected = Counter(
            "embedgate_requests_rejected",
            "REST requests refused because max_in_flight or limits.max_buffered_bytes was reached",
            registry=r,
        )
        self.grpc_request_bytes = Counter(
            "embedgate_grpc_request_bytes",
            "bytes of gRPC request messages read (a call refused before its message is read adds nothing)",
            registry=r,
        )
        self.admission_shed = Counter(
            "embedgate_admission_shed",
            "requests (REST and gRPC) refused by admission control, by reason: queue_full (at the limit with the "
            "wait queue full or off), queue_timeout (waited admission.queue_timeout_s), loop_lag (the event loop "
            "ran admission.max_loop_lag_s late), receiving (gRPC: max_in_flight messages being read at once)",
            ["reason"],
            registry=r,
        )
        self.native_fallbacks = Counter(
            "embedgate_native_fallbacks",
            "requests of embedding models whose features the native reader left to the Python reference, by step "
            "(rest_features, grpc_features): a malformed request (the reference words the error) or a form the "
            "native reader does not take",
            ["step"],
            registry=r,
        )
        self.coalesced = Histogram(
            "embedgate_coalesced_requests",
            "requests served by each entry call of an embedding model, by what sent the call (coalescing)",
            ["model", "trigger"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.admission_wait = Histogram(
            "embedgate_admission_queue_wait_seconds",
            "time requests that found no free slot spent in the admission queue (admitted or shed)",
            buckets=_BUCKETS,
            registry=r,
        )
        self.admission_limit = Gauge(
            "embedgate_admission_limit",
            "current concurrency limit of admission control (adaptive, at most max_in_flight)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.admission_loop_lag = Gauge(
            "embedgate_admission_loop_lag_seconds",
            "how late the event loop ran admission's 20 ms timer, last measurement",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.admission_min_rtt = Gauge(
            "embedgate_admission_min_rtt_seconds",
            "last measured minimum round trip of an admitted request (the adaptive limit's baseline)",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.client_disconnects = Counter(
            "embedgate_client_disconnects",
            "REST requests whose client disconnected before its body was read (outcome CANCELLED, not an error)",
            registry=r,
        )

        self.manifest_reloads = Counter(
            "embedgate_manifest_reloads",
            "manifest.json re-reads of embedding models by outcome (ok, or error: the file was ignored)",
            ["model", "outcome"],
            registry=r,
        )
        self.degraded = Counter(
            "embedgate_degraded_responses",
            "answers marked degraded (X-Embedgate-Degraded), by model and reason",
            ["model", "reason"],
            registry=r,
        )

        self.replicas_catching_up = Gauge(
            "embedgate_replicas_catching_up",
            "PS replicas whose stream position is behind another's (read last), by model and shard",
            ["model", "shard"],
            registry=r,
            multiprocess_mode="livemax",
        )

    def observe_catching_up(self, model: str, shard: int, replicas: int) -> None:
        self.replicas_catching_up.labels(model, str(shard)).set(replicas)

    def observe_manifest_reload(self, model: str, outcome: str) -> None:
        self.manifest_reloads.labels(model, outcome).inc()

    def native_fallback(self, step: str) -> None:
        """A request's features left to the Python reference by the native reader of ``step`` (``gateway.native``)."""
        self.native_fallbacks.labels(step).inc()

    def count_gate_refusals(self, counts: Iterable[tuple[str, int]], code: str) -> None:
        """Refusals a native gate answered (``(admission shed reason, how many)``), counted as the gateway's own
        refusals are: shed by reason, rejected, and requests of model ``_other``, api ``other``, outcome ``code``."""
        for reason, n in counts:
            if n:
                self.admission_shed.labels(reason).inc(n)
                self.rejected.inc(n)
                self.requests.labels("_other", "", "other", code).inc(n)

    def observe_backend(self, target: str, method: str, seconds: float, code: str) -> None:
        self.backend_latency.labels(target, method).observe(seconds)
        if code != "OK":
            self.backend_errors.labels(target, method, code).inc()

    def render(self) -> bytes:
        """The text exposition: this app's registry, or every worker's values when running several workers."""
        for hook in list(self.collect_hooks):
            hook()
        directory = os.environ.get(MULTIPROC_ENV)
        if directory:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]  # untyped upstream
            registry.register(_WorkerRequests(directory))
            return generate_latest(registry)
        return generate_latest(self.registry)


class _WorkerRequests(Collector):
    """``embedgate_worker_requests{pid}``: ``embedgate_requests_total`` of each worker process (the balance between
    workers), read from that worker's own counter file in the multiprocess directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "embedgate_worker_requests",
            "REST requests answered by each worker process (workers > 1 only)",
            labels=["pid"],
        )
        for path in sorted(glob.glob(os.path.join(self.directory, "counter_*.db"))):
            pid = os.path.basename(path)[len("counter_") : -len(".db")]
            total = 0.0
            for metric in MultiProcessCollector.merge([path], accumulate=False):  # type: ignore[no-untyped-call]
                if metric.name == "embedgate_requests":
                    total += sum(x.value for x in metric.samples if x.name == "embedgate_requests_total")
            family.add_metric([pid], total)
        yield family

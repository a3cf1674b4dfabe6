"""Streaming update path: Kafka → ``embedgate updater`` → PS throughput and freshness, vs direct gRPC upserts.

    .venv/bin/python -m benchmarks.updater_bench [--rows 200000] [--dim 64] [--shards 2] [--repeat 3]

Setup, all on 127.0.0.1 with free ports and bounded start-up waits: a real Kafka broker (``KafkaBroker`` in a temp
dir), a PS-only model with one empty table ``t`` (``--dim``, ``--shards`` shards, written by the exporter's
``write_ps_shard`` in a subprocess) served by ``serve-local`` (one process, one replica per shard), and
``embedgate updater --config <yaml>`` as a subprocess with default batching (metrics on a free port).

1. **baseline**: ``--rows`` rows written straight to the PS with gRPC Predict ``upsert_t`` calls of
   ``max_rows_per_call`` (16384, the updater's default) rows, shards concurrently, calls of one shard one after
   another (what the updater's writer does; no Kafka, the updater idles meanwhile).
2. **updater throughput**: as many rows published with ``DeltaPublisher`` in calls of ``--publish-rows`` rows; time
   from the first publish until ``embedgate_updater_rows_applied_total`` counted every row (rows acknowledged by
   every replica), then checked with the PS ``row_count`` signature.
   **drain**: the same again while the updater is stopped (SIGSTOP to its pid), then continued (SIGCONT); time
   from SIGCONT until every row is applied: the updater's own rate on a backlog, without waiting for the publisher.
   Baseline, throughput and drain alternate for ``--repeat`` rounds, always on fresh ids (every row an insert);
   the median round of each is printed with the range, and the ratios to the baseline's median.
3. **freshness**: ``--fresh-rate`` single-row updates per second for ``--fresh-seconds``; each is timed from the
   ``publish`` call to the row being visible through the PS ``lookup`` signature (polled every 5 ms). The
   updater's own ``embedgate_updater_freshness_seconds`` histogram (producer timestamp → applied) over the same
   updates is printed as bucket bounds.

Every loop is bounded in count and time (``--timeout`` per phase); the updater, serve-local and the broker are
stopped (by pid) on every exit path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["main"]

_REPO = Path(__file__).resolve().parent.parent
_PREDICT = "/tensorflow.serving.PredictionService/Predict"
_MODEL = "bench"
_TABLE = "t"
_ROWS_PER_CALL = (
    16384  # UpdaterSettings.batch.max_rows_per_call default, used by the updater and the baseline
)
_START_TIMEOUT_S = 90.0
_POLL_S = 0.02
_MAX_ROWS = 2_000_000


def _python() -> str:
    venv = _REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _build_ps(root: Path, dim: int, shards: int) -> Any:
    """``root/bench/manifest.json`` + ``ps_<i>/1/`` with one empty table ``t`` of ``dim``; TF only in a child."""
    from schemas.manifest import Manifest

    manifest = Manifest.model_validate(
        {
            "model_name": _MODEL,
            "version": 1,
            "tables": [{"name": _TABLE, "dim": dim}],
            "sparse_features": [{"name": "f", "table": _TABLE}],
            "partition": {"num_shards": shards},
            "entry": {"outputs": [{"name": "p", "shape": [1]}]},
        }
    )
    model_dir = root / _MODEL
    model_dir.mkdir(parents=True)
    (model_dir / "manifest.json").write_text(manifest.dumps())
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from embedgate.export.ps import write_ps_shard
        from schemas.manifest import Manifest
        m = Manifest.load({str(model_dir)!r})
        for s in range(m.num_shards):
            write_ps_shard(Path({str(model_dir)!r}) / f"ps_{{s}}" / "1", m.tables, {{}})
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    subprocess.run(
        [_python(), "-c", script], check=True, capture_output=True, env=env, cwd=_REPO, timeout=300
    )
    return manifest


# -- the updater subprocess -----------------------------------------------------------------------------------
@dataclass
class _UpdaterProc:
    proc: subprocess.Popen[bytes]
    log_path: Path
    metrics_url: str

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "<no log>"

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"embedgate updater exited with {self.proc.returncode}; log tail:\n{self.log_tail()}"
            )


@contextlib.contextmanager
def _run_updater(config: Path, log_path: Path, metrics_port: int) -> Iterator[_UpdaterProc]:
    cmd = [_python(), "-m", "embedgate", "updater", "--config", str(config)]
    # only the YAML counts: EMBEDGATE_* variables of the caller's shell would override it
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDGATE_")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=_REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
    upd = _UpdaterProc(proc, log_path, f"http://127.0.0.1:{metrics_port}/metrics")
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            upd.check_alive()
            with contextlib.suppress(OSError):
                _scrape(upd.metrics_url)
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"updater /metrics not up within {_START_TIMEOUT_S:.0f} s")
            time.sleep(0.1)
        yield upd
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=2) as resp:  # 127.0.0.1 only
        text = resp.read().decode()
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def _rows_applied(url: str) -> float:
    return sum(
        v
        for name, labels, v in _scrape(url)
        if name == "embedgate_updater_rows_applied_total" and labels.get("op") == "upsert"
    )


def _freshness_buckets(url: str) -> dict[float, float]:
    return {
        float(labels["le"]): v
        for name, labels, v in _scrape(url)
        if name == "embedgate_updater_freshness_seconds_bucket"
    }


def _bucket_quantile(buckets: dict[float, float], q: float) -> float:
    """Upper bound of the bucket holding quantile ``q`` of a cumulative histogram (inf if in the last bucket)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    for b in bounds:
        if buckets[b] >= q * total:
            return b
    return float("inf")


# -- PS gRPC helpers --------------------------------------------------------------------------------------------
class _Ps:
    def __init__(self, target: str, manifest: Any) -> None:
        import grpc.aio

        from schemas.proto import tfs_pb2

        self.manifest = manifest
        self._pb = tfs_pb2
        self._channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ],
        )
        self.predict = self._channel.unary_unary(
            _PREDICT,
            request_serializer=tfs_pb2.PredictRequest.SerializeToString,
            response_deserializer=tfs_pb2.PredictResponse.FromString,
        )

    def request(self, shard: int, signature: str) -> Any:
        from schemas.manifest import ps_model_name

        return self._pb.PredictRequest(
            model_spec=self._pb.ModelSpec(name=ps_model_name(_MODEL, shard), signature_name=signature)
        )

    async def row_count(self) -> int:
        from schemas.manifest import row_count_output

        total = 0
        for s in range(self.manifest.num_shards):
            resp = await self.predict(self.request(s, "row_count"), timeout=10)
            out = resp.outputs[row_count_output(_TABLE)]
            total += int(out.int64_val[0]) if out.int64_val else int.from_bytes(out.tensor_content, "little")
        return total

    async def lookup_first(self, shard: int, row_id: int) -> float:
        import numpy as np

        from schemas.manifest import lookup_ids_input, lookup_values_output
        from schemas.tensors import from_ndarray

        req = self.request(shard, "lookup")
        req.inputs[lookup_ids_input(_TABLE)].CopyFrom(from_ndarray(np.asarray([row_id], dtype=np.int64)))
        resp = await self.predict(req, timeout=5)
        out = resp.outputs[lookup_values_output(_TABLE)]
        if out.tensor_content:
            return float(np.frombuffer(out.tensor_content[:4], dtype="<f4")[0])
        return float(out.float_val[0])

    async def close(self) -> None:
        await self._channel.close()


# -- phases -----------------------------------------------------------------------------------------------------
async def _baseline(ps: _Ps, ids: Any, values: Any, timeout_s: float) -> dict[str, float]:
    """Direct ``upsert_t`` Predict calls of ``_ROWS_PER_CALL`` rows; shards concurrently, as the updater writes."""
    import numpy as np

    from schemas.manifest import upsert_signature
    from schemas.partition import shard_for
    from schemas.tensors import from_ndarray

    now_ms = int(time.time() * 1000)
    n_shards = ps.manifest.num_shards
    before = await ps.row_count()
    t0 = time.perf_counter()
    shards = shard_for(ids, n_shards)

    async def write_shard(s: int) -> int:
        s_ids, s_vals = ids[shards == s], values[shards == s]
        calls = 0
        for start in range(0, len(s_ids), _ROWS_PER_CALL):
            req = ps.request(s, upsert_signature(_TABLE))
            chunk = s_ids[start : start + _ROWS_PER_CALL]
            req.inputs["ids"].CopyFrom(from_ndarray(chunk))
            req.inputs["values"].CopyFrom(from_ndarray(s_vals[start : start + _ROWS_PER_CALL]))
            # the same version inputs the updater sends (newest wins per row); no stream position
            req.inputs["timestamps_ms"].CopyFrom(from_ndarray(np.full(len(chunk), now_ms, np.int64)))
            req.inputs["seqs"].CopyFrom(from_ndarray(np.zeros(len(chunk), np.int64)))
            req.inputs["stream_partitions"].CopyFrom(from_ndarray(np.array([], dtype=object)))
            req.inputs["stream_offsets"].CopyFrom(from_ndarray(np.zeros(0, np.int64)))
            req.inputs["stream_expected"].CopyFrom(from_ndarray(np.zeros(0, np.int64)))
            await ps.predict(req, timeout=30)
            calls += 1
        return calls

    calls = await asyncio.wait_for(
        asyncio.gather(*(write_shard(s) for s in range(n_shards))), timeout=timeout_s
    )
    seconds = time.perf_counter() - t0
    added = await ps.row_count() - before
    if added != len(ids):
        raise RuntimeError(f"baseline: PS row_count grew by {added}, expected {len(ids)}")
    return {"seconds": seconds, "rows_per_s": len(ids) / seconds, "calls": float(sum(calls))}


async def _wait_applied(upd: _UpdaterProc, target: float, timeout_s: float) -> float:
    """Poll the rows-applied counter until it reaches ``target``; returns the perf_counter time it was seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        applied = await asyncio.to_thread(_rows_applied, upd.metrics_url)
        if applied >= target:
            return time.perf_counter()
        upd.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"updater applied {applied:.0f} of {target:.0f} rows within {timeout_s:.0f} s; "
                f"log tail:\n{upd.log_tail()}"
            )
        await asyncio.sleep(_POLL_S)


async def _throughput(
    pub: Any, ps: _Ps, upd: _UpdaterProc, ids: Any, values: Any, publish_rows: int, timeout_s: float
) -> dict[str, float]:
    before_rows = await ps.row_count()
    base = await asyncio.to_thread(_rows_applied, upd.metrics_url)
    messages = 0
    t0 = time.perf_counter()
    for start in range(0, len(ids), publish_rows):
        res = await pub.publish(
            ps.manifest, _TABLE, ids[start : start + publish_rows], values[start : start + publish_rows]
        )
        messages += res.messages
    t_pub = time.perf_counter()
    t_done = await _wait_applied(upd, base + len(ids), timeout_s)
    added = await ps.row_count() - before_rows
    if added != len(ids):
        raise RuntimeError(f"updater: PS row_count grew by {added}, expected {len(ids)}")
    seconds = t_done - t0
    return {
        "seconds": seconds,
        "rows_per_s": len(ids) / seconds,
        "publish_seconds": t_pub - t0,
        "publish_rows_per_s": len(ids) / (t_pub - t0),
        "after_last_publish_s": t_done - t_pub,
        "messages": float(messages),
    }


async def _drain(
    pub: Any, ps: _Ps, upd: _UpdaterProc, ids: Any, values: Any, publish_rows: int, timeout_s: float
) -> dict[str, float]:
    """Backlog drain: the updater is stopped (SIGSTOP to its pid) while the rows are published, then continued;
    time from SIGCONT until every row is applied. Publishing must take well under the group session timeout."""
    before_rows = await ps.row_count()
    base = await asyncio.to_thread(_rows_applied, upd.metrics_url)
    os.kill(upd.proc.pid, signal.SIGSTOP)
    try:
        t_pub = time.perf_counter()
        for start in range(0, len(ids), publish_rows):
            await pub.publish(
                ps.manifest, _TABLE, ids[start : start + publish_rows], values[start : start + publish_rows]
            )
        if time.perf_counter() - t_pub > 5.0:
            print("warning: publishing the backlog took > 5 s; the drain may include a group rejoin")
    finally:
        os.kill(upd.proc.pid, signal.SIGCONT)
    t0 = time.perf_counter()
    t_done = await _wait_applied(upd, base + len(ids), timeout_s)
    added = await ps.row_count() - before_rows
    if added != len(ids):
        raise RuntimeError(f"drain: PS row_count grew by {added}, expected {len(ids)}")
    return {"seconds": t_done - t0, "rows_per_s": len(ids) / (t_done - t0)}


async def _freshness(
    pub: Any, ps: _Ps, upd: _UpdaterProc, first_id: int, rate: float, seconds: float, timeout_s: float
) -> dict[str, Any]:
    import numpy as np

    from schemas.partition import shard_for

    dim = ps.manifest.table(_TABLE).dim
    count = max(1, int(rate * seconds))
    ids = np.arange(first_id, first_id + count, dtype=np.int64)
    shards = shard_for(ids, ps.manifest.num_shards)
    hist_before = await asyncio.to_thread(_freshness_buckets, upd.metrics_url)
    base = await asyncio.to_thread(_rows_applied, upd.metrics_url)

    async def one(i: int, start_at: float) -> float:
        await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        value = float(i + 1)
        row = np.full((1, dim), value, dtype=np.float32)
        t0 = time.perf_counter()
        await pub.publish(ps.manifest, _TABLE, ids[i : i + 1], row)
        deadline = time.monotonic() + timeout_s
        while await ps.lookup_first(int(shards[i]), int(ids[i])) != value:
            if time.monotonic() > deadline:
                raise RuntimeError(f"freshness: id {ids[i]} not visible within {timeout_s:.0f} s")
            await asyncio.sleep(0.005)
        return time.perf_counter() - t0

    start = time.perf_counter() + 0.05
    lat = sorted(await asyncio.gather(*(one(i, start + i / rate) for i in range(count))))
    await _wait_applied(upd, base + count, timeout_s)  # the histogram is observed right after the counter
    hist_after = await asyncio.to_thread(_freshness_buckets, upd.metrics_url)
    hist = {b: hist_after[b] - hist_before.get(b, 0.0) for b in hist_after}
    return {
        "updates": count,
        "p50_s": statistics.median(lat),
        "p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
        "max_s": lat[-1],
        "hist_p50_le": _bucket_quantile(hist, 0.5),
        "hist_p95_le": _bucket_quantile(hist, 0.95),
        "hist_count": hist[max(hist)],
    }


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median rate (the lower middle one for an even count), plus the min and max rates."""
    ordered = sorted(runs, key=lambda r: r["rows_per_s"])
    mid = dict(ordered[(len(ordered) - 1) // 2])
    mid["min_rows_per_s"], mid["max_rows_per_s"] = ordered[0]["rows_per_s"], ordered[-1]["rows_per_s"]
    return mid


async def _measure(
    args: argparse.Namespace, bootstrap: str, ps_target: str, manifest: Any, upd_factory: Any
) -> dict[str, Any]:
    import numpy as np

    from updater.producer import DeltaPublisher

    rng = np.random.default_rng(0)
    n = args.rows
    values = rng.standard_normal((n, args.dim), dtype=np.float32)
    ps = _Ps(ps_target, manifest)
    baselines: list[dict[str, float]] = []
    updaters: list[dict[str, float]] = []
    drains: list[dict[str, float]] = []
    try:
        with upd_factory() as upd:
            async with DeltaPublisher(bootstrap) as pub:
                # warm-up: topic creation, group join, channels; bounded like everything else
                warm = np.arange(1000, dtype=np.int64)
                before = await asyncio.to_thread(_rows_applied, upd.metrics_url)
                t_warm = time.perf_counter()
                await pub.publish(manifest, _TABLE, warm, values[: len(warm)])
                await _wait_applied(upd, before + len(warm), _START_TIMEOUT_S)
                warm_s = time.perf_counter() - t_warm
                # interleaved rounds on fresh ids (every row an insert); the updater idles during the baseline
                for r in range(args.repeat):
                    first = 10_000_000 * (r + 1)
                    base_ids = np.arange(first, first + n, dtype=np.int64)
                    upd_ids = base_ids + 3_000_000
                    drain_ids = base_ids + 6_000_000
                    baselines.append(await _baseline(ps, base_ids, values, args.timeout))
                    updaters.append(
                        await _throughput(pub, ps, upd, upd_ids, values, args.publish_rows, args.timeout)
                    )
                    drains.append(
                        await _drain(pub, ps, upd, drain_ids, values, args.publish_rows, args.timeout)
                    )
                fresh = await _freshness(
                    pub, ps, upd, 1_000_000, args.fresh_rate, args.fresh_seconds, args.timeout
                )
    finally:
        await ps.close()
    return {
        "baseline": _median_run(baselines),
        "updater": _median_run(updaters),
        "drain": _median_run(drains),
        "freshness": fresh,
        "warmup_s": warm_s,
    }


def _report(args: argparse.Namespace, r: dict[str, Any], setup_s: float) -> None:
    b, u, d, f = r["baseline"], r["updater"], r["drain"], r["freshness"]
    cmd = (
        f"python -m benchmarks.updater_bench --rows {args.rows} --dim {args.dim} --shards {args.shards}"
        f" --publish-rows {args.publish_rows} --fresh-rate {args.fresh_rate:g}"
        f" --fresh-seconds {args.fresh_seconds:g} --repeat {args.repeat}"
    )
    load = os.getloadavg()[0]
    print(f"command: {cmd}")
    print(
        f"cpus: {os.cpu_count()}  load(1m): {load:.2f}  rows: {args.rows}  dim: {args.dim}  "
        f"shards: {args.shards} (1 replica each)  rows/call: {_ROWS_PER_CALL}"
    )
    print(f"setup (broker + PS build + serve-local): {setup_s:.1f} s; updater warm-up {r['warmup_s']:.2f} s")
    rows = [
        ("baseline: direct gRPC upsert", f"{b['seconds']:.2f} s", f"{b['rows_per_s']:,.0f} rows/s", ""),
        (
            "updater: publish -> all applied",
            f"{u['seconds']:.2f} s",
            f"{u['rows_per_s']:,.0f} rows/s",
            f"{u['rows_per_s'] / b['rows_per_s']:.2f}x baseline",
        ),
        (
            "  publish only (DeltaPublisher)",
            f"{u['publish_seconds']:.2f} s",
            f"{u['publish_rows_per_s']:,.0f} rows/s",
            f"{int(u['messages'])} messages",
        ),
        ("  last publish -> all applied", f"{u['after_last_publish_s']:.2f} s", "", ""),
        (
            "updater: drain of a backlog",
            f"{d['seconds']:.2f} s",
            f"{d['rows_per_s']:,.0f} rows/s",
            f"{d['rows_per_s'] / b['rows_per_s']:.2f}x baseline",
        ),
    ]
    print()
    print(
        f"throughput: median of {args.repeat} interleaved rounds of {args.rows} rows (rates min..max below)"
    )
    print(f"{'':<34} {'time':>9} {'rate':>18}  ratio")
    for label, t, rate, ratio in rows:
        print(f"{label:<34} {t:>9} {rate:>18}  {ratio}")
    for label, run in (("baseline", b), ("updater", u), ("drain", d)):
        print(f"  {label} range: {run['min_rows_per_s']:,.0f} .. {run['max_rows_per_s']:,.0f} rows/s")
    print()
    print(
        f"freshness ({int(f['updates'])} single-row updates at {args.fresh_rate:g}/s): publish call -> visible via "
        f"PS lookup p50 {f['p50_s'] * 1000:.0f} ms, p95 {f['p95_s'] * 1000:.0f} ms, max {f['max_s'] * 1000:.0f} ms"
    )
    print(
        f"updater freshness histogram ({int(f['hist_count'])} obs, producer timestamp -> applied): "
        f"p50 <= {f['hist_p50_le']:g} s, p95 <= {f['hist_p95_le']:g} s (bucket bounds)"
    )
    summary = {
        "baseline_rows_per_s": round(b["rows_per_s"]),
        "updater_rows_per_s": round(u["rows_per_s"]),
        "ratio": round(u["rows_per_s"] / b["rows_per_s"], 2),
        "drain_rows_per_s": round(d["rows_per_s"]),
        "drain_ratio": round(d["rows_per_s"] / b["rows_per_s"], 2),
        "freshness_ms": {k: round(f[f"{k}_s"] * 1000, 1) for k in ("p50", "p95", "max")},
    }
    print()
    print("summary: " + json.dumps(summary))


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rows", type=int, default=200_000, help=f"rows per throughput run (capped at {_MAX_ROWS})"
    )
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--publish-rows", type=int, default=10_000, help="rows per DeltaPublisher.publish call")
    ap.add_argument("--fresh-rate", type=float, default=20.0, help="single-row updates per second")
    ap.add_argument("--fresh-seconds", type=float, default=5.0, help="duration of the freshness run (max 30)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved baseline/updater rounds (max 10)")
    ap.add_argument("--timeout", type=float, default=120.0, help="limit of each measured phase, seconds")
    args = ap.parse_args(argv)
    if args.rows < 1 or args.dim < 1 or args.shards < 1 or args.publish_rows < 1 or args.fresh_rate <= 0:
        ap.error("--rows, --dim, --shards, --publish-rows and --fresh-rate must be positive")
    args.rows = min(args.rows, _MAX_ROWS)
    args.repeat = min(max(args.repeat, 1), 10)
    args.fresh_seconds = min(max(args.fresh_seconds, 0.1), 30.0)
    args.fresh_rate = min(args.fresh_rate, 200.0)

    signal.signal(signal.SIGTERM, _interrupt)  # run the finally blocks that stop updater, PS and broker
    # the idempotent producer retries NotLeaderForPartition while the topic's leader is elected: not news here
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    import yaml

    from embedgate.devkafka import KafkaBroker
    from schemas.manifest import ps_dir_name, ps_model_name
    from tests.support.ports import free_port
    from tests.support.servers import serve_local

    t_setup = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="updater-bench-") as tmp_s:
        tmp = Path(tmp_s)
        manifest = _build_ps(tmp / "models", args.dim, args.shards)
        model_dir = tmp / "models" / _MODEL
        served = {ps_model_name(_MODEL, i): model_dir / ps_dir_name(i) for i in range(args.shards)}
        with KafkaBroker(tmp / "kafka") as broker, serve_local(served) as ps_server:
            setup_s = time.perf_counter() - t_setup
            metrics_port = free_port()
            config = tmp / "updater.yaml"
            config.write_text(
                yaml.safe_dump(
                    {
                        "models": [
                            {
                                "kind": "embedding",
                                "name": _MODEL,
                                "manifest": str(model_dir),
                                "entry": ps_server.target,
                                "shards": [{"replicas": [ps_server.target]}] * args.shards,
                            }
                        ],
                        "bootstrap_servers": broker.bootstrap,
                        "hps_topic_pattern": None,
                        "group_id": "updater-bench",
                        "metrics_port": metrics_port,
                    }
                )
            )

            def upd_factory() -> contextlib.AbstractContextManager[_UpdaterProc]:
                return _run_updater(config, tmp / "updater.log", metrics_port)

            results = asyncio.run(_measure(args, broker.bootstrap, ps_server.target, manifest, upd_factory))
    _report(args, results, setup_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())

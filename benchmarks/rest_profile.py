"""Where a live cached gateway's CPU goes on the REST embedding path (issue 17): py-spy samples by stage.

The small demo model with a warm hot-row cache (as ``benchmarks.gateway_perf_profile``), one vegeta client POSTing
the instances at each batch. While it runs, ``py-spy record`` samples the gateway and its parse worker processes
(``--subprocesses``; idle threads left out); the gateway CPU per example comes from ``/proc/<pid>/stat`` of its
process tree over the same run. Prints, per batch, the share of the samples that are inside each stage of the REST
route (inclusive; a sample counts for the innermost stage it is in) and the largest Python functions (self time).

    python -m benchmarks.rest_profile [--batches 512,4096] [--seconds 4] [--rate 250]

``--stages``: no servers; the REST parse of the same bodies timed in-process instead (process CPU time, rounds
interleaving the variants; median µs per example over rounds, min to max): ``one_pass`` (what the route runs now
for an embedding model: ``parse_predict_embedding`` + ``JsonInputs.features``), ``one_pass_columns`` (the same
examples in the columnar form), ``check_then_features`` (the route before: ``check_predict``'s serde_json tree, then
``request_features`` from it), ``worker_path`` (what a large body cost before, in one process: ``parse_document``
then ``typed_features`` from the raw body, its batch pickled and unpickled) and ``reference``
(``EMBEDGATE_NATIVE=off``: ``parse_document`` + ``batch_from_instances``).

    python -m benchmarks.rest_profile --stages [--batches 512,4096] [--rounds 5] [--seconds 0.3]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.loadgen import vegeta
from benchmarks.serving_bench import _create_topic, _gateway_config, _wait_cache_serving
from tests.support.stack import cpu_seconds

# (stage, a frame marker: a function name, optionally "name (file" to pin the module); innermost match wins
STAGES: tuple[tuple[str, str], ...] = (
    ("body receive (uvicorn/h11 + read_body)", "read_body"),
    ("body receive (uvicorn/h11 + read_body)", "data_received"),
    ("body receive (uvicorn/h11 + read_body)", "receive (starlette"),
    ("parse: limits (parse_document: orjson, depth, surrogates, sizes)", "parse_document"),
    ("parse: native one-pass body (rest_body.rs)", "rest_batch"),
    ("parse: native check_predict (serde tree)", "check_predict"),
    ("parse: features (native features.rs / reference)", "request_features"),
    ("parse: features (native features.rs / reference)", "batch_from_instances"),
    ("parse: features (native features.rs / reference)", "typed_features"),
    ("parse: map_lookups / FeatureBatch", "map_lookups"),
    ("parse worker pickling / IPC", "_send_bytes"),
    ("parse worker pickling / IPC", "_recv_bytes"),
    ("parse worker pickling / IPC", "recv (multiprocessing"),
    ("parse worker pickling / IPC", "_feed"),
    ("plan", "plan_lookups"),
    ("cache read", "lookup (gateway/cache"),
    ("entry request building", "_entry_request_for"),
    ("entry call (gRPC)", "_call_entry"),
    ("entry call (gRPC)", "unary_unary"),
    ("response writer", "predict_json"),
    ("response send (starlette/uvicorn)", "send (uvicorn"),
    ("response send (starlette/uvicorn)", "__call__ (starlette/responses"),
)


def _stage(frames: list[str]) -> str:
    """The innermost stage a collapsed stack (root first) is in."""
    for frame in reversed(frames):
        for name, marker in STAGES:
            fn, _, mod = marker.partition(" (")
            if frame.startswith(fn + " ") and (not mod or mod in frame):
                return name
    return "other (event loop, middleware, asyncio, idle)"


def _summary(raw: Path, top: int) -> str:
    by_stage: collections.Counter[str] = collections.Counter()
    by_self: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        n = int(count_s)
        frames = stack.split(";")
        total += n
        by_stage[_stage(frames)] += n
        by_self[frames[-1]] += n
    if not total:
        return "no samples"
    lines = [f"{n / total * 100:5.1f} %  {s}" for s, n in by_stage.most_common()]
    lines.append("largest functions (self):")
    lines += [f"{n / total * 100:5.1f} %  {s}" for s, n in by_self.most_common(top)]
    return "\n".join(lines)


def _stage_fns(batch: int) -> dict[str, Callable[[], object]]:
    import pickle

    from benchmarks.request_cpu_bench import demo_like_manifest, instances
    from gateway.core.requests import VersionSpec
    from gateway.limits import parse_document
    from gateway.routes.rest_codec import (
        parse_predict,
        parse_predict_embedding,
        parse_predict_native,
        typed_features,
    )
    from schemas.gateway_settings import LimitsSettings
    from tests.support.native import native_mode

    limits, m, spec = LimitsSettings(), demo_like_manifest(), VersionSpec()
    rows = instances(batch)
    body = json.dumps({"instances": rows}).encode()
    cols = json.dumps({"inputs": {k: [r[k] for r in rows] for k in rows[0]}}).encode()

    def one_pass(b: bytes = body) -> object:
        with native_mode("auto"):
            parsed = parse_predict_embedding("demo", spec, b, limits, m)
            if parsed is None:
                raise RuntimeError("the one pass declined the benchmark body")
            return parsed[1].features(m)

    def check_then_features() -> object:
        with native_mode("auto"):
            parsed = parse_predict_native("demo", spec, body, limits)
            if parsed is None:
                raise RuntimeError("check_predict declined the benchmark body")
            return parsed[1].features(m)

    def worker_path() -> object:
        with native_mode("auto"):
            parse_document(body, limits)
            return pickle.loads(pickle.dumps(typed_features(body, m)))  # noqa: S301 (our own bytes: the IPC the parse workers do)

    def reference() -> object:
        with native_mode("off"):
            return parse_predict("demo", spec, parse_document(body, limits), body)[1].features(m)

    return {
        "one_pass": one_pass,
        "one_pass_columns": lambda: one_pass(cols),
        "check_then_features": check_then_features,
        "worker_path": worker_path,
        "reference": reference,
    }


def stages(batches: list[int], rounds: int, seconds: float) -> str:
    """The ``--stages`` table (markdown)."""
    import statistics
    import time

    lines = ["| batch | variant | µs per example |", "|---|---|---|"]
    for b in batches:
        fns = _stage_fns(b)
        got: dict[str, list[float]] = {n: [] for n in fns}
        for r in range(rounds):
            names = list(fns)[r % len(fns) :] + list(fns)[: r % len(fns)]
            for n in names:
                t0, k = time.process_time(), 0
                while time.process_time() - t0 < seconds:
                    fns[n]()
                    k += 1
                got[n].append((time.process_time() - t0) / k / b * 1e6)
        for n, xs in got.items():
            lines.append(f"| {b} | {n} | {statistics.median(xs):.2f} ({min(xs):.2f} to {max(xs):.2f}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:

    from embedgate.export.demo import build_demo, make_examples
    from schemas.deltas import delta_topic
    from tests.support.gateway import run_gateway
    from tests.support.kafka import kafka_broker
    from tests.support.ports import free_port
    from tests.support.servers import serve_local
    from tests.support.stack import exported_backends

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[512, 4096])
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--stages", action="store_true", help="in-process parse variants only (no servers)")
    p.add_argument("--rounds", type=int, default=5, help="--stages: rounds")
    args = p.parse_args(argv)
    if args.stages:
        secs_stage = args.seconds if args.seconds < 4.0 else 0.3
        print(stages(args.batches, max(1, min(args.rounds, 10)), min(secs_stage, 5.0)))
        return 0
    secs = min(args.seconds, 30.0)
    spy = Path(sys.executable).with_name("py-spy")
    with tempfile.TemporaryDirectory(prefix="restprofile-") as tmp_s:
        tmp = Path(tmp_s)
        demo = build_demo(tmp / "demo", small=True)
        m = demo.manifest
        with serve_local(exported_backends(demo.model_dir)) as backend, contextlib.ExitStack() as stack:
            broker = stack.enter_context(kafka_broker(tmp / "kafka"))
            asyncio.run(_create_topic(broker.bootstrap, delta_topic(m.model_name), m.num_shards))
            port = free_port()
            cache = {"cache": {"max_bytes": 64 << 20, "bootstrap_servers": broker.bootstrap}}
            cfg = _gateway_config(tmp, demo, backend.target, port, cache, "cached.yaml", embedding_only=True)
            gw = stack.enter_context(run_gateway(cfg, ready_timeout=180))
            _wait_cache_serving(gw.url, m.model_name)
            pid = gw.proc.pid
            for b in args.batches:
                instances, _ = make_examples(b, 5_000, seed=b)
                body = json.dumps({"instances": instances}).encode()
                url = f"{gw.url}/v1/models/{m.model_name}:predict"
                vegeta(url, body, clients=1, seconds=1)  # warm
                raw = tmp / f"spy-{b}.txt"
                start = cpu_seconds(pid)
                spy_proc = subprocess.Popen(
                    [
                        str(spy),
                        "record",
                        "--format",
                        "raw",
                        "-o",
                        str(raw),
                        "-r",
                        str(args.rate),
                        "-d",
                        str(int(secs) + 1),
                        "--subprocesses",
                        "--nonblocking",
                        "-p",
                        str(pid),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                res = vegeta(url, body, clients=1, seconds=secs)
                cpu = (cpu_seconds(pid) - start) / max(1, res.requests)
                spy_proc.wait(timeout=secs + 120)
                print(
                    f"\n=== batch {b} REST: p50 {res.p50_ms} ms, {res.requests} requests ({len(body)} bytes each), "
                    f"gateway CPU {cpu * 1e3:.2f} ms per request, {cpu / b * 1e6:.2f} µs per example",
                    flush=True,
                )
                print(_summary(raw, args.top), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

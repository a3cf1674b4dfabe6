"""Gateway process weight and overhead: RSS, time to ready, latency/throughput vs direct gRPC to the same backend.

    .venv/bin/python -m benchmarks.gateway_bench [--requests 1000] [--concurrency 8] [--seconds 20] [--batch 8]

1. Builds the small demo model (``build_demo(small=True)``), serves ``demo_entry``, ``demo_ps_*`` with serve-local.
2. Starts ``embedgate gateway`` (subprocess, 127.0.0.1) with two models on that backend: ``demo`` (embedding) and
   ``entry`` (pass-through to ``demo_entry``). Time to ready = from spawning the process to ``/readyz`` = 200.
3. For each path, sequential latency (p50/p99) then throughput at ``--concurrency`` clients, both bounded by
   ``--requests`` and ``--seconds``:
   * ``embedding``: REST ``:predict`` of ``--batch`` demo instances vs. the same work by a bare ``grpc.aio`` client
     (lookup on every shard concurrently, then entry Predict with pooled inputs prepared once);
   * ``passthrough``: REST ``:predict`` with pooled entry inputs as JSON vs. direct gRPC Predict of the same tensors.
4. Gateway RSS (VmRSS of the worker process) after start and after the load.

Prints one JSON document. Everything runs on 127.0.0.1; every loop stops at the request count or the time limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _measure(
    call: Callable[[], Awaitable[Any]], requests: int, concurrency: int, seconds: float
) -> dict[str, float]:
    for _ in range(min(20, requests)):  # warm-up
        await call()
    lat: list[float] = []
    stop = time.monotonic() + seconds / 2
    for _ in range(requests):
        t = time.perf_counter()
        await call()
        lat.append(time.perf_counter() - t)
        if time.monotonic() > stop:
            break
    lat.sort()
    done = 0
    stop = time.monotonic() + seconds / 2
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal done
        while done < requests and time.monotonic() < stop:
            done += 1
            await call()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    return {
        "p50_ms": round(statistics.median(lat) * 1000, 3),
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 3),
        "sequential_requests": len(lat),
        "throughput_rps": round(done / elapsed, 1),
        "concurrent_requests": done,
    }


async def _run(args: argparse.Namespace, demo: Any, backend_target: str, gw_url: str) -> dict[str, Any]:
    import grpc
    import httpx
    import numpy as np

    from gateway.embedding import entry_inputs, plan_lookups
    from gateway.features import batch_from_instances
    from schemas.manifest import lookup_ids_input, lookup_values_output, ps_model_name
    from schemas.proto import tfs_pb2
    from schemas.tensors import from_ndarray, to_ndarray

    manifest = demo.manifest
    name = manifest.model_name
    instances = (demo.instances * (args.batch // len(demo.instances) + 1))[: args.batch]
    body = json.dumps({"instances": instances}).encode()

    channel = grpc.aio.insecure_channel(backend_target)
    predict = channel.unary_unary(
        "/tensorflow.serving.PredictionService/Predict",
        request_serializer=tfs_pb2.PredictRequest.SerializeToString,
        response_deserializer=tfs_pb2.PredictResponse.FromString,
    )
    batch = batch_from_instances(instances, manifest)
    plan = plan_lookups(batch, manifest)
    lookup_reqs = []
    for i in range(manifest.num_shards):
        req = tfs_pb2.PredictRequest()
        req.model_spec.name = ps_model_name(name, i)
        req.model_spec.signature_name = "lookup"
        for t in manifest.tables:
            req.inputs[lookup_ids_input(t.name)].CopyFrom(
                from_ndarray(plan.shard_ids[i][t.name].astype(np.int64))
            )
        lookup_reqs.append(req)
    values = []
    for req in lookup_reqs:
        resp = await predict(req, timeout=10)
        values.append(
            {
                t.name: to_ndarray(resp.outputs[lookup_values_output(t.name)]).reshape(-1, t.dim)
                for t in manifest.tables
            }
        )
    inputs = dict(entry_inputs(plan, values, batch, manifest))  # the manifest's entry input mode
    entry_req = tfs_pb2.PredictRequest()
    entry_req.model_spec.name = f"{name}_entry"
    for k, v in inputs.items():
        entry_req.inputs[k].CopyFrom(from_ndarray(np.asarray(v)))
    entry_body = json.dumps({"inputs": {k: np.asarray(v).tolist() for k, v in inputs.items()}}).encode()

    async def direct_embedding() -> None:
        await asyncio.gather(*(predict(r, timeout=10) for r in lookup_reqs))
        await predict(entry_req, timeout=10)

    async def direct_entry() -> None:
        await predict(entry_req, timeout=10)

    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=gw_url, limits=limits, timeout=30) as client:

        async def rest_embedding() -> None:
            r = await client.post(f"/v1/models/{name}:predict", content=body)
            r.raise_for_status()

        async def rest_entry() -> None:
            r = await client.post("/v1/models/entry:predict", content=entry_body)
            r.raise_for_status()

        out: dict[str, Any] = {}
        for label, rest, direct in (
            ("embedding", rest_embedding, direct_embedding),
            ("passthrough", rest_entry, direct_entry),
        ):
            g = await _measure(rest, args.requests, args.concurrency, args.seconds)
            d = await _measure(direct, args.requests, args.concurrency, args.seconds)
            out[label] = {
                "gateway_rest": g,
                "direct_grpc": d,
                "p50_ratio": round(g["p50_ms"] / d["p50_ms"], 2),
                "throughput_ratio": round(g["throughput_rps"] / d["throughput_rps"], 2),
            }
    await channel.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--requests", type=int, default=1000, help="max requests per measurement (capped at 20000)"
    )
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seconds", type=float, default=20.0, help="max seconds per measurement (capped at 120)")
    p.add_argument("--batch", type=int, default=8, help="instances per request")
    args = p.parse_args(argv)
    args.requests = min(args.requests, 20000)
    args.seconds = min(args.seconds, 120.0)

    import yaml

    from embedgate.export.demo import build_demo
    from schemas.manifest import entry_model_name
    from tests.support.gateway import run_gateway
    from tests.support.servers import serve_local
    from tests.support.stack import exported_backends

    with tempfile.TemporaryDirectory(prefix="gwbench-") as tmp:
        demo = build_demo(Path(tmp) / "demo", small=True)
        m = demo.manifest
        served = exported_backends(demo.model_dir)
        with serve_local(served) as backend:
            cfg = Path(tmp) / "gateway.yaml"
            cfg.write_text(
                yaml.safe_dump(
                    {
                        "log": {"access": False},
                        "models": [
                            {
                                "kind": "embedding",
                                "name": m.model_name,
                                "manifest": str(demo.model_dir),
                                "entry": backend.target,
                                "shards": [{"replicas": [backend.target]}] * m.num_shards,
                            },
                            {
                                "kind": "passthrough",
                                "name": "entry",
                                "target": backend.target,
                                "backend_name": entry_model_name(m.model_name),
                            },
                        ],
                    }
                )
            )
            t0 = time.perf_counter()
            with run_gateway(cfg) as gw:
                ready_s = time.perf_counter() - t0
                rss_start = _rss_mb(gw.proc.pid)
                results = asyncio.run(_run(args, demo, backend.target, gw.url))
                rss_after = _rss_mb(gw.proc.pid)
    report = {
        "time_to_ready_s": round(ready_s, 3),
        "rss_mb_after_start": round(rss_start, 1),
        "rss_mb_after_load": round(rss_after, 1),
        "batch": args.batch,
        "concurrency": args.concurrency,
        **results,
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

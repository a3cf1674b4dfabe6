"""Hot-row cache on and off: embedding predict p50 on Zipf traffic, hit rate and gateway RSS.

    .venv/bin/python -m benchmarks.cache_bench [--batch 64] [--requests 200] [--rounds 3] [--max-bytes 33554432]

Builds the small demo, serves it with serve-local, starts a real Kafka broker (``embedgate.devkafka``, free ports)
and creates the delta topic, then runs two gateways on the same backend: cache off, and ``cache.max_bytes`` =
``--max-bytes`` fed by that topic (no deltas are published: this measures the read path). Requests hold
``--batch`` demo-shaped instances whose user and item ids follow Zipf(1.2) over the demo's vocabulary. One client,
sequential requests, interleaved rounds (median reported). Prints a table and JSON; 127.0.0.1 only, bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _bodies(instances: list[dict[str, Any]], batch: int, count: int, vocab: int, seed: int) -> list[bytes]:
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        rows = []
        for k in range(batch):
            row = dict(instances[k % len(instances)])
            for key in ("user_id", "item_id"):
                if key in row:
                    row[key] = int(min(rng.zipf(1.2), vocab - 1))
            rows.append(row)
        out.append(json.dumps({"instances": rows}).encode())
    return out


async def _run(url: str, bodies: list[bytes]) -> float:
    import httpx

    lat = []
    async with httpx.AsyncClient(timeout=30) as client:
        for body in bodies:
            t = time.perf_counter()
            r = await client.post(url, content=body)
            lat.append(time.perf_counter() - t)
            r.raise_for_status()
    return statistics.median(lat) * 1e3


async def _create_topic(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()


def _hit_rate(metrics: str) -> float:
    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", metrics, re.MULTILINE))

    hits, misses = total("embedgate_cache_hits_total"), total("embedgate_cache_misses_total")
    return hits / (hits + misses) if hits + misses else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-bytes", type=int, default=32 * 1024 * 1024)
    args = p.parse_args(argv)

    import httpx
    import yaml

    from embedgate.devkafka import KafkaBroker
    from embedgate.export.demo import build_demo
    from tests.support.gateway import run_gateway
    from tests.support.servers import serve_local
    from tests.support.stack import exported_backends

    with tempfile.TemporaryDirectory(prefix="cache-bench-") as tmp:
        demo = build_demo(Path(tmp) / "demo", small=True)
        m = demo.manifest
        vocab = next((t.rows for t in m.tables if t.name == "user_emb"), 0) or 100_000
        served = exported_backends(demo.model_dir)
        broker = KafkaBroker(Path(tmp) / "kafka")
        broker.start(timeout_s=120)
        try:
            asyncio.run(_create_topic(broker.bootstrap, "bench.deltas"))
            with serve_local(served) as backend:
                model = {
                    "kind": "embedding",
                    "name": m.model_name,
                    "manifest": str(demo.model_dir),
                    "entry": backend.target,
                    "shards": [{"replicas": [backend.target]}] * m.num_shards,
                }
                cache = {
                    "max_bytes": args.max_bytes,
                    "bootstrap_servers": broker.bootstrap,
                    "topics": ["bench.deltas"],
                    "hps_topic_pattern": None,
                }
                cfgs = {}
                for mode, extra in (("off", {}), ("on", {"cache": cache})):
                    cfgs[mode] = Path(tmp) / f"gateway-{mode}.yaml"
                    cfgs[mode].write_text(
                        yaml.safe_dump({"log": {"access": False}, "models": [model], **extra})
                    )
                with run_gateway(cfgs["off"]) as off, run_gateway(cfgs["on"]) as on:
                    deadline = time.monotonic() + 60
                    while '"serving": true' not in httpx.get(f"{on.url}/readyz").text:
                        if time.monotonic() > deadline:
                            raise SystemExit("the cache did not start serving within 60 s")
                        time.sleep(0.2)
                    urls = {
                        mode: f"{gw.url}/v1/models/{m.model_name}:predict"
                        for mode, gw in (("off", off), ("on", on))
                    }
                    warm = _bodies(demo.instances, args.batch, args.requests, vocab, seed=1)
                    asyncio.run(_run(urls["on"], warm))  # fill the cache
                    p50: dict[str, list[float]] = {"off": [], "on": []}
                    for r in range(args.rounds):
                        bodies = _bodies(demo.instances, args.batch, args.requests, vocab, seed=100 + r)
                        for mode in ("off", "on"):
                            p50[mode].append(asyncio.run(_run(urls[mode], bodies)))
                    report = {
                        "batch": args.batch,
                        "max_bytes": args.max_bytes,
                        "p50_ms_off": round(statistics.median(p50["off"]), 2),
                        "p50_ms_on": round(statistics.median(p50["on"]), 2),
                        "hit_rate": round(_hit_rate(httpx.get(f"{on.url}/metrics").text), 3),
                        "rss_mb_off": round(_rss_mb(off.proc.pid), 1),
                        "rss_mb_on": round(_rss_mb(on.proc.pid), 1),
                    }
        finally:
            broker.stop()
    print(
        f"batch {report['batch']}: p50 cache off {report['p50_ms_off']} ms, on {report['p50_ms_on']} ms; "
        f"hit rate {report['hit_rate']}; RSS off {report['rss_mb_off']} MB, on {report['rss_mb_on']} MB"
    )
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

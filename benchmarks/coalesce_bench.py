"""Coalescing on and off at 1, 4 and 16 concurrent clients: p50 latency and throughput of embedding predicts.

    .venv/bin/python -m benchmarks.coalesce_bench [--clients 1 4 16] [--batch 1] [--delay-ms 2] [--rounds 2]
                                                   [--requests 300] [--seconds 6]

Builds the small demo, serves it with serve-local (``--batching_args`` passes serve-local flags, e.g.
``--enable_serialization_as_tensor_content``), starts one gateway with ``coalesce`` off and one with
``coalesce.max_delay_ms`` = ``--delay-ms``, and measures them interleaved (``--rounds`` times each): every client
loops REST ``:predict`` of ``--batch`` demo instances until ``--requests`` in total or ``--seconds``. Prints a table
(median over rounds) and JSON. 127.0.0.1 only; every loop bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]


async def _load(url: str, body: bytes, clients: int, requests: int, seconds: float) -> dict[str, float]:
    import httpx

    lat: list[float] = []
    left = requests
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=clients)) as client:
        for _ in range(5):  # warm-up
            (await client.post(url, content=body)).raise_for_status()

        async def worker() -> None:
            nonlocal left
            while left > 0 and time.monotonic() < stop:
                left -= 1
                t = time.perf_counter()
                r = await client.post(url, content=body)
                lat.append(time.perf_counter() - t)
                r.raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    return {"p50_ms": statistics.median(lat) * 1e3, "rps": len(lat) / elapsed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--delay-ms", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--serve-local-args", nargs="*", default=[])
    args = p.parse_args(argv)

    import yaml

    from embedgate.export.demo import build_demo
    from tests.support.gateway import run_gateway
    from tests.support.servers import serve_local
    from tests.support.stack import exported_backends

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="coalesce-bench-") as tmp:
        demo = build_demo(Path(tmp) / "demo", small=True)
        m = demo.manifest
        served = exported_backends(demo.model_dir)
        instances = (demo.instances * (args.batch // len(demo.instances) + 1))[: args.batch]
        body = json.dumps({"instances": instances}).encode()
        with serve_local(served, extra_args=args.serve_local_args) as backend:
            model = {
                "kind": "embedding",
                "name": m.model_name,
                "manifest": str(demo.model_dir),
                "entry": backend.target,
                "shards": [{"replicas": [backend.target]}] * m.num_shards,
            }
            gateways = {}
            for mode, coalesce in (("off", {}), ("on", {"max_delay_ms": args.delay_ms, "max_batch": 512})):
                cfg = Path(tmp) / f"gateway-{mode}.yaml"
                cfg.write_text(
                    yaml.safe_dump({"log": {"access": False}, "models": [model], "coalesce": coalesce})
                )
                gateways[mode] = cfg
            with run_gateway(gateways["off"]) as off, run_gateway(gateways["on"]) as on:
                urls = {
                    "off": f"{off.url}/v1/models/{m.model_name}:predict",
                    "on": f"{on.url}/v1/models/{m.model_name}:predict",
                }
                for clients in args.clients:
                    got: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
                    for _ in range(args.rounds):
                        for mode in ("off", "on"):
                            got[mode].append(
                                asyncio.run(_load(urls[mode], body, clients, args.requests, args.seconds))
                            )
                    row: dict[str, Any] = {"clients": clients}
                    for mode in ("off", "on"):
                        row[f"{mode}_p50_ms"] = round(statistics.median(r["p50_ms"] for r in got[mode]), 2)
                        row[f"{mode}_rps"] = round(statistics.median(r["rps"] for r in got[mode]), 1)
                    rows.append(row)
                    print(
                        f"clients {clients:3d}: off p50 {row['off_p50_ms']:7.2f} ms {row['off_rps']:7.1f} rps | "
                        f"on ({args.delay_ms:g} ms) p50 {row['on_p50_ms']:7.2f} ms {row['on_rps']:7.1f} rps",
                        flush=True,
                    )
    json.dump({"batch": args.batch, "delay_ms": args.delay_ms, "rows": rows}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

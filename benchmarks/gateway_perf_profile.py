"""Where a live cached gateway's CPU goes (issue 17's profile): ``perf record -g`` of the gateway process under one
client at each batch, gRPC (ghz) then REST (vegeta), on the small demo model with a warm hot-row cache.

Prints, per batch and front, the gateway CPU per request and per example (``/proc/<pid>/stat`` of its process tree
over the same run) and ``perf report``'s largest shared objects and symbols. Needs ``perf`` (Linux) and ``make
bench-tools``. Python frames show as ``libpython``: pair it with ``benchmarks.embedding_path_bench`` for the Python
stages.

    python -m benchmarks.gateway_perf_profile [--batches 64,512,4096] [--seconds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from benchmarks.loadgen import Result, ghz, protoset, vegeta
from benchmarks.native_serving_bench import _cpu_s
from benchmarks.serving_bench import (
    _create_topic,
    _gateway_config,
    _gateway_grpc_request,
    _wait_cache_serving,
)


def _report(data: Path, sort: str, lines: int) -> str:
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", sort, "--stdio", "-g", "none"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    ).stdout
    return "\n".join([x for x in out.splitlines() if x.strip() and not x.startswith("#")][:lines])


def main(argv: list[str] | None = None) -> int:
    import yaml

    from embedgate.export.demo import build_demo, make_examples
    from schemas.deltas import delta_topic
    from tests.support.gateway import run_gateway
    from tests.support.kafka import kafka_broker
    from tests.support.ports import free_port
    from tests.support.servers import serve_local
    from tests.support.stack import exported_backends

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[64, 512, 4096])
    p.add_argument("--seconds", type=float, default=4.0)
    args = p.parse_args(argv)
    if shutil.which("perf") is None:
        raise SystemExit("perf is missing (Debian: apt-get install linux-perf)")
    secs = min(args.seconds, 30.0)
    with tempfile.TemporaryDirectory(prefix="perfprofile-") as tmp_s:
        tmp = Path(tmp_s)
        demo = build_demo(tmp / "demo", small=True)
        m = demo.manifest
        proto_set = protoset(tmp / "tfs.protoset")
        with serve_local(exported_backends(demo.model_dir)) as backend, contextlib.ExitStack() as stack:
            broker = stack.enter_context(kafka_broker(tmp / "kafka"))
            asyncio.run(_create_topic(broker.bootstrap, delta_topic(m.model_name), m.num_shards))
            port = free_port()
            cache = {"cache": {"max_bytes": 64 << 20, "bootstrap_servers": broker.bootstrap}}
            cfg = _gateway_config(tmp, demo, backend.target, port, cache, "cached.yaml")
            doc = yaml.safe_load(cfg.read_text())
            doc["models"] = doc["models"][:1]  # the embedding model only (no whole model served here)
            cfg.write_text(yaml.safe_dump(doc))
            gw = stack.enter_context(run_gateway(cfg, ready_timeout=180))
            _wait_cache_serving(gw.url, m.model_name)
            pid = gw.proc.pid
            before = _cpu_s(pid)
            time.sleep(3)
            print(f"idle gateway CPU: {(_cpu_s(pid) - before) / 3 * 1e3:.1f} ms per second", flush=True)
            for b in args.batches:
                instances, _ = make_examples(b, 5_000, seed=b)
                req = _gateway_grpc_request(instances, m)
                body = json.dumps({"instances": instances}).encode()
                url = f"{gw.url}/v1/models/{m.model_name}:predict"
                loads: dict[str, Callable[[], Result]] = {
                    "grpc": partial(ghz, f"127.0.0.1:{port}", req, proto_set, clients=1, seconds=secs),
                    "rest": partial(vegeta, url, body, clients=1, seconds=secs),
                }
                for front, load in loads.items():
                    load()  # warm
                    data = tmp / f"perf-{b}-{front}.data"
                    start = _cpu_s(pid)
                    perf = subprocess.Popen(
                        [
                            "perf",
                            "record",
                            "-F",
                            "999",
                            "-g",
                            "-o",
                            str(data),
                            "-p",
                            str(pid),
                            "--",
                            "sleep",
                            str(secs),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    res = load()
                    perf.wait(timeout=secs + 120)
                    cpu = (_cpu_s(pid) - start) / max(1, res.requests)
                    print(
                        f"\n=== batch {b} {front}: p50 {res.p50_ms} ms, {res.requests} requests, gateway CPU "
                        f"{cpu * 1e3:.2f} ms per request, {cpu / b * 1e6:.2f} µs per example",
                        flush=True,
                    )
                    print(_report(data, "dso", 8))
                    print(_report(data, "dso,sym", 25), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

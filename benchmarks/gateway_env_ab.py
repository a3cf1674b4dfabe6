"""Cached gateways that differ only in their environment, interleaved: gateway CPU per example over gRPC (issue 17).

The small demo model split (2 PS shards, ``unique_rows`` entry) on one serve-local, a Kafka broker feeding the hot-row
caches, and one cached gateway per variant (``--variant NAME=ENV,ENV``, e.g. ``procs0=EMBEDGATE_LIMITS__PARSE_PROCESSES=0``;
a variant with no ``=`` after its name runs with the default environment). Every round runs ghz (one client) against
each gateway's gRPC front in a rotated order; the figure is user + system CPU of each gateway's process tree
(``/proc/<pid>/stat``, parse workers included) per example, with the p50 latency beside it (indicative: the machine
is shared).

    python -m benchmarks.gateway_env_ab --variant native --variant procs0=EMBEDGATE_LIMITS__PARSE_PROCESSES=0 \\
        --variant ref=EMBEDGATE_NATIVE=off [--batches 512,4096] [--rounds 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.loadgen import ghz, protoset
from benchmarks.serving_bench import (
    _create_topic,
    _gateway_config,
    _gateway_grpc_request,
    _wait_cache_serving,
)
from tests.support.stack import cpu_seconds


def _variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, envs = text.partition("=")
    env = dict(e.split("=", 1) for e in envs.split(",") if e) if envs else {}
    return name, env


def main(argv: list[str] | None = None) -> int:

    from embedgate.export.demo import build_demo, make_examples
    from schemas.deltas import delta_topic
    from tests.support.gateway import run_gateway
    from tests.support.kafka import kafka_broker
    from tests.support.ports import free_port
    from tests.support.servers import serve_local
    from tests.support.stack import exported_backends

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--variant", action="append", type=_variant, required=True)
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[512, 4096])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args(argv)
    secs = min(args.seconds, 30.0)
    with tempfile.TemporaryDirectory(prefix="envab-") as tmp_s:
        tmp = Path(tmp_s)
        demo = build_demo(tmp / "demo", small=True)
        m = demo.manifest
        proto_set = protoset(tmp / "tfs.protoset")
        with serve_local(exported_backends(demo.model_dir)) as backend, contextlib.ExitStack() as stack:
            broker = stack.enter_context(kafka_broker(tmp / "kafka"))
            asyncio.run(_create_topic(broker.bootstrap, delta_topic(m.model_name), m.num_shards))
            gateways: dict[str, tuple[int, str]] = {}
            for name, env in args.variant:
                port = free_port()
                cache = {"cache": {"max_bytes": 64 << 20, "bootstrap_servers": broker.bootstrap}}
                cfg = _gateway_config(
                    tmp, demo, backend.target, port, cache, f"{name}.yaml", embedding_only=True
                )
                gw = stack.enter_context(run_gateway(cfg, ready_timeout=600, env=env))
                _wait_cache_serving(gw.url, m.model_name)
                gateways[name] = (gw.proc.pid, f"127.0.0.1:{port}")
            print(f"Command: `python -m benchmarks.gateway_env_ab {' '.join(sys.argv[1:])}`")
            print("| batch | variant | gateway CPU µs/example, median [min-max] | p50 ms, median [min-max] |")
            print("|---|---|---|---|")
            for b in args.batches:
                instances, _ = make_examples(b, 5_000, seed=b)
                req = _gateway_grpc_request(instances, m)
                for _, address in gateways.values():  # warm caches and connections
                    ghz(address, req, proto_set, clients=1, seconds=1)
                got: dict[str, list[tuple[float, float]]] = {n: [] for n in gateways}
                names = list(gateways)
                for r in range(args.rounds):
                    for name in names[r % len(names) :] + names[: r % len(names)]:
                        pid, address = gateways[name]
                        before = cpu_seconds(pid)
                        res = ghz(address, req, proto_set, clients=1, seconds=secs)
                        cpu = (cpu_seconds(pid) - before) / max(1, res.requests) / b * 1e6
                        got[name].append((cpu, res.p50_ms))
                for name, vals in got.items():
                    cpus, p50s = [v[0] for v in vals], [v[1] for v in vals]
                    print(
                        f"| {b} | {name} | {statistics.median(cpus):.2f} [{min(cpus):.2f}-{max(cpus):.2f}] | "
                        f"{statistics.median(p50s):.1f} [{min(p50s):.1f}-{max(p50s):.1f}] |",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

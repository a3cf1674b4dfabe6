"""Embedding predict end to end, native hot path vs Python reference (issue 17): latency and gateway CPU per example.

The small demo model (2 PS shards, ``unique_rows`` entry) exported split and saved whole, one serve-local serving
both; a Kafka broker feeding the hot-row caches. Four gateways on that backend: cached and uncached, each with the
native path (``EMBEDGATE_NATIVE`` unset) and with the Python reference (``EMBEDGATE_NATIVE=off``). Targets, one
client: ``whole`` (ghz, the whole model over gRPC: the baseline), ``whole_py`` and ``entry_py`` (the bare Python gRPC
client ``benchmarks.split_client``: the whole model, and the entry alone sent the request the gateway writes for the
batch, the floor under every gateway target; ghz is not used for these two because its re-encoding of a request is
dearer for the entry's many inputs than the gateway's own native client, and would overstate the floor),
``grpc_cache`` / ``grpc_cache_ref`` (ghz, the features as tensors through a cached gateway's gRPC front), ``grpc`` /
``grpc_ref`` (uncached), ``rest_cache`` / ``rest_cache_ref`` (vegeta, REST ``:predict`` of the instances to a cached gateway). Every round runs every target
once in a rotated order; ratios are taken per round. Gateway CPU per example: user + system time of the gateway's
process tree (``/proc/<pid>/stat``, parse workers included) around each run, divided by requests x batch.

    make bench-tools   # ghz and vegeta
    python -m benchmarks.native_serving_bench [--batches 1,64,512,4096] [--rounds 3] [--seconds 3] [--write FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from benchmarks.loadgen import Result, ghz, protoset, split_client, vegeta
from benchmarks.report import markers, write_section
from benchmarks.serving_bench import (
    _create_topic,
    _gateway_config,
    _gateway_grpc_request,
    _official_request,
    _save_whole,
    _wait_cache_serving,
)
from benchmarks.split_client import write_requests
from tests.support.stack import cpu_seconds, metric_sum

HEADING = "## Embedding predict end to end: native hot path vs Python reference (issue 17)"


def _measured(load: Callable[[], Result], pid: int | None) -> Callable[[], tuple[Result, float]]:
    """``load`` and the gateway CPU seconds per request it cost (nan for a target without a gateway)."""

    def run() -> tuple[Result, float]:
        before = cpu_seconds(pid) if pid is not None else 0.0
        res = load()
        if pid is None:
            return res, float("nan")
        return res, (cpu_seconds(pid) - before) / max(1, res.requests)

    return run


def _entry_request(instances: list[dict[str, Any]], manifest: Any) -> bytes:
    """The entry request the gateway writes for ``instances`` (its own plan and framing), with every row zero: the
    ``entry_py`` target, the entry call alone (what no gateway can go below). The rows' values do not change the
    entry's work, only their number and shapes do."""
    import numpy as np

    from benchmarks.entry_inputs import entry_inputs_for
    from gateway.features import batch_from_instances
    from schemas.manifest import entry_model_name
    from schemas.wire import predict_request

    dims = {t.name: t.dim for t in manifest.tables}
    batch = batch_from_instances(instances, manifest)
    inputs = entry_inputs_for(batch, manifest, lambda t, ids: np.zeros((len(ids), dims[t]), np.float32))
    return predict_request(entry_model_name(manifest.model_name), "", inputs)


def _rounds(targets: dict[str, Callable[[], tuple[Result, float]]], rounds: int) -> list[dict[str, Any]]:
    names = list(targets)
    out = []
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        got = {n: targets[n]() for n in order}
        out.append({n: got[n] for n in names})
        print(
            f"  round {r + 1}: " + ", ".join(f"{n} {v[0].p50_ms} ms" for n, v in got.items()),
            file=sys.stderr,
            flush=True,
        )
    return out


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from embedgate.export.demo import build_demo, make_examples
    from schemas.deltas import delta_topic
    from tests.support.gateway import run_gateway
    from tests.support.kafka import kafka_broker
    from tests.support.ports import free_port
    from tests.support.servers import serve_local
    from tests.support.stack import exported_backends

    report: dict[str, Any] = {"load_average_start": round(os.getloadavg()[0], 1), "batches": {}}
    with tempfile.TemporaryDirectory(prefix="nativebench-") as tmp_s:
        tmp = Path(tmp_s)
        demo = build_demo(tmp / "demo", small=True)
        m = demo.manifest
        report["input_mode"] = m.entry.input_mode.value
        whole_inputs = _save_whole(demo.keras_path, tmp / "whole")
        served = {**exported_backends(demo.model_dir), "demo_whole": tmp / "whole"}
        proto_set = protoset(tmp / "tfs.protoset")
        with serve_local(served) as backend, contextlib.ExitStack() as stack:
            broker = stack.enter_context(kafka_broker(tmp / "kafka"))
            asyncio.run(_create_topic(broker.bootstrap, delta_topic(m.model_name), m.num_shards))
            cache = {"cache": {"max_bytes": 64 << 20, "bootstrap_servers": broker.bootstrap}}
            gateways: dict[str, Any] = {}
            for name, extra, env in (
                ("cache", cache, {}),
                ("cache_ref", cache, {"EMBEDGATE_NATIVE": "off"}),
                ("plain", {}, {}),
                ("plain_ref", {}, {"EMBEDGATE_NATIVE": "off"}),
            ):
                port = free_port()
                cfg = _gateway_config(tmp, demo, backend.target, port, extra, f"{name}.yaml")
                gw = stack.enter_context(run_gateway(cfg, env={"EMBEDGATE_NATIVE": "auto", **env}))
                if extra:
                    _wait_cache_serving(gw.url, m.model_name)
                gateways[name] = (gw, f"127.0.0.1:{port}")
            for b in args.batches:
                instances, _ = make_examples(b, 5_000, seed=b)
                keras_in = {
                    k: np.asarray(v).astype(whole_inputs[k]) for k, v in demo.keras_inputs(instances).items()
                }
                whole_req = _official_request("demo_whole", keras_in)
                whole_file, entry_file = tmp / f"whole_{b}.bin", tmp / f"entry_{b}.bin"
                write_requests(whole_file, [], whole_req)
                write_requests(entry_file, [], _entry_request(instances, m))
                grpc_req = _gateway_grpc_request(instances, m)
                body = json.dumps({"instances": instances}).encode()
                secs = args.seconds
                one: dict[str, Any] = {"clients": 1, "seconds": secs}

                def grpc(
                    gw: str, req: bytes = grpc_req, s: float = secs
                ) -> Callable[[], tuple[Result, float]]:
                    g, address = gateways[gw]
                    return _measured(lambda: ghz(address, req, proto_set, clients=1, seconds=s), g.proc.pid)

                def rest(gw: str, body: bytes = body, s: float = secs) -> Callable[[], tuple[Result, float]]:
                    g, _ = gateways[gw]
                    url = f"{g.url}/v1/models/{m.model_name}:predict"
                    return _measured(lambda: vegeta(url, body, clients=1, seconds=s), g.proc.pid)

                targets = {
                    "whole": _measured(
                        partial(ghz, backend.target, whole_req, proto_set, clients=1, seconds=secs), None
                    ),
                    "whole_py": _measured(partial(split_client, backend.target, whole_file, **one), None),
                    "entry_py": _measured(partial(split_client, backend.target, entry_file, **one), None),
                    "grpc_cache": grpc("cache"),
                    "grpc_cache_ref": grpc("cache_ref"),
                    "grpc": grpc("plain"),
                    "grpc_ref": grpc("plain_ref"),
                    "rest_cache": rest("cache"),
                    "rest_cache_ref": rest("cache_ref"),
                }
                for t in targets.values():  # warm every cache and connection
                    t()
                print(f"batch {b}", file=sys.stderr, flush=True)
                rounds = _rounds(targets, args.rounds)
                row: dict[str, Any] = {}
                for name in targets:
                    row[name] = {
                        "p50_ms": [r[name][0].p50_ms for r in rounds],
                        "ratio_whole": [r[name][0].p50_ms / r["whole"][0].p50_ms for r in rounds],
                        "cpu_us_per_example": [r[name][1] * 1e6 / b for r in rounds],
                        "errors": sum(r[name][0].errors for r in rounds),
                    }
                for name in ("grpc_cache", "grpc", "rest_cache"):
                    row[name]["ref_over_native"] = [
                        r[f"{name}_ref"][0].p50_ms / r[name][0].p50_ms for r in rounds
                    ]
                report["batches"][str(b)] = row
            # requests of the native gateways that their feature reader left to the reference (every batch, warm-up
            # included): a load generator's encoding the native path does not take shows here, not only in a profile
            report["native_fallbacks"] = {
                name: int(
                    metric_sum(
                        httpx.get(f"{gateways[name][0].url}/metrics", timeout=10).text,
                        "embedgate_native_fallbacks_total",
                    )
                )
                for name in ("cache", "plain")
            }
    report["load_average_end"] = round(os.getloadavg()[0], 1)
    return report


def table(report: dict[str, Any]) -> str:
    lines = [
        (
            "| batch | target | p50 ms | p50 ÷ whole | gateway CPU µs/example | reference p50 ÷ native p50 "
            "| REST p50 ÷ the same gateway's gRPC p50 |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for b, row in report["batches"].items():
        for name, v in row.items():
            cpu = "-" if name in ("whole", "whole_py", "entry_py") else _med(v["cpu_us_per_example"])
            ab = _med(v["ref_over_native"]) + "x" if "ref_over_native" in v else ""
            errors = f" ({v['errors']} errors)" if v["errors"] else ""
            own = ""
            grpc = row.get(name.replace("rest_", "grpc_")) if name.startswith("rest_") else None
            if grpc is not None:  # per round: REST and gRPC of one gateway setup
                own = _med([r / g for r, g in zip(v["p50_ms"], grpc["p50_ms"], strict=True)]) + "x"
            lines.append(
                f"| {b} | {name} | {_med(v['p50_ms'])}{errors} | {_med(v['ratio_whole'])}x | {cpu} | {ab} | {own} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64, 512, 4096])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0, help="per measurement (capped at 30)")
    p.add_argument("--write", type=Path, default=None, help="rewrite this benchmark's section of the file")
    args = p.parse_args(argv)
    args.seconds = min(args.seconds, 30.0)
    args.rounds = max(1, min(args.rounds, 10))
    started = time.time()
    report = run(args)
    json.dump(report, sys.stdout, indent=1)
    print()
    cmd = (
        "python -m benchmarks.native_serving_bench --batches "
        + ",".join(map(str, args.batches))
        + f" --rounds {args.rounds} --seconds {args.seconds:g}"
    )
    body = (
        f"Command: `{cmd}` ({time.time() - started:.0f} s); {os.cpu_count()} cores; load average (1 min) "
        f"{report['load_average_start']} at the start, {report['load_average_end']} at the end; entry input mode "
        f"`{report['input_mode']}`. One client; median over rounds [min-max]; `_ref` = the same gateway setup with "
        f"`EMBEDGATE_NATIVE=off`. Requests the native gateways' feature readers left to the reference "
        f"(`embedgate_native_fallbacks_total`, every batch and warm-up): "
        + ", ".join(f"{k} {v}" for k, v in report["native_fallbacks"].items())
        + f".\n\n{table(report)}"
    )
    print(body)
    if args.write:
        begin, end = markers("native_serving_bench", str(args.write))
        write_section(args.write, begin, end, body, HEADING)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

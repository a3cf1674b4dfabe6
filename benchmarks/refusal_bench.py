"""What a refusal under overload costs the gateway, per front: over REST uvicorn's h11 protocol with ``ShedMiddleware``
against the gateway's own protocol (``limits.http_parser: httptools``, :mod:`gateway.http_protocol`), which writes the
429 when the headers are parsed; over gRPC the Python front (``grpc_front: python``, ``grpc.aio``) against the native
gRPC gate (``grpc_front: gate``, ``native/src/gate.rs``), which refuses without Python.

    .venv/bin/python -m benchmarks.refusal_bench [--fronts REST,gRPC] [--rate 1500] [--seconds 5] [--rounds 3] [--floor]

Each round starts one gateway per variant (the order alternates between rounds), pinned to CPU 0, in front of a fake
TF Serving backend (``tests.gateway.fake_backend``) that holds ``GetModelMetadata``. The gateway admits one request at
a time (``max_in_flight: 1``, no queue, no adaptive limit); one REST predict is sent and held at the backend, so every
later request is refused at once (``queue_full``). vegeta (REST) or ghz (gRPC Predict), pinned to CPU 1, then sends
``--rate`` requests/s for ``--seconds``. Reported per variant: the gateway's CPU per refusal (``/proc/<pid>/stat``
around the attack, divided by the refusals the gateway counted), the load generator's p50 / p99, and the ratio of the
two variants' CPU within each round (median and range over the rounds). ``--floor`` adds a third REST variant each
round, ``asyncio floor``: :mod:`benchmarks.refusal_floor`, a bare ``asyncio.Protocol`` answering every request with
the same 429 (no parser callbacks, no admission, no metrics), pinned the same way, whose CPU per request is the least
any Python asyncio server pays for a refusal; its count is vegeta's (every request it answered). Bounded: every attack has its duration and a
request timeout, the held call is released after each round (at most 30 s), everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

import httpx
import yaml

from benchmarks.loadgen import ghz, protoset, vegeta
from tests.gateway.fake_backend import FakeBackend, fake_backend
from tests.support.gateway import run_gateway
from tests.support.ports import free_port
from tests.support.stack import cpu_seconds, metric_sum

__all__ = ["main"]

# per front: (variant, gateway settings), the baseline first
_VARIANTS: Final[dict[str, tuple[tuple[str, dict[str, Any]], ...]]] = {
    "REST": (
        ("h11", {"limits": {"http_parser": "h11"}}),
        ("httptools", {"limits": {"http_parser": "httptools"}}),
        ("rest gate", {"limits": {"http_parser": "httptools"}, "rest_front": "gate"}),
    ),
    "gRPC": (("python", {"grpc_front": "python"}), ("gate", {"grpc_front": "gate"})),
}
_BODY: Final = json.dumps({"instances": [[1.0, 2.0, 3.0, 4.0]]}).encode()
_CLIENTS: Final = 256
_GHZ_CLIENTS: Final = 64  # ghz workers, one connection each; enough for --rate calls/s of refusals


def _shed(url: str) -> float:
    return metric_sum(httpx.get(f"{url}/metrics", timeout=10).text, "embedgate_admission_shed_total")


def _held(url: str) -> None:
    """One predict, held at the backend until the round ends (its answer does not matter)."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(url, content=_BODY, timeout=60)


def _grpc_request() -> bytes:
    from schemas.proto import tfs_pb2

    req = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name="m"))
    x = req.inputs["x"]
    x.dtype = tfs_pb2.DataType.DT_FLOAT
    x.tensor_shape.dim.add().size = 1
    x.tensor_shape.dim.add().size = 4
    x.float_val.extend([1.0, 2.0, 3.0, 4.0])
    out: bytes = req.SerializeToString()
    return out


def _round(
    front: str,
    variant: str,
    extra: dict[str, Any],
    backend: FakeBackend,
    work: Path,
    rate: float,
    seconds: float,
) -> dict[str, Any]:
    cfg = work / f"gateway-{variant}.yaml"
    grpc_port = free_port()
    cfg.write_text(
        yaml.safe_dump(
            {
                "models": [{"kind": "passthrough", "name": "m", "target": backend.target}],
                "max_in_flight": 1,
                "admission": {"adaptive": False, "queue_timeout_s": 0},
                "log": {"access": False},
                "grpc_port": grpc_port if front == "gRPC" else 0,
                **extra,
            }
        )
    )
    with run_gateway(cfg, ready_timeout=60) as gw:
        os.sched_setaffinity(gw.proc.pid, {0})
        url = f"{gw.url}/v1/models/m:predict"
        held = threading.Thread(target=_held, args=(url,), daemon=True)
        held.start()
        if not backend.metadata_started.wait(30):  # the held request has the gateway's only slot
            raise SystemExit("the held request never reached the backend")
        shed0, cpu0 = _shed(gw.url), cpu_seconds(gw.proc.pid)
        if front == "REST":
            res = vegeta(url, _BODY, clients=_CLIENTS, seconds=seconds, rate=rate)
        else:
            res = ghz(
                f"127.0.0.1:{grpc_port}",
                _grpc_request(),
                protoset(work / "tfs.protoset"),
                clients=_GHZ_CLIENTS,
                seconds=seconds,
                rate=rate,
            )
        cpu, shed = cpu_seconds(gw.proc.pid) - cpu0, _shed(gw.url) - shed0
    return {
        "front": front,
        "variant": variant,
        "requests": res.requests,
        "refused": shed,
        "not_ok": res.errors,
        "cpu_us_per_refusal": 1e6 * cpu / max(1.0, shed),
        "p50_ms": res.p50_ms,
        "p99_ms": res.p99_ms,
    }


def _floor_round(rate: float, seconds: float) -> dict[str, Any]:
    """The ``asyncio floor`` variant: :mod:`benchmarks.refusal_floor` on CPU 0 under the same vegeta attack."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.refusal_floor", str(port)],
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        os.sched_setaffinity(proc.pid, {0})
        end = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > end or proc.poll() is not None:
                raise SystemExit("benchmarks.refusal_floor did not start listening within 30 s")
            time.sleep(0.05)
        cpu0 = cpu_seconds(proc.pid)
        res = vegeta(
            f"http://127.0.0.1:{port}/v1/models/m:predict",
            _BODY,
            clients=_CLIENTS,
            seconds=seconds,
            rate=rate,
        )
        cpu = cpu_seconds(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {
        "front": "REST",
        "variant": "asyncio floor",
        "requests": res.requests,
        "refused": float(res.requests),
        "not_ok": res.errors,
        "cpu_us_per_refusal": 1e6 * cpu / max(1, res.requests),
        "p50_ms": res.p50_ms,
        "p99_ms": res.p99_ms,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fronts", default="REST,gRPC", help="comma-separated: REST, gRPC")
    ap.add_argument("--rate", type=float, default=1500.0, help="requests/s sent (open loop)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write every round's figures here")
    ap.add_argument(
        "--floor",
        action="store_true",
        help="REST: also the asyncio floor each round (benchmarks.refusal_floor)",
    )
    args = ap.parse_args(argv)
    fronts = [f.strip() for f in args.fronts.split(",") if f.strip()]
    for f in fronts:
        if f not in _VARIANTS:
            ap.error(f"unknown front {f!r}: REST or gRPC")
    os.sched_setaffinity(0, {1})  # this process and the load generators (its children) on CPU 1
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="refusal-bench-") as tmp:
        for r in range(args.rounds):
            for front in fronts:
                variants = _VARIANTS[front] if r % 2 == 0 else _VARIANTS[front][::-1]
                for variant, extra in variants:
                    with fake_backend() as backend:
                        backend.hold_metadata = True
                        try:
                            row = _round(front, variant, extra, backend, Path(tmp), args.rate, args.seconds)
                        finally:
                            backend.release.set()
                    row["round"] = r + 1
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                if front == "REST" and args.floor:
                    row = _floor_round(args.rate, args.seconds)
                    row["round"] = r + 1
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    print()
    print(
        f"`python -m benchmarks.refusal_bench --fronts {','.join(fronts)} --rate {args.rate:g} --seconds "
        f"{args.seconds:g} --rounds {args.rounds}`; gateway on CPU 0, load generator on CPU 1; load average "
        f"{os.getloadavg()[0]:.1f} at the end."
    )
    print()
    print(
        "| round | front | variant | sent | refused (gateway's count; the floor's: vegeta's) | CPU µs per refusal | "
        "p50 / p99 (ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['round']} | {row['front']} | {row['variant']} | {row['requests']:,} | {row['refused']:,.0f} | "
            f"{row['cpu_us_per_refusal']:.0f} | {row['p50_ms']:.2f} / {row['p99_ms']:.2f} |"
        )
    print()
    for front in fronts:
        (base, _), *others = _VARIANTS[front]
        for new, _ in others:
            ratios = []
            for r in range(1, args.rounds + 1):
                by = {
                    row["variant"]: row["cpu_us_per_refusal"]
                    for row in rows
                    if row["round"] == r and row["front"] == front
                }
                ratios.append(by[new] / by[base])
            print(
                f"{front}: CPU per refusal, {new} / {base}: median {statistics.median(ratios):.2f}x "
                f"[{min(ratios):.2f}-{max(ratios):.2f}] over {len(ratios)} rounds"
            )
        new = others[0][0]
        if front == "REST" and args.floor:
            floors = [
                next(
                    row["cpu_us_per_refusal"]
                    for row in rows
                    if row["round"] == r and row["front"] == front and row["variant"] == variant
                )
                for r in range(1, args.rounds + 1)
                for variant in ("asyncio floor", new)
            ]
            shares = [floors[i] / floors[i + 1] for i in range(0, len(floors), 2)]
            print(
                f"{front}: CPU per request, asyncio floor / {new}: median {statistics.median(shares):.2f}x "
                f"[{min(shares):.2f}-{max(shares):.2f}] over {len(shares)} rounds"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

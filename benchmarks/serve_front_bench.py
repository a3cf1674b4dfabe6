"""serve-local's gRPC fronts, the native gate against the Python gRPC server: client latency and server CPU per Predict.

    .venv/bin/python -m benchmarks.serve_front_bench [--sizes 4000,1000000,5300000] [--rounds 6] [--calls 60]
                                                     [--write docs/benchmarks.md]

Two serve-local processes serve the same SavedModel (``x: float32[n]`` -> ``sum(x)``: the request carries the
bytes, the answer is a scalar, so the call measures receiving and decoding the request): one with the default front
(the native gate, ``embedgate/localserve/front.py``), one with ``EMBEDGATE_SERVE_FRONT=python``. One Python gRPC
client sends the same serialized request to both; per request size and round, ``--calls`` sequential calls to each
server, the order alternating between rounds. Reported per size: the median of the rounds' p50 latencies and of the
server's CPU per call (``/proc``, its process), and the ratios gate ÷ Python with their spread over the rounds. Both
servers run with serve-local's defaults (``--malloc_mmap_threshold_bytes`` included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.report import markers, write_section

__all__ = ["main"]

BEGIN, END = markers("serve_front_bench")
_PREDICT = "/tensorflow.serving.PredictionService/Predict"
_WARMUP = 20


def _model(path: Path) -> None:
    import tensorflow as tf

    class Sum(tf.Module):  # type: ignore[misc]  # tensorflow ships no types
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])  # type: ignore[untyped-decorator]
        def f(self, x: Any) -> Any:
            return {"s": tf.reduce_sum(x)}

    m = Sum()
    tf.saved_model.save(m, str(path / "1"), signatures={"serving_default": m.f})


def _request(size: int) -> bytes:
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    req = predict_pb2.PredictRequest()
    req.model_spec.name = "sum"
    n = max(1, size // 4)
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.random.default_rng(0).random(n, np.float32)))
    raw: bytes = req.SerializeToString()
    return raw


def run(args: argparse.Namespace) -> dict[str, Any]:
    import grpc

    from embedgate.localserve.front import FRONT_ENV
    from tests.support.native import env_set
    from tests.support.servers import serve_local
    from tests.support.stack import cpu_seconds

    fronts = ("gate", "python")
    report: dict[str, Any] = {"rounds": args.rounds, "calls": args.calls, "sizes": {}}
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    with tempfile.TemporaryDirectory(prefix="servefront-") as tmp:
        model = Path(tmp) / "sum"
        _model(model)
        with (
            serve_local({"sum": model}) as gate,
            env_set(FRONT_ENV, "python"),
            serve_local({"sum": model}) as python,
        ):
            servers = {"gate": gate, "python": python}
            channels = {k: grpc.insecure_channel(s.target, options=options) for k, s in servers.items()}
            try:
                calls = {k: ch.unary_unary(_PREDICT) for k, ch in channels.items()}
                for size in args.sizes:
                    raw = _request(size)
                    for call in calls.values():
                        for _ in range(_WARMUP):
                            call(raw, timeout=60)
                    p50: dict[str, list[float]] = {k: [] for k in fronts}
                    cpu: dict[str, list[float]] = {k: [] for k in fronts}
                    for r in range(args.rounds):
                        for k in fronts if r % 2 == 0 else tuple(reversed(fronts)):
                            pid = servers[k].proc.pid
                            c0, lat = cpu_seconds(pid), []
                            for _ in range(args.calls):
                                t = time.perf_counter()
                                calls[k](raw, timeout=60)
                                lat.append(time.perf_counter() - t)
                            cpu[k].append((cpu_seconds(pid) - c0) / args.calls * 1000)
                            p50[k].append(statistics.median(lat) * 1000)
                    lat_ratio = [g / p for g, p in zip(p50["gate"], p50["python"], strict=True)]
                    cpu_ratio = [g / p for g, p in zip(cpu["gate"], cpu["python"], strict=True) if p > 0]
                    entry = {
                        "bytes": len(raw),
                        "p50_ms": {k: round(statistics.median(v), 3) for k, v in p50.items()},
                        "cpu_ms": {k: round(statistics.median(v), 3) for k, v in cpu.items()},
                        "p50_ratio": [
                            round(x, 3) for x in (statistics.median(lat_ratio), *_spread(lat_ratio))
                        ],
                        "cpu_ratio": [
                            round(x, 3) for x in (statistics.median(cpu_ratio), *_spread(cpu_ratio))
                        ],
                    }
                    report["sizes"][str(size)] = entry
                    print(f"{len(raw):,} bytes: {json.dumps(entry)}", file=sys.stderr)
            finally:
                for ch in channels.values():
                    ch.close()
    return report


def _spread(values: list[float]) -> tuple[float, float]:
    return (min(values), max(values)) if values else (0.0, 0.0)


def _table(report: dict[str, Any]) -> str:
    title = (
        f"`python -m benchmarks.serve_front_bench` ({report['rounds']} rounds of {report['calls']} calls per front "
        "and size, order alternating; CPU of the serve-local process per call; ratios gate ÷ Python, median "
        "[min-max] over the rounds)"
    )
    lines = [
        title,
        "",
        "| request bytes | p50 gate / Python (ms) | p50 ratio | CPU per call gate / Python (ms) | CPU ratio |",
        "|---|---|---|---|---|",
    ]
    for e in report["sizes"].values():
        lr, cr = e["p50_ratio"], e["cpu_ratio"]
        lines.append(
            f"| {e['bytes']:,} | {e['p50_ms']['gate']:.2f} / {e['p50_ms']['python']:.2f} | "
            f"**{lr[0]:.2f}x** [{lr[1]:.2f}-{lr[2]:.2f}] | {e['cpu_ms']['gate']:.2f} / {e['cpu_ms']['python']:.2f} | "
            f"**{cr[0]:.2f}x** [{cr[1]:.2f}-{cr[2]:.2f}] |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[4_000, 1_000_000, 5_300_000]
    )
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--calls", type=int, default=60)
    p.add_argument(
        "--write", type=Path, default=None, help="rewrite this benchmark's section of this Markdown file"
    )
    args = p.parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=1))
    print(_table(report))
    if args.write is not None:
        write_section(args.write, BEGIN, END, _table(report), "## serve-local's gRPC fronts")
    return 0


if __name__ == "__main__":
    sys.exit(main())

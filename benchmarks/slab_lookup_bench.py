"""One shard's ``lookup`` in process, slab vs hash layout, call by call: what the lookup graph itself costs.

    .venv/bin/python -m benchmarks.slab_lookup_bench [--rows 250000] [--batch 128] [--calls 2000] [--shards 1]
                                                     [--trace] [--timeout-ms 0] [--serve-local]

Both layouts of a shard of ``--rows`` rows (dim 64) are exported to a temporary directory and loaded with the TF1
loader (``tf.compat.v1.saved_model.loader.load``, as ``tensorflow_model_server`` loads them), each in its own
session. Then ``--calls`` times: one batch of ``--batch`` random existing ids is looked up on both, the order
alternating, each ``Session.run`` timed. Printed: each layout's p10 / p50 and the median and quartiles of the
per-call ratio slab / hash (the same ids, the same moment of the machine). ``--rows 250000`` and ``1000000`` are the
shard sizes of the 1 M and 4 M ladder steps (4 shards); ``--batch 128`` is a 512-id batch split over 4 shards.
``--shards 4``: four shards of ``--rows`` per layout, each batch one call per shard from four threads at once (a
512-id batch of the ladder, as serve-local runs its shards' calls: do concurrent calls of the slab's many-op graph
queue on TensorFlow's shared inter-op pool where the hash layout's one op does not?); the time of a batch is until
its last call returns; the process's CPU time per batch is printed too. ``--timeout-ms N``: every call with
``RunOptions(timeout_in_ms=N)``, as serve-local and ``tensorflow_model_server`` run a request that has a deadline
(TensorFlow's session then runs the step asynchronously instead of on the calling thread). ``--trace``: also the
median time of every op of each graph (first shard) over 50 traced runs (``RunOptions.FULL_TRACE``), the profile
that showed the slab lookup's costs (docs/benchmarks.md "Slab vs hash, interleaved"), and how many nodes each
executes per call.

``--serve-local``: instead of in process, one serve-local serving the shards of both layouts (twice ``--shards``
models in the same process, so both share its pools, allocator and gRPC server) is called over gRPC, per batch one
``lookup`` call per shard (concurrently with ``--shards 4``) on each layout, the order alternating; ``--calls`` is
rounded to blocks of 100 batches per layout, blocks alternating too. Printed as above plus the server's CPU time
per batch of each layout (the threads' run time from ``/proc/<pid>/task/*/schedstat`` summed over a block, divided
by its batches) and the per-block ratio. Every call carries a 30 s deadline, as the gateway's do. Where the
in-process ratio and this one differ, the difference lies between the graph and the answer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["main"]

LAYOUTS = ("hash", "slab")


def _load(path: Path) -> tuple[Any, str, str]:
    """(session, ids tensor name, values tensor name) of the shard at ``path``."""
    import tensorflow as tf

    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(path))
    sig = meta.signature_def["lookup"]
    return session, sig.inputs["t_ids"].name, sig.outputs["t_values"].name


def _trace(session: Any, ids_name: str, out_name: str, batches: list[Any]) -> list[tuple[float, str]]:
    """(median µs, op) of the 12 slowest ops over the traced runs of ``batches``."""
    from tensorflow.core.protobuf import config_pb2

    times: dict[str, list[float]] = {}
    for ids in batches:
        meta = config_pb2.RunMetadata()
        options = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE)
        session.run(out_name, {ids_name: ids}, options=options, run_metadata=meta)
        for dev in meta.step_stats.dev_stats:
            for node in dev.node_stats:
                op = node.timeline_label.split("(")[0].split(" = ")[-1]
                times.setdefault(f"{node.node_name.rsplit('/', 1)[-1]} ({op})", []).append(
                    node.all_end_rel_micros
                )
    return sorted(((statistics.median(t), k) for k, t in times.items()), reverse=True)[:12]


def _node_count(session: Any, ids_name: str, out_name: str, ids: Any) -> int:
    """Nodes one traced run of the lookup executes (step_stats), sends, receives and the feed included."""
    from tensorflow.core.protobuf import config_pb2

    meta = config_pb2.RunMetadata()
    options = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE)
    session.run(out_name, {ids_name: ids}, options=options, run_metadata=meta)
    return sum(len(dev.node_stats) for dev in meta.step_stats.dev_stats)


def _cpu_ns(pid: int) -> int:
    """Nanoseconds every thread of ``pid`` has run (``/proc/<pid>/task/*/schedstat``, first field); threads that
    exited meanwhile are not counted (serve-local's pools are long-lived)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _serve_local(
    args: argparse.Namespace, paths: dict[str, list[Path]], ids: list[Any], rng: Any, pool: ThreadPoolExecutor
) -> None:
    """The ``--serve-local`` measure (module docstring): per-batch latency and server CPU per batch, interleaved."""
    import grpc

    from schemas.manifest import lookup_ids_input, lookup_values_output
    from schemas.proto import tfs_pb2
    from schemas.tensors import from_ndarray, to_ndarray
    from tests.support.servers import serve_local

    block = 100
    blocks = max(1, args.calls // block)
    served = {f"ps_{lay}_{s}": path.parent for lay in LAYOUTS for s, path in enumerate(paths[lay])}
    with serve_local(served) as server, grpc.insecure_channel(server.target) as channel:
        predict = channel.unary_unary(
            "/tensorflow.serving.PredictionService/Predict",
            request_serializer=tfs_pb2.PredictRequest.SerializeToString,
            response_deserializer=tfs_pb2.PredictResponse.FromString,
        )

        def one(name: str, batch: Any) -> None:
            req = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name=name, signature_name="lookup"))
            req.inputs[lookup_ids_input("t")].CopyFrom(from_ndarray(batch))
            to_ndarray(predict(req, timeout=30).outputs[lookup_values_output("t")])

        def call(lay: str, batch: list[Any]) -> None:
            """One call per shard, concurrently (one thread each) when there are several."""
            if len(batch) == 1:
                one(f"ps_{lay}_0", batch[0])
                return
            for done in [pool.submit(one, f"ps_{lay}_{s}", b) for s, b in enumerate(batch)]:
                done.result()

        def draw() -> list[Any]:
            return [rng.choice(mine, args.batch) for mine in ids]

        for _ in range(100):  # warm-up
            batch = draw()
            for lay in LAYOUTS:
                call(lay, batch)
        times: dict[str, list[float]] = {lay: [] for lay in LAYOUTS}
        cpu: dict[str, list[float]] = {lay: [] for lay in LAYOUTS}
        for k in range(blocks):
            batches = [draw() for _ in range(block)]
            for lay in LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]:
                c0 = _cpu_ns(server.proc.pid)
                for b in batches:
                    t0 = time.perf_counter()
                    call(lay, b)
                    times[lay].append(time.perf_counter() - t0)
                cpu[lay].append((_cpu_ns(server.proc.pid) - c0) / block / 1e9)
    _print(args, times, "serve-local, one process serving both layouts")
    ratios = [a / b for a, b in zip(cpu["slab"], cpu["hash"], strict=True)]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    for lay in LAYOUTS:
        print(f"  {lay}: server CPU per batch median {statistics.median(cpu[lay]) * 1e6:.0f} us")
    print(f"  per-block server CPU slab / hash: median {q[1]:.3f} (quartiles {q[0]:.3f}-{q[2]:.3f})")


def _print(args: argparse.Namespace, times: dict[str, list[float]], where: str) -> None:
    ratios = [a / b for a, b in zip(times["slab"], times["hash"], strict=True)]
    q = statistics.quantiles(ratios, n=4)
    print(
        f"{args.rows:,} rows a shard, {args.shards} shard(s) called concurrently, {args.batch} ids a shard, "
        f"{len(ratios)} calls per layout (alternating; {where})"
    )
    for lay in LAYOUTS:
        dec = statistics.quantiles(times[lay], n=10)
        print(f"  {lay}: p10 {dec[0] * 1e6:.0f} us, p50 {statistics.median(times[lay]) * 1e6:.0f} us")
    print(f"  per-call slab / hash: median {q[1]:.3f} (quartiles {q[0]:.3f}-{q[2]:.3f})")


def _timed_calls(
    sessions: dict[str, list[tuple[Any, str, str]]],
    batches: list[list[Any]],
    pool: ThreadPoolExecutor,
    options: Any = None,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Seconds per batch on each layout, and the process CPU seconds per batch of each (mean): a batch is one id
    array per shard, the shards called concurrently from ``pool`` (one thread each, as serve-local's gRPC threads
    would), the order of the layouts alternating. ``options``: the ``RunOptions`` of every call (None: none)."""
    times: dict[str, list[float]] = {lay: [] for lay in LAYOUTS}
    cpu = dict.fromkeys(LAYOUTS, 0.0)
    for k, batch in enumerate(batches):
        for lay in LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]:
            c0, t0 = time.process_time(), time.perf_counter()
            calls = [
                pool.submit(s.run, o, {i: b}, options=options)
                for (s, i, o), b in zip(sessions[lay], batch, strict=True)
            ]
            for call in calls:
                call.result()
            times[lay].append(time.perf_counter() - t0)
            cpu[lay] += time.process_time() - c0
    return times, {lay: spent / len(batches) for lay, spent in cpu.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=250_000, help="rows per shard")
    ap.add_argument("--batch", type=int, default=128, help="ids per shard and call")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--shards", type=int, default=1, help="shards per layout, called concurrently per batch")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument(
        "--timeout-ms",
        type=int,
        default=0,
        help="in process: run every call with RunOptions.timeout_in_ms (as a request deadline makes serve-local "
        "and TF Serving do; 0: none)",
    )
    ap.add_argument("--serve-local", action="store_true", help="call one serve-local over gRPC")
    args = ap.parse_args(argv)
    if min(args.rows, args.batch, args.calls, args.shards) <= 0:
        ap.error("--rows, --batch, --calls and --shards must be positive")
    import numpy as np

    from embedgate.export.ps import write_ps_shard
    from schemas.manifest import PsLayout, TableSpec

    spec = [TableSpec(name="t", dim=64)]
    # sparse ids, as hashed ids are; shard s holds the ids = s (mod shards)
    ids = [(np.arange(args.rows, dtype=np.int64) * args.shards + s) * 4 + 1 for s in range(args.shards)]
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="slab-lookup-") as tmp, ThreadPoolExecutor(args.shards) as pool:
        sessions: dict[str, list[tuple[Any, str, str]]] = {lay: [] for lay in LAYOUTS}
        paths: dict[str, list[Path]] = {}
        for lay in LAYOUTS:
            for s in range(args.shards):
                values = np.random.default_rng(s).standard_normal((args.rows, 64), dtype=np.float32)
                path = Path(tmp) / f"{lay}_{s}" / "1"
                write_ps_shard(path, spec, {"t": (ids[s], values)}, layout=PsLayout(lay))
                paths.setdefault(lay, []).append(path)
                if not args.serve_local:
                    sessions[lay].append(_load(path))
        if args.serve_local:
            _serve_local(args, paths, ids, rng, pool)
            return 0

        def batches(n: int) -> list[list[Any]]:
            return [[rng.choice(mine, args.batch) for mine in ids] for _ in range(n)]

        options = None
        if args.timeout_ms:
            import tensorflow as tf

            options = tf.compat.v1.RunOptions(timeout_in_ms=args.timeout_ms)
        _timed_calls(sessions, batches(100), pool, options)  # warm-up
        times, cpu = _timed_calls(sessions, batches(args.calls), pool, options)
        _print(args, times, f"in process, timeout_in_ms {args.timeout_ms}")
        print(
            f"  process CPU per batch: hash {cpu['hash'] * 1e6:.0f} us, slab {cpu['slab'] * 1e6:.0f} us "
            f"(slab / hash {cpu['slab'] / cpu['hash']:.3f})"
        )
        if args.trace:
            for lay in LAYOUTS:
                s, i, o = sessions[lay][0]
                top = _trace(s, i, o, [rng.choice(ids[0], args.batch) for _ in range(50)])
                nodes = _node_count(s, i, o, rng.choice(ids[0], args.batch))
                print(
                    f"  {lay}: {nodes} nodes a call; ops (median us): "
                    + ", ".join(f"{name} {us:.0f}" for us, name in top)
                )
        for shard_sessions in sessions.values():
            for s, _, _ in shard_sessions:
                s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The cached gRPC path's in-process stages on the DLRM model, each native step against what it replaces.

    python -m benchmarks.dlrm_stages [--batches 512,2048] [--traffic one_user,random] [--rounds 5] [--reps 30]
    python -m benchmarks.dlrm_stages --traffic demo [--batches 1,64,512,4096]

No server and no export: the DLRM manifest of ``benchmarks.dlrm_bench`` (26 single features over 26 tables of dim 64,
13 dense values, 2 shards, a float32 ``unique_rows`` entry) is built directly, the request is the one dlrm_bench
sends (``tensor_content`` tensors), and a hot-row cache holds every row the batch reads, as on a warm gateway.
``--traffic demo`` takes the small demo model's manifest instead (built as ``make run`` builds it) and the request
the other benchmarks' load generators send it (``benchmarks.serving_bench._gateway_grpc_request``). Per
stage, two variants, timed in interleaved rounds (thread CPU, median of ``--reps`` calls per round; the table gives
the median over rounds and its spread):

* ``spec sizes``: ``check_spec_sizes_reference`` (Python) vs the native reading (native/src/spec_sizes.rs);
* ``shape check``: ``check_tensor`` over the parsed request's inputs vs ``input_bytes`` (native/src/shape_check.rs);
* ``features``: ``batch_from_tensors`` of the parsed request vs ``gateway.native.tensor_features`` of its bytes;
* ``read path``: plan + ``RowCache.get_many`` + ``entry_request`` (the general path, each step already native) vs
  ``RowCache.cached_entry_request`` (native/src/hot.rs, one call).

Both variants of a stage are checked to give the same result before timing.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.dlrm_bench import DENSE, DIM, cardinalities, traffic
from gateway import native
from gateway.cache import RowCache
from gateway.embedding import entry_request, plan_lookups
from gateway.grpc_front.features import batch_from_tensors
from gateway.grpc_front.messages import (
    check_spec_sizes,
    check_spec_sizes_reference,
    check_tensor,
    input_bytes,
    parse_message,
)
from schemas.gateway_settings import LimitsSettings
from schemas.manifest import Manifest
from schemas.proto import tfs_pb2
from schemas.wire import predict_request_for

_SPEC = tfs_pb2.ModelSpec(name="dlrm__entry", signature_name="serving_default")


def dlrm_manifest(cards: list[int]) -> Manifest:
    return Manifest.model_validate(
        {
            "model_name": "dlrm",
            "version": 1,
            "tables": [{"name": f"t{i}", "dim": DIM, "rows": c} for i, c in enumerate(cards)],
            "sparse_features": [{"name": f"s{i}", "table": f"t{i}"} for i in range(len(cards))],
            "dense_features": [{"name": "dense", "dim": DENSE}],
            "partition": {"num_shards": 2},
            "entry": {"outputs": [{"name": "ctr", "shape": [1]}], "input_mode": "unique_rows"},
        }
    )


def _cpu_us(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.thread_time_ns()
        fn()
        times.append(time.thread_time_ns() - start)
    return statistics.median(times) / 1e3


def _stages(manifest: Manifest, raw: bytes) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    parsed = parse_message(tfs_pb2.PredictRequest, raw, LimitsSettings(), 1 << 30).message
    batch = batch_from_tensors(parsed.inputs, manifest)
    fast = native.tensor_features(raw, manifest)
    assert fast is not None and all(
        np.array_equal(fast.sparse[k].ids, v.ids) for k, v in batch.sparse.items()
    ), "the native features differ from the reference's"
    plan = plan_lookups(batch, manifest)
    rng = np.random.default_rng(0)
    cache = RowCache("dlrm", {t.name: t.dim for t in manifest.tables}, 1 << 34, settle_s=0.0)
    cache.set_serving(True)
    for shard in plan.shard_ids:
        for table, ids in shard.items():
            if ids.size:
                rows = rng.random((ids.size, manifest.table(table).dim), np.float32)
                cache.fill(cache.begin_read(), table, ids, rows)
    head = tfs_pb2.PredictRequest(model_spec=_SPEC).SerializeToString()

    def general() -> bytes:
        p = plan_lookups(batch, manifest)
        _, found, missed = cache.get_many(p.shard_ids)
        assert not missed
        return entry_request(_SPEC, p, found, batch, manifest)

    assert general() == cache.cached_entry_request(head, batch, manifest), "the one-call request differs"
    limits = LimitsSettings()

    def shapes_reference() -> int:
        return sum(check_tensor(f"input {k!r}", t, limits, 1 << 30) for k, t in parsed.inputs.items())

    assert shapes_reference() == input_bytes(parsed, raw, limits, 1 << 30), "the shape checks differ"
    return {
        "spec sizes": (lambda: check_spec_sizes_reference(raw), lambda: check_spec_sizes(raw)),
        "shape check": (shapes_reference, lambda: input_bytes(parsed, raw, limits, 1 << 30)),
        "features": (
            lambda: batch_from_tensors(parsed.inputs, manifest),
            lambda: native.tensor_features(raw, manifest),
        ),
        "read path": (general, lambda: cache.cached_entry_request(head, batch, manifest)),
    }


def _dlrm_request(kind: str, batch: int, cards: list[int]) -> tuple[Manifest, bytes]:
    raw = predict_request_for(
        tfs_pb2.ModelSpec(name="dlrm"), list(traffic(kind, batch, cards, batch).items())
    )
    return dlrm_manifest(cards), raw


def _demo_request(batch: int) -> tuple[Manifest, bytes]:
    """The small demo model's manifest and the gRPC request of ``batch`` examples the load generators send it."""
    from benchmarks.serving_bench import _gateway_grpc_request
    from embedgate.export.demo import make_examples

    manifest = _demo_manifest()
    instances, _ = make_examples(batch, 5_000, seed=batch)
    return manifest, _gateway_grpc_request(instances, manifest)


@functools.cache
def _demo_manifest() -> Manifest:
    from embedgate.export.demo import build_demo

    with tempfile.TemporaryDirectory(prefix="dlrm-stages-demo-") as tmp:
        manifest: Manifest = build_demo(Path(tmp) / "demo", small=True).manifest
    return manifest


def run(args: argparse.Namespace) -> list[str]:
    if native.path() != "native":
        raise SystemExit("the native module is not built or EMBEDGATE_NATIVE=off (make install)")
    cards = cardinalities(args.rows)
    command = (
        f"Command: `python -m benchmarks.dlrm_stages --batches {args.batches} --traffic {args.traffic} "
        f"--rounds {args.rounds} --reps {args.reps}`"
    )
    lines = [
        command,
        "",
        "| traffic / batch | stage | before (µs) | native (µs) | before ÷ native (spread over rounds) |",
        "|---|---|---|---|---|",
    ]
    for kind in args.traffic.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            manifest, raw = _demo_request(batch) if kind == "demo" else _dlrm_request(kind, batch, cards)
            stages = _stages(manifest, raw)
            times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in stages}
            for r in range(args.rounds):
                for name, (before, after) in stages.items():
                    pair = [(0, before), (1, after)] if r % 2 == 0 else [(1, after), (0, before)]
                    for k, fn in pair:
                        times[name][k].append(_cpu_us(fn, args.reps))
            for name, (before_us, after_us) in times.items():
                ratios = [b / a for b, a in zip(before_us, after_us, strict=True)]
                lines.append(
                    f"| {kind}/{batch} | {name} | {statistics.median(before_us):.0f} | "
                    f"{statistics.median(after_us):.0f} | {statistics.median(ratios):.2f}x "
                    f"({min(ratios):.2f}-{max(ratios):.2f}) |"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_780_000, help="rows over the 26 tables (as dlrm_bench)")
    p.add_argument("--batches", default="512,2048")
    p.add_argument(
        "--traffic",
        default="one_user,random",
        help="one_user, random (the DLRM model) or demo (the demo model)",
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args(argv)
    print("\n".join(run(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

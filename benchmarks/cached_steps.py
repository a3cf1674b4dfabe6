"""The all-cached gRPC Predict's two native steps in a hot loop (issue 17): what ``tensor_features`` (the request's
features) and the cache's ``cached_entry_request`` (plan, cache read, the entry's request) cost per call when nothing
else runs, to set beside the gateway loop's CPU per request while serving (``benchmarks.gateway_perf_profile
--profiler threads``; docs/benchmarks.md "Where the cached gRPC path's time goes").

The small demo model's manifest, a hot-row cache holding every row of the batch, the gRPC request the benchmarks'
load generators send (``benchmarks.serving_bench._gateway_grpc_request``); each step timed over ``--calls`` calls,
in process, one thread. No servers, no network.

    python -m benchmarks.cached_steps [--batches 1,64,512,4096] [--calls 2000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64, 512, 4096])
    p.add_argument("--calls", type=int, default=2000, help="per step and batch (at most 100,000)")
    args = p.parse_args(argv)
    calls = max(1, min(args.calls, 100_000))

    import numpy as np

    from benchmarks.serving_bench import _gateway_grpc_request
    from embedgate.export.demo import build_demo, make_examples
    from gateway import native
    from gateway.cache import RowCache
    from gateway.embedding import plan_lookups
    from schemas.proto import tfs_pb2

    if native.path() != "native":
        print("the native module is not built or EMBEDGATE_NATIVE=off (make install)", file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    print("| batch | request bytes | tensor_features µs | cached_entry_request µs |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="cached-steps-") as tmp:
        m = build_demo(Path(tmp) / "demo", small=True).manifest
        head = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name="demo__entry")).SerializeToString()
        for b in args.batches:
            instances, _ = make_examples(b, 5_000, seed=b)
            raw = _gateway_grpc_request(instances, m)
            batch = native.tensor_features(raw, m)
            if batch is None:
                print(f"batch {b}: the native reader declined the request", file=sys.stderr)
                return 1
            cache = RowCache(m.model_name, {t.name: t.dim for t in m.tables}, 1 << 28, settle_s=0.0)
            cache.set_serving(True)
            for ids in plan_lookups(batch, m).shard_ids:
                for table, arr in ids.items():
                    rows = rng.random((len(arr), m.table(table).dim), dtype=np.float32)
                    token = cache.begin_read()
                    cache.fill(token, table, arr, rows)
                    cache.end_read(token)
            if cache.cached_entry_request(head, batch, m) is None:
                print(f"batch {b}: a row is missing from the cache", file=sys.stderr)
                return 1
            n = max(1, calls * 64 // max(64, b))
            steps = (
                _per_call_us(partial(native.tensor_features, raw, m), n),
                _per_call_us(partial(cache.cached_entry_request, head, batch, m), n),
            )
            print(f"| {b} | {len(raw)} | " + " | ".join(f"{x:.1f}" for x in steps) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

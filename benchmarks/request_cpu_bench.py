"""Gateway CPU per embedding request, without I/O: JSON body -> features -> lookup plan -> pooled entry inputs.

Uses a manifest shaped like the demo model (7 single + 2 multi features over 7 tables, dim 16, 2 dense inputs,
2 shards) and Zipf-distributed ids. Prints the per-request CPU time (process time, best of ``--repeat``) of each stage at
several batch sizes.

    python -m benchmarks.request_cpu_bench [--batches 1 64 512 4096] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
from typing import Any

import numpy as np
import orjson

from gateway.embedding import plan_lookups, pool
from gateway.features import batch_from_instances
from schemas.manifest import Manifest
from schemas.proto import tfs_pb2
from schemas.tensors import from_ndarray

_SINGLE = {
    "user_id": "user_emb",
    "item_id": "item_emb",
    "category": "cat_emb",
    "brand": "brand_emb",
    "city": "city_emb",
    "device": "device_emb",
    "hour": "hour_emb",
}
DIM = 16


def demo_like_manifest(num_shards: int = 2) -> Manifest:
    sparse: list[dict[str, Any]] = [{"name": f, "table": t} for f, t in _SINGLE.items()]
    sparse += [
        {"name": "history", "table": "item_emb", "kind": "multi", "combiner": "mean", "max_ids": 10},
        {
            "name": "tags",
            "table": "tag_emb",
            "kind": "multi",
            "combiner": "sqrtn",
            "weights": "tags_weights",
            "max_ids": 8,
        },
    ]
    return Manifest.model_validate(
        {
            "model_name": "demo",
            "version": 1,
            "tables": [{"name": t, "dim": DIM} for t in sorted({*_SINGLE.values(), "tag_emb"})],
            "sparse_features": sparse,
            "dense_features": [{"name": "price", "dim": 1}, {"name": "user_stats", "dim": 4}],
            "partition": {"num_shards": num_shards},
            "entry": {"outputs": [{"name": "score", "shape": [1]}]},
        }
    )


def instances(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)

    def zipf(size: int | None = None) -> Any:
        return np.minimum(rng.zipf(1.2, size), 100_000).tolist()

    out = []
    for _ in range(n):
        tags = int(rng.integers(0, 9))
        out.append(
            {
                **{f: zipf() for f in _SINGLE},
                "history": zipf(int(rng.integers(0, 11))),
                "tags": rng.integers(0, 200, tags).tolist(),
                "tags_weights": rng.random(tags).round(3).tolist(),
                "price": round(float(rng.random()), 4),
                "user_stats": rng.random(4).round(4).tolist(),
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 512, 4096])
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    manifest = demo_like_manifest()
    rows = []
    for n in args.batches:
        body = json.dumps({"instances": instances(n)}).encode()
        doc = orjson.loads(body)
        batch = batch_from_instances(doc["instances"], manifest)
        plan = plan_lookups(batch, manifest)
        values = [
            {t: np.ones((ids.size, DIM), dtype=np.float32) for t, ids in shard.items()}
            for shard in plan.shard_ids
        ]

        # the closures run before the next iteration rebinds their variables
        def parse() -> None:
            batch_from_instances(orjson.loads(body)["instances"], manifest)  # noqa: B023

        def plan_fn() -> None:
            plan_lookups(batch, manifest)  # noqa: B023

        def pool_fn() -> None:
            pooled = pool(plan, values, batch, manifest)  # noqa: B023
            req = tfs_pb2.PredictRequest()
            for k, arr in {**pooled, **batch.dense}.items():  # noqa: B023
                req.inputs[k].CopyFrom(from_ndarray(arr, tfs_pb2.DataType.DT_FLOAT))

        row = {"batch": n}
        for name, fn in (("parse", parse), ("plan", plan_fn), ("pool+encode", pool_fn)):
            number = max(1, 2000 // n)
            # process CPU time, best of --repeat: the machine is shared, the minimum is the cost without noise
            times = timeit.repeat(fn, number=number, repeat=args.repeat, timer=time.process_time)
            row[name] = min(times) / number * 1e3
        rows.append(row)
        print(
            f"batch {n:5d}: parse {row['parse']:8.3f} ms  plan {row['plan']:7.3f} ms  "
            f"pool+encode {row['pool+encode']:7.3f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""The hot-row cache's read of one DLRM-shaped request, in process: CPU and page faults per read (issue 17).

    .venv/bin/python -m benchmarks.cache_read_bench [--rows-per-table 250] [--reads 400] [--rounds 3]

One ``RowCache`` of 26 tables (dim 64, the DLRM model of ``benchmarks.dlrm_bench``), every table holding about
``--rows-per-table`` rows split over 2 shards; a read asks for all of them (``RowCache.get_many``, all hits: about
6,500 rows, 1.6 MB, as a one-user batch of 512 of that model). Four variants, each in a fresh process (glibc reads
its malloc variables at start), interleaved over ``--rounds``:

* ``native`` / ``reference``: the native ``SlotIndex.read`` / the ``dict`` index and numpy (``EMBEDGATE_NATIVE=off``);
* with glibc's dynamic thresholds (``dynamic``) or fixed as the gateway fixes them by default (``fixed``:
  ``malloc_mmap_threshold_bytes`` 32 MiB, trim threshold 64 MiB, set through ``MALLOC_MMAP_THRESHOLD_`` and
  ``MALLOC_TRIM_THRESHOLD_``).

Prints, per variant, the median over rounds (min-max) of the CPU µs and minor page faults per read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main"]

_REPO = Path(__file__).resolve().parents[1]
TABLES, DIM, SHARDS = 26, 64, 2
VARIANTS = {
    "native, dynamic": {},
    "native, fixed": {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)},
    "reference, dynamic": {"EMBEDGATE_NATIVE": "off"},
    "reference, fixed": {
        "EMBEDGATE_NATIVE": "off",
        "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
        "MALLOC_TRIM_THRESHOLD_": str(64 << 20),
    },
}


def measure(rows_per_table: int, reads: int) -> dict[str, float]:
    """CPU µs and minor faults per ``get_many`` of every row held (this process's settings)."""
    import numpy as np

    from gateway.cache import RowCache

    rng = np.random.default_rng(0)
    dims = {f"t{i}": DIM for i in range(TABLES)}
    cache = RowCache("bench", dims, 1 << 32, settle_s=0.0)
    cache.set_serving(True)
    shard_ids: list[dict[str, np.ndarray]] = [{} for _ in range(SHARDS)]
    token = cache.begin_read()
    for t in dims:
        ids = np.unique(rng.integers(0, 100 * rows_per_table, rows_per_table)).astype(np.int64)
        cache.fill(token, t, ids, rng.normal(size=(ids.size, DIM)).astype(np.float32))
        for s in range(SHARDS):
            shard_ids[s][t] = ids[ids % SHARDS == s]
    for _ in range(min(reads, 50)):  # warm: the heap reaches its steady size
        cache.get_many(shard_ids)
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.process_time()
    for _ in range(reads):
        _, found, missed = cache.get_many(shard_ids)
    cpu = time.process_time() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert missed == 0
    return {
        "cpu_us": cpu / reads * 1e6,
        "minflt": (after.ru_minflt - before.ru_minflt) / reads,
        "rows": float(sum(v.shape[0] for d in found for v in d.values())),
    }


def _child(variant: str, rows_per_table: int, reads: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | VARIANTS[variant]
    cmd = [sys.executable, "-m", "benchmarks.cache_read_bench", "--child", str(rows_per_table), str(reads)]
    out = subprocess.run(cmd, env=env, cwd=_REPO, capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows-per-table", type=int, default=250)
    p.add_argument("--reads", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child)))
        return 0
    got: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    names = list(VARIANTS)
    for r in range(args.rounds):
        for v in names[r % len(names) :] + names[: r % len(names)]:  # rotated order
            got[v].append(_child(v, args.rows_per_table, args.reads))
    rows = int(got[names[0]][0]["rows"])
    print(
        f"Command: `python -m benchmarks.cache_read_bench --rows-per-table {args.rows_per_table} --reads "
        f"{args.reads} --rounds {args.rounds}`; {rows:,} rows a read; load average {os.getloadavg()[0]:.1f}."
    )
    print("\n| variant | CPU µs per read, median (min-max) | minor faults per read |\n|---|---|---|")
    for v, runs in got.items():
        cpu = [x["cpu_us"] for x in runs]
        flt = statistics.median(x["minflt"] for x in runs)
        print(f"| {v} | {statistics.median(cpu):,.0f} ({min(cpu):,.0f}-{max(cpu):,.0f}) | {flt:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

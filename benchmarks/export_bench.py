"""Export time and PS resident memory per million rows at dim 64.

    .venv/bin/python -m benchmarks.export_bench [--rows 1000000] [--dim 64] [--shards 2] [--layouts hash,slab]

Every PS layout named by ``--layouts`` (``hash``, ``slab``, ``slab:float16`` ...) is exported and measured in the
same run; ratios are against the first.

1. Export: a Keras model with one ``Embedding(rows, dim)`` table (plus a small dense head) through
   :func:`embedgate.export.exporter.export_model` with ``--shards`` PS shards; wall time, and time per million rows.
2. PS memory: in a fresh subprocess, import TensorFlow, read VmRSS, load every PS shard with the TF1 loader
   (``tf.compat.v1.saved_model.loader.load``, as ``tensorflow_model_server`` does), run one ``lookup``, read VmRSS
   again; the difference per million rows is compared with the raw numpy bytes (8-byte key + 4*dim bytes per row).
   Then every row is upserted once more through each shard's ``upsert`` signature in 16 384-row calls, as the
   updater writes, and VmRSS read a third time: the PS then also holds a version per row (its state once the delta
   stream has touched every row, the figure to size a PS host by).

Bounded: ``--rows`` is capped at 5 million and the subprocess at 600 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

_CHILD = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
import numpy as np, tensorflow as tf
tf.constant(1.0) + 1  # initialise the runtime before the baseline
before = rss()
upsert, shards = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]  # "<shard dir>=<its ids .npy>"
sessions = []
for d, _ in shards:
    g = tf.Graph(); s = tf.compat.v1.Session(graph=g)
    with g.as_default():
        mg = tf.compat.v1.saved_model.loader.load(s, ["serve"], d)
    sd = mg.signature_def["lookup"]
    dim = s.run(sd.outputs["t_values"].name, {sd.inputs["t_ids"].name: np.arange(1000, dtype=np.int64)}).shape[1]
    rc = mg.signature_def["row_count"]
    rows = int(s.run(rc.outputs["t_rows"].name))
    sessions.append((s, mg, rows))
after = rss()
# every row written once more, as the updater writes (16 384-row upserts, a version per row): the PS then also holds
# each row's version, its state once the stream has touched every row
rng = np.random.default_rng(1)
for (s, mg, _), (_, ids_path) in zip(sessions, shards):
    sd = mg.signature_def[upsert]
    ids = np.load(ids_path)
    for start in range(0, ids.size, 16384):
        chunk = ids[start : start + 16384]
        feed = {
            "ids": chunk,
            "values": rng.normal(size=(chunk.size, dim)).astype(np.float32),
            "timestamps_ms": np.full(chunk.size, 1, np.int64),
            "seqs": np.arange(start, start + chunk.size, dtype=np.int64),
            "stream_partitions": np.zeros(0, object),
            "stream_offsets": np.zeros(0, np.int64),
            "stream_expected": np.zeros(0, np.int64),
        }
        s.run(sd.outputs["applied"].name, {sd.inputs[k].name: v for k, v in feed.items()})
rewritten = rss()
print(json.dumps({"before": before, "after": after, "rewritten": rewritten, "rows": sum(r for _, _, r in sessions)}))
"""


def _variants(text: str) -> list[tuple[str, str]]:
    """``"hash,slab,slab:float16"`` -> [(layout, row dtype)]."""
    out = []
    for item in text.split(","):
        layout, _, dtype = item.strip().partition(":")
        if layout not in ("hash", "slab") or dtype not in ("", "float32", "float16", "bfloat16"):
            raise SystemExit(f"--layouts: {item!r} is not hash, slab or slab:<float32|float16|bfloat16>")
        if layout == "hash" and dtype not in ("", "float32"):
            raise SystemExit(f"--layouts: {item!r}: the hash layout stores float32 only")
        out.append((layout, dtype or "float32"))
    return out


def _measure(model: Any, rows: int, dim: int, shards: int, layout: str, dtype: str) -> dict[str, float]:
    """Export ``model`` in one layout and measure its PS in a fresh subprocess: seconds, artifact bytes and RSS."""
    import numpy as np

    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model
    from schemas.manifest import PsLayout, upsert_signature
    from schemas.partition import shard_for

    decl = Declaration.model_validate(
        {
            "model_name": "bench",
            "sparse": [{"name": "f", "input": "t_ids_in", "table": "t", "pooled": "t_vec"}],
            "tables": {"t": {"row_dtype": dtype}},
        }
    )
    with tempfile.TemporaryDirectory(prefix="export-bench-") as tmp:
        t0 = time.perf_counter()
        result = export_model(model, decl, tmp, num_shards=shards, ps_layout=PsLayout(layout))
        seconds = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in Path(result.model_dir).rglob("*") if p.is_file())
        all_ids = np.arange(rows, dtype=np.int64)
        owner = shard_for(all_ids, shards)
        shard_args = []
        for i in range(shards):
            ids_path = Path(tmp) / f"ids_{i}.npy"
            np.save(ids_path, all_ids[owner == i])
            shard_args.append(f"{result.model_dir / f'ps_{i}' / '1'}={ids_path}")
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, upsert_signature("t"), *shard_args],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
    child = json.loads(out.stdout.strip().splitlines()[-1])
    assert child["rows"] == rows, child
    per_m = 1_000_000 / rows
    return {
        "seconds": seconds,
        "per_m_s": seconds * per_m,
        "size": size,
        "rss_mb": (child["after"] - child["before"]) / 1e6 * per_m,
        "rewritten_mb": (child["rewritten"] - child["before"]) / 1e6 * per_m,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument(
        "--layouts",
        default="hash,slab",
        help="comma-separated PS layouts measured in this run, each layout[:row dtype] (default hash,slab; e.g. "
        "hash,slab,slab:float16); ratios are against the first",
    )
    args = ap.parse_args(argv)
    rows = min(args.rows, 5_000_000)
    variants = _variants(args.layouts)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    import keras
    import numpy as np

    ids = keras.Input((), dtype="int64", name="t_ids_in")
    vec = keras.layers.Identity(name="t_vec")(keras.layers.Embedding(rows, args.dim, name="t")(ids))
    model = keras.Model(ids, keras.layers.Dense(1, name="y")(vec))
    layer = model.get_layer("t")
    layer.embeddings.assign(np.random.default_rng(0).normal(size=(rows, args.dim)).astype(np.float32))
    results = [(v, _measure(model, rows, args.dim, args.shards, *v)) for v in variants]
    raw_mb = (8 + 4 * args.dim) * 1_000_000 / 1e6
    raw_vec_mb = 4 * args.dim * 1_000_000 / 1e6
    cmd = (
        f"python -m benchmarks.export_bench --rows {rows} --dim {args.dim} --shards {args.shards} "
        f"--layouts {args.layouts}"
    )
    print(f"command: {cmd}")
    print(f"cpus: {os.cpu_count()}  rows: {rows}  dim: {args.dim}  shards: {args.shards}")
    print(
        f"raw numpy: {raw_vec_mb:.0f} MB float32 vectors per million rows ({raw_mb:.0f} MB with int64 keys)"
    )
    base = results[0][1]
    for (layout, dtype), r in results:
        name = layout if dtype == "float32" else f"{layout}:{dtype}"
        print(
            f"[{name}] export time: {r['seconds']:.1f} s total, {r['per_m_s']:.1f} s per million rows "
            f"({r['per_m_s'] / base['per_m_s']:.2f}x {results[0][0][0]}); artifact {r['size'] / 1e6:.0f} MB"
        )
        print(
            f"[{name}] PS resident memory after load (TF1 loader, all shards): {r['rss_mb']:.0f} MB per million "
            f"rows = {r['rss_mb'] / raw_vec_mb:.2f}x raw float32 vectors ({r['rss_mb'] / raw_mb:.2f}x with keys); "
            f"{r['rss_mb'] / base['rss_mb']:.2f}x {results[0][0][0]}"
        )
        print(
            f"[{name}] after every row is upserted once more (row versions held too): {r['rewritten_mb']:.0f} MB "
            f"per million rows = {r['rewritten_mb'] / raw_vec_mb:.2f}x raw float32 vectors; "
            f"{r['rewritten_mb'] / base['rewritten_mb']:.2f}x {results[0][0][0]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

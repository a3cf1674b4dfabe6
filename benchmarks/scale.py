"""Scale ladder: how export, load, memory, lookup latency, update rate and replay grow with the PS tables.

    .venv/bin/python -m benchmarks.scale [--rows 1000000,4000000,16000000] [--layouts hash,slab] [--dim 64]
                                         [--shards 4] [--updater-rows 400000] [--lookups 200] [--quick]
                                         [--write docs/benchmarks.md] [--plots docs/img] [--json FILE]
                                         [--include FILE ...] [--report-only]

``--layouts`` also takes ``slab:float16`` and ``slab:bfloat16`` (reduced-precision rows; RSS still compared with raw
float32 rows).

One PS-only model per (rows, layout) step: one table ``t`` of ``--dim`` with ids ``0 .. rows-1`` (standard normal
rows) hash-partitioned over ``--shards`` shards. Sizes run in increasing order, the layouts of one size one after
another (so the ratios between layouts come from the same minutes of the machine). All on 127.0.0.1, a real Kafka
broker for the whole run, ``serve-local`` (the TF1 loader, ``tf.compat.v1.saved_model.loader.load``, as
``tensorflow_model_server`` loads a SavedModel) with the ``--shards`` shards in one process, the ``embedgate updater``
as its own process. Per step:

1. **export**: every shard written by :func:`embedgate.export.ps.write_ps_shard` (the PS half of ``embedgate
   export``; the entry does not grow with the tables) in a child process; wall time of the writes (row generation
   excluded), after one untimed write of an empty shard (the process's one-time costs: the first ``tf.function``
   trace and SavedModel save, paid once per ``embedgate export``, not per row). Just before each shard, the same
   shard without rows is written and timed too: the JSON's ``export_fixed_s`` (tracing and saving the signatures,
   which does not grow with the rows; ``export_s - export_fixed_s`` is the part that does).
2. **load**: serve-local started on the shards; time until every shard is AVAILABLE (process start included: the
   empty step's figure is that fixed part).
3. **RSS after load**: serve-local's resident memory after one lookup per shard, minus the same for an empty PS of the
   same layout measured at the start of the run (the TensorFlow runtime), per million rows and against raw float32
   rows (``4 * dim`` bytes a row).
4. **lookup p50**: ``--lookups`` batches of 512 random existing ids, each split by shard and sent as concurrent
   ``lookup`` Predict calls (as the gateway does), after 20 warm-up batches; median time per batch.
5. **upsert rows/s through the updater**: ``--updater-rows`` rows (existing ids ``0 ..``) published to the model's
   delta topic while the updater is stopped (SIGSTOP), then the updater continued (the backlog drain of
   ``benchmarks.updater_bench``); its ``rows_applied`` counter polled every 10 ms: the rows applied after the first
   poll that saw the counter move, divided by the time from that poll until all were applied (so the updater's
   rejoin of its consumer group after the stop is not counted).
6. **RSS after rewrite** and **direct upsert rows/s**: every row written once more by direct ``upsert_t`` calls of
   about 16 384 rows (as the updater writes; shards concurrently, one call at a time per shard), timed (rows / wall
   time: the PS's own write rate at this size, without Kafka), then serve-local's RSS again (the PS now holds a
   version per row: the figure to size a PS host by), read 3 s after the last write (serve-local returns freed
   malloc memory to the OS every 2 s, docs/serve-local.md "Memory").
7. **replay after a replica restart**: serve-local stopped and started again on the same port (the exported rows
   again, no stream position); the updater notices and replays the topic (the ``--updater-rows`` rows) into it.
   Time from the restart (the new process started) until a sample of the published ids (every 97th and the last
   512) reads the published rows: the reload plus the replay, which starts as soon as the replica answers and so
   overlaps the readiness polling (the reload alone is reported as ``reload_s``).

A step with ``rows`` >= 16 000 000 runs only if ``/proc/meminfo`` MemAvailable is at least 14 GB at that moment
(the machine is shared); a skipped step is reported as such. Bounded: every wait has a time limit; every process
started is stopped on every exit path. ``--write FILE`` rewrites the ``scale`` section of FILE (between its markers)
with the table; ``--plots DIR`` writes one PNG per measure against rows (``scale_<measure>.png``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.report import markers, write_section

__all__ = ["BEGIN", "END", "main"]

BEGIN, END = markers("scale")

_REPO = Path(__file__).resolve().parent.parent
_PREDICT = "/tensorflow.serving.PredictionService/Predict"
_TABLE = "t"
_ROWS_PER_CALL = 16384
_BATCH = 512
_BIG = 16_000_000
_BIG_NEEDS_GB = 14.0
_WAIT_S = 900.0
_QUICK_ROWS = "100000,200000,400000"
_SETTLE_S = 3.0  # after the rewrite, before its RSS: more than serve-local's malloc trim interval

MEASURES: dict[str, tuple[str, str]] = {  # key -> (column title, unit)
    "export_s": ("export", "s"),
    "load_s": ("load", "s"),
    "rss_mb": ("RSS after load", "MB"),
    "rss_rewritten_mb": ("RSS after rewrite", "MB"),
    "lookup_p50_ms": ("lookup p50 (batch 512)", "ms"),
    "upsert_rows_s": ("upsert via updater", "rows/s"),
    "direct_rows_s": ("upsert direct (rewrite)", "rows/s"),
    "replay_s": ("restart -> replayed", "s"),
}


def _python() -> str:
    venv = _REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / 1e9
    return 0.0


# -- the model -------------------------------------------------------------------------------------------------------
_WRITE = r"""
import json, shutil, sys, time
from pathlib import Path
import numpy as np
from embedgate.export.ps import write_ps_shard
from schemas.manifest import Manifest
from schemas.partition import shard_for
import tensorflow as tf  # imported before the clock starts
tf.constant(1.0) + 1
model_dir, rows = Path(sys.argv[1]), int(sys.argv[2])
m = Manifest.load(model_dir)
dim = m.tables[0].dim
none = {"t": (np.zeros(0, np.int64), np.zeros((0, dim), np.float32))}
scratch = model_dir / "_empty"
def empty_write():
    t0 = time.perf_counter()
    write_ps_shard(scratch, m.tables, none, layout=m.ps_layout)
    spent = time.perf_counter() - t0
    shutil.rmtree(scratch)
    return spent
empty_write()  # the process's one-time costs (first trace, first save) before the clock
seconds = fixed = 0.0
ids = np.arange(rows, dtype=np.int64)
owner = shard_for(ids, m.num_shards) if rows else ids
for s in range(m.num_shards):
    mine = ids[owner == s]
    vals = np.random.default_rng(s).standard_normal((mine.size, dim), dtype=np.float32)
    fixed += empty_write()  # the same shard without rows, just before: the part that does not grow with rows
    t0 = time.perf_counter()
    write_ps_shard(model_dir / f"ps_{s}" / "1", m.tables, {"t": (mine, vals)}, layout=m.ps_layout)
    seconds += time.perf_counter() - t0
    del vals
print(json.dumps({"seconds": seconds, "fixed_seconds": fixed}))
"""


def _build(
    root: Path, name: str, rows: int, dim: int, shards: int, variant: str
) -> tuple[Path, float, float]:
    """``root/<name>``: manifest + ``ps_<i>/1`` of ``variant`` (``hash``, ``slab`` or ``slab:<row dtype>``); the
    seconds the shard writes took, and the seconds the same writes took without rows (the fixed part: tracing and
    saving the signatures), both after one untimed empty write (the writing process's one-time costs)."""
    from schemas.manifest import Manifest

    layout, _, dtype = variant.partition(":")

    manifest = Manifest.model_validate(
        {
            "model_name": name,
            "version": 1,
            "tables": [{"name": _TABLE, "dim": dim, "rows": rows, "row_dtype": dtype or "float32"}],
            "sparse_features": [{"name": "f", "table": _TABLE}],
            "partition": {"num_shards": shards},
            "entry": {"outputs": [{"name": "p", "shape": [1]}]},
            "ps_layout": layout,
        }
    )
    model_dir = root / name
    model_dir.mkdir(parents=True)
    (model_dir / "manifest.json").write_text(manifest.dumps())
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(_REPO))
    out = subprocess.run(
        [_python(), "-c", _WRITE, str(model_dir), str(rows)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=_REPO,
        timeout=_WAIT_S,
    )
    times = json.loads(out.stdout.strip().splitlines()[-1])
    return model_dir, float(times["seconds"]), float(times["fixed_seconds"])


# -- PS calls -------------------------------------------------------------------------------------------------------
class _Ps:
    """gRPC Predict against one serve-local serving every shard of ``manifest``."""

    def __init__(self, target: str, manifest: Any) -> None:
        import grpc.aio

        from schemas.proto import tfs_pb2

        self.manifest = manifest
        self.pb = tfs_pb2
        self.channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ],
        )
        self.call = self.channel.unary_unary(
            _PREDICT,
            request_serializer=tfs_pb2.PredictRequest.SerializeToString,
            response_deserializer=tfs_pb2.PredictResponse.FromString,
        )

    def _request(self, shard: int, signature: str) -> Any:
        from schemas.manifest import ps_model_name

        return self.pb.PredictRequest(
            model_spec=self.pb.ModelSpec(
                name=ps_model_name(self.manifest.model_name, shard), signature_name=signature
            )
        )

    async def lookup(self, shard: int, ids: Any) -> Any:
        import numpy as np

        from schemas.manifest import lookup_ids_input, lookup_values_output
        from schemas.tensors import from_ndarray, to_ndarray

        req = self._request(shard, "lookup")
        req.inputs[lookup_ids_input(_TABLE)].CopyFrom(from_ndarray(np.asarray(ids, np.int64)))
        resp = await self.call(req, timeout=30)
        return to_ndarray(resp.outputs[lookup_values_output(_TABLE)])

    async def upsert(self, shard: int, ids: Any, values: Any, ts_ms: int) -> None:
        import numpy as np

        from schemas.manifest import upsert_signature
        from schemas.tensors import from_ndarray

        req = self._request(shard, upsert_signature(_TABLE))
        n = len(ids)
        for key, arr in (
            ("ids", ids),
            ("values", values),
            ("timestamps_ms", np.full(n, ts_ms, np.int64)),
            ("seqs", np.zeros(n, np.int64)),
            ("stream_partitions", np.zeros(0, object)),
            ("stream_offsets", np.zeros(0, np.int64)),
            ("stream_expected", np.zeros(0, np.int64)),
        ):
            req.inputs[key].CopyFrom(from_ndarray(arr))
        await self.call(req, timeout=60)

    async def close(self) -> None:
        await self.channel.close()


async def _lookup_p50(ps: _Ps, rows: int, shards: int, batches: int) -> float:
    """Median ms of a 512-id batch split by shard into concurrent ``lookup`` calls (after 20 warm-up batches)."""
    import numpy as np

    from schemas.partition import shard_for

    rng = np.random.default_rng(7)
    times = []
    for k in range(batches + 20):
        ids = rng.integers(0, max(rows, 1), _BATCH, dtype=np.int64)
        owner = shard_for(ids, shards)
        t0 = time.perf_counter()
        await asyncio.gather(*(ps.lookup(s, ids[owner == s]) for s in range(shards)))
        if k >= 20:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


async def _rewrite(ps: _Ps, rows: int, shards: int, dim: int) -> None:
    """Every row written once more (16 384-row ``upsert_t`` calls, shards concurrently), rows generated per call."""
    import numpy as np

    from schemas.partition import shard_for

    ts = int(time.time() * 1000)

    async def shard(s: int) -> None:
        rng = np.random.default_rng(100 + s)
        for start in range(0, rows, 4 * _ROWS_PER_CALL):
            ids = np.arange(start, min(rows, start + 4 * _ROWS_PER_CALL), dtype=np.int64)
            mine = ids[shard_for(ids, shards) == s]
            if mine.size:
                await ps.upsert(s, mine, rng.standard_normal((mine.size, dim), dtype=np.float32), ts)

    await asyncio.gather(*(shard(s) for s in range(shards)))


# -- the updater ----------------------------------------------------------------------------------------------------
def _applied(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as resp:  # 127.0.0.1 only
        text = resp.read().decode()
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "embedgate_updater_rows_applied_total" and s.labels.get("op") == "upsert"
    )


async def _wait(what: str, check: Any, timeout_s: float = _WAIT_S, poll_s: float = 0.05) -> float:
    """Poll ``check()`` (async, truthy when done); the perf_counter time it was seen; RuntimeError naming ``what``."""
    deadline = time.perf_counter() + timeout_s
    while not await check():
        if time.perf_counter() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting until {what}")
        await asyncio.sleep(poll_s)
    return time.perf_counter()


async def _publish(bootstrap: str, model_dir: Path, rows: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        _python(),
        "-m",
        "benchmarks.updater_load",
        "publish",
        "--bootstrap",
        bootstrap,
        "--manifest",
        str(model_dir),
        "--rows",
        str(rows),
        cwd=_REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), _WAIT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"publish exited {proc.returncode}: {err.decode()[-2000:]}")


# -- one step -------------------------------------------------------------------------------------------------------
def _served(model_dir: Path, shards: int, name: str) -> dict[str, Path]:
    from schemas.manifest import ps_dir_name, ps_model_name

    return {ps_model_name(name, i): model_dir / ps_dir_name(i) for i in range(shards)}


@contextlib.contextmanager
def _serving(served: dict[str, Path], port: int) -> Iterator[tuple[Any, float]]:
    """serve-local on ``port``; (server, seconds until every model was AVAILABLE)."""
    import tests.support.servers
    from tests.support.servers import serve_local

    tests.support.servers._START_TIMEOUT = _WAIT_S  # a 16 M-row PS loads for minutes on 2 shared cores

    t0 = time.perf_counter()
    with serve_local(served, port=port, poll_seconds=0.2) as server:
        yield server, time.perf_counter() - t0


def _rss_after_lookup(server: Any, manifest: Any, shards: int) -> int:
    from tests.support.stack import rss_bytes

    async def touch() -> None:
        ps = _Ps(server.target, manifest)
        try:
            await asyncio.gather(*(ps.lookup(s, [0, 1, 2]) for s in range(shards)))
        finally:
            await ps.close()

    asyncio.run(touch())
    return rss_bytes(server.proc.pid)


def _baseline(root: Path, layout: str, dim: int, shards: int) -> dict[str, float]:
    """An empty PS of ``layout``: serve-local's RSS after a lookup and its load time."""
    from schemas.manifest import Manifest

    name = f"empty_{layout.replace(':', '_')}"
    model_dir, _, _ = _build(root, name, 0, dim, shards, layout)
    manifest = Manifest.load(model_dir)
    from tests.support.ports import free_port

    with _serving(_served(model_dir, shards, name), free_port()) as (server, load_s):
        rss = _rss_after_lookup(server, manifest, shards)
    return {"rss": rss, "load_s": load_s}


def _step(
    args: argparse.Namespace, root: Path, bootstrap: str, layout: str, rows: int, base: dict[str, float]
) -> dict[str, Any]:
    import numpy as np

    from schemas.manifest import Manifest
    from tests.support.ports import free_port
    from tests.support.stack import run_updater

    name = f"scale_{layout.replace(':', '_')}_{rows}"
    print(f"[{name}] export ...", flush=True)
    model_dir, export_s, export_fixed_s = _build(root, name, rows, args.dim, args.shards, layout)
    manifest = Manifest.load(model_dir)
    served = _served(model_dir, args.shards, name)
    port = free_port()
    out: dict[str, Any] = {
        "layout": layout,
        "rows": rows,
        "export_s": export_s,
        "export_fixed_s": export_fixed_s,
    }
    raw_mb = rows * 4 * args.dim / 1e6  # float32 rows, whatever the layout stores
    upd_rows = min(args.updater_rows, rows)
    sample = np.unique(
        np.concatenate([np.arange(0, upd_rows, 97), np.arange(max(0, upd_rows - 512), upd_rows)])
    )
    from benchmarks.updater_load import values

    want = values(upd_rows, args.dim)[sample]
    tol = {"float16": 2.0**-10, "bfloat16": 2.0**-7}.get(layout.partition(":")[2], 1e-6)  # rounding on write
    owner_sample = None
    with contextlib.ExitStack() as stack:
        server, load_s = stack.enter_context(_serving(served, port))
        out["load_s"] = load_s
        out["rss_mb"] = (_rss_after_lookup(server, manifest, args.shards) - base["rss"]) / 1e6
        out["rss_x_raw"] = out["rss_mb"] / raw_mb if raw_mb else float("nan")
        print(f"[{name}] loaded in {load_s:.1f} s, {out['rss_mb']:.0f} MB above the empty PS", flush=True)
        config = {
            "models": [
                {
                    "kind": "embedding",
                    "name": name,
                    "manifest": str(model_dir),
                    "entry": server.target,
                    "shards": [{"replicas": [server.target]}] * args.shards,
                }
            ],
            "bootstrap_servers": bootstrap,
            "hps_topic_pattern": None,
            "group_id": f"{name}-group",
            "metrics_port": free_port(),
        }
        upd = stack.enter_context(run_updater(config, root / f"{name}-upd", ready_timeout_s=120))

        async def measure() -> None:
            from schemas.partition import shard_for

            nonlocal owner_sample
            ps = _Ps(server.target, manifest)
            try:
                out["lookup_p50_ms"] = await _lookup_p50(ps, rows, args.shards, args.lookups)
                before = await asyncio.to_thread(_applied, upd.metrics_url)
                os.kill(upd.proc.pid, signal.SIGSTOP)
                try:
                    await _publish(bootstrap, model_dir, upd_rows)
                finally:
                    os.kill(upd.proc.pid, signal.SIGCONT)
                start: list[float] = []  # (time, rows applied) when the first row of the backlog was applied

                async def applied() -> bool:
                    upd.check_alive()
                    now = await asyncio.to_thread(_applied, upd.metrics_url)
                    if not start and now > before:
                        start.extend((time.perf_counter(), now))
                    return bool(now >= before + upd_rows)

                t1 = await _wait("the updater applied the rows", applied, poll_s=0.01)
                out["upsert_rows_s"] = (before + upd_rows - start[1]) / max(t1 - start[0], 1e-3)
                t_rewrite = time.perf_counter()
                await _rewrite(ps, rows, args.shards, args.dim)
                out["direct_rows_s"] = rows / (time.perf_counter() - t_rewrite)
                owner_sample = shard_for(sample.astype(np.int64), args.shards)
            finally:
                await ps.close()

        asyncio.run(measure())
        from tests.support.stack import rss_bytes

        time.sleep(
            _SETTLE_S
        )  # serve-local returns freed malloc memory every 2 s (docs/serve-local.md "Memory")
        out["rss_rewritten_mb"] = (rss_bytes(server.proc.pid) - base["rss"]) / 1e6
        out["rewritten_x_raw"] = out["rss_rewritten_mb"] / raw_mb if raw_mb else float("nan")
        print(f"[{name}] rewritten: {out['rss_rewritten_mb']:.0f} MB; restarting the replica", flush=True)
        # restart the replica: stop serve-local (the updater keeps running), start it again on the same port
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(60)
        t_restart = time.perf_counter()
        with _serving(served, port) as (again, reload_s):

            async def replayed() -> bool:
                ps = _Ps(again.target, manifest)
                try:
                    for s in range(args.shards):
                        sel = owner_sample == s
                        got = await ps.lookup(s, sample[sel])
                        if not np.allclose(got, want[sel], rtol=tol, atol=tol):
                            return False
                    return True
                finally:
                    await ps.close()

            done = asyncio.run(_wait("the restarted replica was replayed", replayed, poll_s=0.1))
            out["replay_s"] = done - t_restart
            out["reload_s"] = reload_s
        print(f"[{name}] replayed in {out['replay_s']:.1f} s", flush=True)
    return out


# -- report ---------------------------------------------------------------------------------------------------------
def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "rows/s":
        return f"{v:,.0f}"
    return f"{v:.2f}" if v < 10 else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _table(results: list[dict[str, Any]], skipped: list[str]) -> str:
    head = (
        "| layout | rows | "
        + " | ".join(f"{t} ({u})" for t, u in MEASURES.values())
        + " | RSS / raw (load, rewrite) |"
    )
    lines = [head, "|" + "---|" * (len(MEASURES) + 3)]
    for r in results:
        cells = [_fmt(r.get(k), u) for k, (_, u) in MEASURES.items()]
        cells[-1] += f" (reload {_fmt(r['reload_s'], 's')})"
        run = f" (run {r['run']})" if "run" in r else ""
        lines.append(
            f"| {r['layout']}{run} | {r['rows']:,} | "
            + " | ".join(cells)
            + f" | {r['rss_x_raw']:.2f}x, {r['rewritten_x_raw']:.2f}x |"
        )
    lines += [f"| {s} | skipped |" + " |" * (len(MEASURES) + 1) for s in skipped]
    lines += ["", "RSS columns: serve-local's resident memory above an empty PS of the layout, all shards."]
    return "\n".join(lines)


def _ratios(results: list[dict[str, Any]], layouts: list[str]) -> list[str]:
    """Per run and size, every layout's measures against the first layout's; per run and layout, the growth from the
    smallest to the largest size."""
    out = []
    runs = sorted({r.get("run", 1) for r in results})
    for run in runs:
        mine_run = [r for r in results if r.get("run", 1) == run]
        tag = f"run {run}, " if len(runs) > 1 else ""
        for rows in sorted({r["rows"] for r in mine_run}):
            at = {r["layout"]: r for r in mine_run if r["rows"] == rows}
            base = at.get(layouts[0])
            for lay in layouts[1:]:
                if base is not None and lay in at:
                    parts = [
                        f"{MEASURES[k][0]} {at[lay][k] / base[k]:.2f}x"
                        for k in MEASURES
                        if base.get(k) and at[lay].get(k)
                    ]
                    out.append(f"{tag}{rows:,} rows, {lay} / {layouts[0]}: " + ", ".join(parts))
        for lay in layouts:
            mine = sorted((r for r in mine_run if r["layout"] == lay), key=lambda r: r["rows"])
            if len(mine) >= 2:
                a, b = mine[0], mine[-1]
                k = b["rows"] / a["rows"]
                parts = [f"{MEASURES[m][0]} {b[m] / a[m]:.2f}x" for m in MEASURES if a.get(m) and b.get(m)]
                out.append(f"{tag}{lay}, {a['rows']:,} -> {b['rows']:,} rows ({k:.0f}x): " + ", ".join(parts))
    return out


def _plots(results: list[dict[str, Any]], layouts: list[str], folder: Path) -> list[Path]:
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, (title, unit) in MEASURES.items():
        fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
        for n, lay in enumerate(layouts):
            mine = [r for r in results if r["layout"] == lay and r.get(key) is not None]
            if not mine:
                continue
            sizes = sorted({r["rows"] for r in mine})
            means = [statistics.mean(r[key] for r in mine if r["rows"] == x) for x in sizes]
            color = f"C{n}"
            ax.plot([x / 1e6 for x in sizes], means, color=color, label=f"{lay} (mean of runs)")
            ax.scatter([r["rows"] / 1e6 for r in mine], [r[key] for r in mine], color=color, s=14)
        ax.set_xlabel("rows in all (millions)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.legend()
        fig.tight_layout()
        path = folder / f"scale_{key}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def _ladder(
    args: argparse.Namespace,
    tmp: Path,
    ladder: list[int],
    layouts: list[str],
    bases: dict[str, dict[str, float]],
    results: list[dict[str, Any]],
    skipped: list[str],
    cmd: str,
) -> None:
    """Every step of the ladder into ``results`` (a 16 M step without the memory into ``skipped``)."""
    from embedgate.devkafka import KafkaBroker

    with KafkaBroker(tmp / "kafka") as broker:
        for rows in ladder:
            if rows >= _BIG and (avail := _mem_available_gb()) < _BIG_NEEDS_GB:
                note = f"{rows:,} rows (MemAvailable {avail:.1f} GB < {_BIG_NEEDS_GB:.0f} GB)"
                print(f"skipped: {note}", flush=True)
                skipped.append(note)
                continue
            for lay in layouts:
                r = _step(args, tmp / "models", broker.bootstrap, lay, rows, bases[lay])
                print(json.dumps(r), flush=True)
                results.append(r)
                if args.json is not None:  # every step as soon as it is measured
                    args.json.write_text(
                        json.dumps(
                            {"results": results, "skipped": skipped, "bases": bases, "command": cmd}, indent=1
                        )
                    )
                for d in (tmp / "models").glob(f"scale_{lay.replace(':', '_')}_{rows}*"):  # free the disk
                    subprocess.run(["rm", "-rf", str(d)], check=False)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1000000,4000000,16000000", help="comma-separated totals (all shards)")
    ap.add_argument(
        "--layouts",
        default="hash,slab",
        help="comma-separated PS layouts (hash, slab, slab:float16, slab:bfloat16); ratios against the first",
    )
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--updater-rows", type=int, default=400_000)
    ap.add_argument("--lookups", type=int, default=200)
    ap.add_argument(
        "--quick", action="store_true", help=f"a small ladder ({_QUICK_ROWS}), fewer rows and lookups"
    )
    ap.add_argument("--write", type=Path, help="rewrite the scale section of this Markdown file")
    ap.add_argument("--plots", type=Path, help="write scale_<measure>.png here")
    ap.add_argument("--json", type=Path, help="also write every step's figures to this JSON file")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="measure nothing: the table, plots and --write from the --include files alone",
    )
    ap.add_argument(
        "--include",
        type=Path,
        action="append",
        default=[],
        help="a --json file of an earlier run whose steps join this run's table and plots (e.g. a 16 M step run "
        "on its own); repeatable",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.updater_rows, args.lookups = _QUICK_ROWS, 20_000, 50
    ladder = sorted(int(x) for x in args.rows.split(","))
    layouts = [x.strip() for x in args.layouts.split(",")]
    known = ("hash", "slab", "slab:float16", "slab:bfloat16")
    if any(x not in known for x in layouts) or not ladder or min(ladder) <= 0:
        ap.error(f"--layouts takes {', '.join(known)}; --rows positive integers")
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    signal.signal(signal.SIGTERM, _interrupt)  # the context managers stop what the run started

    results: list[dict[str, Any]] = []
    skipped: list[str] = []
    cmd = "python -m benchmarks.scale " + " ".join(argv if argv is not None else sys.argv[1:])
    commands: list[str] = []
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp_s:
        tmp = Path(tmp_s)
        bases = (
            {}
            if args.report_only
            else {lay: _baseline(tmp / "models", lay, args.dim, args.shards) for lay in layouts}
        )
        for lay, b in bases.items():
            print(f"empty {lay} PS: RSS {b['rss'] / 1e6:.0f} MB, load {b['load_s']:.1f} s", flush=True)
        if not args.report_only:
            _ladder(args, tmp, ladder, layouts, bases, results, skipped, cmd)
            empty = ", ".join(
                f"{lay} {b['rss'] / 1e6:.0f} MB, load {b['load_s']:.1f} s" for lay, b in bases.items()
            )
            commands.append(f"`{cmd.strip()}` (empty PS: {empty})")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"results": results, "skipped": skipped, "bases": bases, "command": cmd}, indent=1)
        )
    for k, path in enumerate(args.include):
        earlier = json.loads(path.read_text())
        run = k + (0 if args.report_only else 1) + 1
        results += [{**r, "run": run} for r in earlier["results"]]
        skipped += earlier["skipped"]
        empty = ", ".join(
            f"{lay} {b['rss'] / 1e6:.0f} MB, load {b['load_s']:.1f} s"
            for lay, b in earlier.get("bases", {}).items()
        )
        commands.append(f"`{earlier.get('command') or path}` (empty PS: {empty})")
    results.sort(key=lambda r: (r["rows"], layouts.index(r["layout"]) if r["layout"] in layouts else 99))
    if len(commands) > 1:  # several runs: number them
        commands = [f"run {k}: {c}" for k, c in enumerate(commands, 1)]
        for r in results:
            r.setdefault("run", 1)
    body = [
        "; ".join(commands)
        + f"; dim {args.dim}, {args.shards} shards, {args.lookups} lookup batches of {_BATCH}; the empty PS's RSS "
        "is subtracted from the RSS columns.",
        "",
        _table(results, skipped),
        "",
        *[f"* {line}" for line in _ratios(results, layouts)],
    ]
    text = "\n".join(body)
    print()
    print(text)
    if args.plots is not None and results:
        for p in _plots(results, layouts, args.plots):
            print(f"plot: {p}")
    if args.write is not None:
        write_section(args.write, BEGIN, END, text, "## Scale ladder")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Slab vs hash PS layout at one size, interleaved and repeated: export, load, lookup p50, direct upsert rate.

    .venv/bin/python -m benchmarks.slab_vs_hash [--rows 1000000] [--repeats 3] [--lookups 300] [--dim 64]
                                                [--shards 4] [--write docs/benchmarks.md] [--json FILE]
                                                [--include FILE ...] [--report-only]

The ladder (``benchmarks.scale``) measures each layout once per size, minutes apart; on a shared machine its
timing ratios swing by 3x. Here both layouts are measured in the same minutes, ``--repeats`` times, the order
alternating between repeats, and every ratio is slab / hash within one repeat. Per repeat:

1. **export**: both layouts written (the PS shard writes of ``embedgate export``, as ``benchmarks.scale`` step 1:
   one child process per layout, TensorFlow imported and one empty shard written before the clock starts), one
   after the other; seconds per million rows. Reported three ways: all shard writes; the part that grows with the
   rows (each shard's write minus the write of the same shard without rows, timed just before it); and that fixed
   part per shard (tracing and saving the signatures; at 1 M rows over 4 shards it is most of the slab layout's
   export, so the total per million rows overstates what a larger export costs per row).
2. **load**: serve-local started on each (one process per layout, the second started once the first is AVAILABLE);
   seconds per million rows, process start included.
3. **lookup p50**: ``--lookups`` batches of 512 random existing ids split by shard into concurrent ``lookup`` calls
   (as the gateway does), each batch sent to both servers one after the other (order alternating per batch) after
   20 warm-up batches; the median of each layout, and the median (and quartiles) of the per-batch ratios.
4. **direct upsert rows/s**: every row written once more, in 64 k-id chunks (16 384-row ``upsert_t`` calls, shards
   concurrently), each chunk to both servers one after the other (order alternating); rows / summed time per layout.

``--include`` reports earlier runs' ``--json`` files too (one table each, e.g. another ``--rows``), and
``--report-only`` only those. Bounded: every wait has a time limit (``benchmarks.scale``'s); every process started is stopped on every exit path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.report import markers, write_section
from benchmarks.scale import _BATCH, _ROWS_PER_CALL, _build, _Ps, _served, _serving

__all__ = ["BEGIN", "END", "main"]

BEGIN, END = markers("slab_vs_hash")
LAYOUTS = ("hash", "slab")


async def _paired_lookups(ps: dict[str, _Ps], rows: int, shards: int, batches: int) -> dict[str, list[float]]:
    """Seconds per 512-id batch on each layout, the same batches, the order alternating."""
    import numpy as np

    from schemas.partition import shard_for

    rng = np.random.default_rng(7)
    times: dict[str, list[float]] = {lay: [] for lay in ps}
    for k in range(batches + 20):
        ids = rng.integers(0, rows, _BATCH, dtype=np.int64)
        owner = shard_for(ids, shards)
        for lay in LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]:
            t0 = time.perf_counter()
            await asyncio.gather(*(ps[lay].lookup(s, ids[owner == s]) for s in range(shards)))
            if k >= 20:
                times[lay].append(time.perf_counter() - t0)
    return times


async def _paired_rewrite(ps: dict[str, _Ps], rows: int, shards: int, dim: int) -> dict[str, float]:
    """Seconds spent writing every row once more on each layout (chunk by chunk, the order alternating)."""
    import numpy as np

    from schemas.partition import shard_for

    rng = np.random.default_rng(100)
    spent = dict.fromkeys(ps, 0.0)
    ts = int(time.time() * 1000)
    chunk = 4 * _ROWS_PER_CALL
    for k, start in enumerate(range(0, rows, chunk)):
        ids = np.arange(start, min(rows, start + chunk), dtype=np.int64)
        owner = shard_for(ids, shards)
        values = rng.standard_normal((ids.size, dim), dtype=np.float32)
        for lay in LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]:
            t0 = time.perf_counter()
            await asyncio.gather(
                *(ps[lay].upsert(s, ids[owner == s], values[owner == s], ts) for s in range(shards))
            )
            spent[lay] += time.perf_counter() - t0
    return spent


def _start(stack: contextlib.ExitStack, served: dict[str, Path]) -> tuple[Any, float]:
    """serve-local on ``served`` (entered on ``stack``): (server, load seconds). A free port can be taken by another
    process before serve-local binds it (a shared machine): then once more on another port."""
    from tests.support.ports import free_port
    from tests.support.servers import ServerStartError

    try:
        return stack.enter_context(_serving(served, free_port()))
    except ServerStartError as exc:
        if "Address already in use" not in str(exc):
            raise
        print("serve-local's port was taken; starting it again on another", flush=True)
        return stack.enter_context(_serving(served, free_port()))


def _repeat(args: argparse.Namespace, root: Path, k: int) -> dict[str, Any]:
    """One repeat: both layouts exported, loaded, looked up and rewritten; figures per layout and ratios."""
    from schemas.manifest import Manifest

    order = LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]
    millions = args.rows / 1e6
    out: dict[str, Any] = {"repeat": k, "order": list(order)}
    dirs: dict[str, Path] = {}
    for lay in order:
        dirs[lay], export_s, fixed_s = _build(root, f"svh_{lay}_{k}", args.rows, args.dim, args.shards, lay)
        out[f"{lay}_export_s_per_m"] = export_s / millions
        out[f"{lay}_export_rows_s_per_m"] = (export_s - fixed_s) / millions
        out[f"{lay}_export_fixed_s"] = fixed_s / args.shards
        print(f"[repeat {k}] {lay} exported in {export_s:.1f} s ({fixed_s:.1f} s without rows)", flush=True)
    manifests = {lay: Manifest.load(d) for lay, d in dirs.items()}
    try:
        with contextlib.ExitStack() as stack:
            servers = {}
            for lay in order:
                servers[lay], load_s = _start(stack, _served(dirs[lay], args.shards, f"svh_{lay}_{k}"))
                out[f"{lay}_load_s_per_m"] = load_s / millions
                print(f"[repeat {k}] {lay} loaded in {load_s:.1f} s", flush=True)

            async def measure() -> None:
                ps = {lay: _Ps(servers[lay].target, manifests[lay]) for lay in LAYOUTS}
                try:
                    times = await _paired_lookups(ps, args.rows, args.shards, args.lookups)
                    spent = await _paired_rewrite(ps, args.rows, args.shards, args.dim)
                finally:
                    for p in ps.values():
                        await p.close()
                for lay in LAYOUTS:
                    out[f"{lay}_lookup_p50_ms"] = statistics.median(times[lay]) * 1000
                    out[f"{lay}_direct_rows_s"] = args.rows / spent[lay]
                ratios = sorted(s / h for s, h in zip(times["slab"], times["hash"], strict=True))
                q = statistics.quantiles(ratios, n=4)
                out["lookup_ratio_p50"], out["lookup_ratio_q1"], out["lookup_ratio_q3"] = q[1], q[0], q[2]

            asyncio.run(measure())
    finally:
        for d in dirs.values():
            subprocess.run(["rm", "-rf", str(d)], check=False)
    for m in _MEASURES:
        out[f"ratio_{m}"] = out[f"slab_{m}"] / out[f"hash_{m}"]
    return out


_ROWS = (  # (label, key, format, better)
    ("export (s per M rows)", "export_s_per_m", "{:.2f}", "lower"),
    ("export, the part that grows with rows (s per M rows)", "export_rows_s_per_m", "{:.2f}", "lower"),
    ("export of a shard without rows (s)", "export_fixed_s", "{:.2f}", "lower"),
    ("load (s per M rows)", "load_s_per_m", "{:.2f}", "lower"),
    ("lookup p50, batch 512 (ms)", "lookup_p50_ms", "{:.2f}", "lower"),
    ("upsert direct (rows/s)", "direct_rows_s", "{:,.0f}", "higher"),
)

_MEASURES = tuple(key for _, key, _, _ in _ROWS)


def _report(results: list[dict[str, Any]], cmd: str) -> str:
    """A Markdown table: per measure, each repeat's hash, slab and slab / hash, then the median ratio and range."""
    head = "| measure | " + " | ".join(f"repeat {r['repeat'] + 1}: hash, slab (slab/hash)" for r in results)
    lines = [
        f"`{cmd}`; order per repeat: "
        + ", ".join("/".join(r["order"]) for r in results)
        + ". Ratios are slab / hash within one repeat.",
        "",
        head + " | slab/hash median [range] |",
        "|---" * (len(results) + 2) + "|",
    ]
    for label, key, fmt, better in _ROWS:
        cells = [
            f"{fmt.format(r['hash_' + key])}, {fmt.format(r['slab_' + key])} ({r['ratio_' + key]:.2f}x)"
            for r in results
        ]
        ratios = [r["ratio_" + key] for r in results]
        summary = (
            f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] ({better} is better)"
        )
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {summary} |")
    paired = "; ".join(
        f"repeat {r['repeat'] + 1}: {r['lookup_ratio_p50']:.2f}x (quartiles {r['lookup_ratio_q1']:.2f}-"
        f"{r['lookup_ratio_q3']:.2f})"
        for r in results
    )
    lines += [
        "",
        f"Per-batch lookup ratio slab / hash (the same batch to both, median of the batches): {paired}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows in all shards")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lookups", type=int, default=300, help="lookup batches per layout and repeat")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--write", type=Path, help="rewrite the slab_vs_hash section of this Markdown file")
    ap.add_argument("--json", type=Path, help="also write every repeat's figures to this JSON file")
    ap.add_argument(
        "--include",
        type=Path,
        nargs="*",
        default=[],
        help="JSON files of earlier runs (--json) to report too, each its own table, before this run's",
    )
    ap.add_argument("--report-only", action="store_true", help="measure nothing: report the --include files")
    args = ap.parse_args(argv)
    if args.rows <= 0 or args.repeats <= 0 or args.lookups <= 0:
        ap.error("--rows, --repeats and --lookups must be positive")
    if args.report_only and not args.include:
        ap.error("--report-only needs --include")
    runs = [json.loads(path.read_text()) for path in args.include]
    if not args.report_only:
        runs.append(_run(args, argv))
    text = "\n\n".join(_report(run["results"], run["command"]) for run in runs)
    print()
    print(text)
    if args.write is not None:
        write_section(args.write, BEGIN, END, text, "## Slab vs hash, interleaved")
    return 0


def _run(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """Every repeat of this run: ``{"command": ..., "results": [...]}`` (also written to ``--json`` as it goes)."""
    cmd = "python -m benchmarks.slab_vs_hash " + " ".join(argv if argv is not None else sys.argv[1:])
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="slab-vs-hash-") as tmp:
        for k in range(args.repeats):
            results.append(_repeat(args, Path(tmp), k))
            print(json.dumps(results[-1]), flush=True)
            if args.json is not None:
                args.json.write_text(json.dumps({"command": cmd, "results": results}, indent=1))
    return {"command": cmd.strip(), "results": results}


if __name__ == "__main__":
    sys.exit(main())

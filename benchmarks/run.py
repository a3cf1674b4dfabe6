"""Run every benchmark one after another (``make bench``): export, gateway, updater, serving (gateway vs whole model),
gateway workers, probe stall, hostile clients.

    .venv/bin/python -m benchmarks.run [--only NAME ...]

Each benchmark runs as ``python -m benchmarks.<name> <args>`` in its own subprocess with the arguments below (its
defaults, or modest ones: the whole run took about 16 minutes on 2 cores, 9 of them serving_bench), its output
passed through, and a time limit. The ones given ``--write docs/benchmarks.md`` rewrite their tables there (``hostile``:
docs/security.md). Exits
non-zero if any benchmark fails or times out; the others still run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["BENCHMARKS", "main"]

_REPO = Path(__file__).resolve().parent.parent

# name -> (arguments, time limit in seconds); one make bench run on 2 cores took 15 s, 54 s, 91 s, 555 s, 193 s and
# 66 s for them, in this order
BENCHMARKS: dict[str, tuple[list[str], float]] = {
    "export_bench": (["--rows", "1000000", "--dim", "64", "--shards", "2"], 300.0),
    "gateway_bench": (["--requests", "1000", "--concurrency", "8", "--seconds", "20", "--batch", "8"], 300.0),
    "updater_bench": (
        ["--rows", "200000", "--dim", "64", "--shards", "2", "--write", "docs/benchmarks.md"],
        900.0,
    ),
    # REST body -> typed arrays per example, compiled vs Python reference, in-process (about 30 s)
    "native_codec_bench": (["--rounds", "5", "--seconds", "0.3", "--write", "docs/benchmarks.md"], 300.0),
    "embedding_path_bench": (["--rounds", "5", "--seconds", "0.2", "--write", "docs/benchmarks.md"], 600.0),
    "native_serving_bench": (["--rounds", "3", "--seconds", "3", "--write", "docs/benchmarks.md"], 1500.0),
    "serving_bench": (["--rounds", "3", "--seconds", "4", "--write", "docs/benchmarks.md"], 1800.0),
    "workers_bench": (
        ["--requests", "10000", "--concurrency", "16", "--rounds", "2", "--write", "docs/benchmarks.md"],
        600.0,
    ),
    "dlrm_bench": (["--rounds", "3", "--seconds", "3", "--write", "docs/benchmarks.md"], 2400.0),
    # issue 17: the cached gRPC path's native steps against what they replace, in-process (prints its table; ~1 min)
    "dlrm_stages": ([], 600.0),
    "probe_stall_bench": (
        ["--instances", "170000", "--runs", "3", "--write", "docs/benchmarks.md"],
        600.0,
    ),
    # hostile clients, one class at a time, against a whole stack; its table goes to docs/security.md
    "hostile": (["--write", "docs/security.md"], 900.0),
    # issue 21: a refusal's CPU per front: REST h11 + ShedMiddleware vs the gateway's HTTP protocol, gRPC the Python
    # front vs the native gate (prints its table; about 4 minutes)
    "refusal_bench": (["--rounds", "3"], 600.0),
    # issue 22: serve-local's native gate against its Python gRPC server, Predict of 4 KB / 1 MB / 5.3 MB (prints its
    # table; about 2 minutes)
    "serve_front_bench": ([], 600.0),
    # issue 18: training step with and without StreamRows (prints its figures; docs/benchmarks.md "StreamRows overhead")
    "stream_rows_bench": (
        ["--rounds", "3", "--steps", "40"],
        900.0,
    ),  # the callback's default cadence (every second)
    # issue 18: served AUC of frozen / periodic / streamed serving on a drifting stream, publish -> served delay
    "freshness_quality": (["--write", "docs/benchmarks.md"], 900.0),
    # issue 19: the scale ladder (1 M, 4 M, 16 M rows; 16 M only with 14 GB available), table in docs/benchmarks.md,
    # one PNG per measure in docs/img/
    "scale": (["--write", "docs/benchmarks.md", "--plots", "docs/img"], 7200.0),
}


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the benchmark's own process group (its context managers then stop what it started: serve-local,
    broker, gateway, updater), SIGKILL to that group if it has not exited after 60 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _run_one(name: str, args: list[str], limit_s: float) -> tuple[int | None, float]:
    """Return code (None on timeout) and wall time of one benchmark, run in a process group of its own."""
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *args]
    print(f"\n=== {name}: {' '.join(cmd[1:])} (limit {limit_s:.0f} s)", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=_REPO, start_new_session=True)
    try:
        code: int | None = proc.wait(limit_s)
    except subprocess.TimeoutExpired:
        code = None
        _stop_group(proc)
    except BaseException:  # Ctrl-C / SIGTERM of this runner: stop the benchmark first
        _stop_group(proc)
        raise
    return code, time.perf_counter() - t0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only", action="append", choices=sorted(BENCHMARKS), help="run only this one (repeatable)"
    )
    opts = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    names = opts.only or list(BENCHMARKS)
    results: dict[str, tuple[int | None, float]] = {}
    for name in names:
        args, limit_s = BENCHMARKS[name]
        results[name] = _run_one(name, args, limit_s)
    print("\n=== summary")
    failed = []
    for name, (code, seconds) in results.items():
        status = "ok" if code == 0 else ("timed out" if code is None else f"failed (exit {code})")
        print(f"{name:<16} {status:<18} {seconds:6.1f} s")
        if code != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

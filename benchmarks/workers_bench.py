"""Pass-through throughput of the gateway with 1 and with 2 workers, measured by ``hey`` in its own process.

    make hey && .venv/bin/python -m benchmarks.workers_bench [--requests 20000] [--concurrency 16] [--rounds 3] \
        [--write docs/benchmarks.md]

1. Builds the small demo model and serves ``demo_entry`` with serve-local (127.0.0.1).
2. For each round, for each setup (alternating, so drift on a shared machine hits all alike): ``1`` and ``2`` =
   ``embedgate gateway`` with ``EMBEDGATE_WORKERS``; ``uvicorn-2`` = the same app under plain ``uvicorn --workers 2``
   (uvicorn binds the socket: no TCP_NODELAY, the issue's setup). One pass-through model ``entry`` (->
   ``demo_entry``); a warm-up of 500 requests, then ``hey -n <requests> -c <concurrency>`` (keep-alive) POSTing one
   example of entry inputs (in the entry's own mode, ``unique_rows`` by default) in the columnar format, bounded by
   the request count and a 120 s timeout; then 300 requests on one keep-alive connection (``-c 1``), whose p50 shows
   delayed-ACK stalls (~40 ms) if there are any.
3. Prints one JSON document: requests/s and latency percentiles per run, and the median per setup; with ``--write
   docs/benchmarks.md`` also the table of its section there (between its markers).

``hey`` is ``github.com/rakyll/hey`` built by ``make hey`` into ``.cache/go-bin``. Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.report import markers, write_section

__all__ = ["BEGIN", "END", "main"]

BEGIN, END = markers("workers_bench")
_SETUPS = {
    "1": "1 worker",
    "2": "2 workers (`workers: 2`)",
    "uvicorn-2": "plain `uvicorn --workers 2`",
}

_REPO = Path(__file__).resolve().parents[1]
_HEY = _REPO / ".cache" / "go-bin" / "hey"
_TIMEOUT_S = 120


def _entry_inputs(manifest: Any) -> dict[str, Any]:
    """One example's entry inputs in the entry's own input mode (``unique_rows`` by default: rows per table, indices
    and splits per feature; ``pooled``: one row per feature), as the gateway would send them, with random rows:
    the columnar ``inputs`` of the pass-through body."""
    import numpy as np

    from benchmarks.entry_inputs import entry_inputs_for
    from embedgate.export.demo import make_examples
    from gateway.features import batch_from_instances
    from schemas.manifest import entry_rows_input

    rng = np.random.default_rng(0)
    dims = {t.name: t.dim for t in manifest.tables}
    rows_inputs = {entry_rows_input(t.name) for t in manifest.tables}
    # one example that reads a row of every table: JSON cannot give an empty rows input its [0, dim] shape
    for example in make_examples(64, 5_000, seed=0)[0]:
        batch = batch_from_instances([example], manifest)
        inputs = entry_inputs_for(
            batch, manifest, lambda t, ids: rng.normal(size=(len(ids), dims[t])).astype(np.float32)
        )
        if all(len(a) for name, a in inputs if name in rows_inputs):
            break
    else:
        raise RuntimeError("no example of the first 64 reads a row of every table the entry takes rows of")
    return {name: np.round(a, 4).tolist() if a.dtype.kind == "f" else a.tolist() for name, a in inputs}


def _hey(url: str, body: Path, requests: int, concurrency: int) -> dict[str, float]:
    """requests/s and p50/p99 latency of one bounded hey run; raises if any answer was not 200."""
    cmd = [str(_HEY), "-n", str(requests), "-c", str(concurrency), "-m", "POST", "-T", "application/json"]
    out = subprocess.run(
        [*cmd, "-D", str(body), url], capture_output=True, text=True, timeout=_TIMEOUT_S, check=True
    ).stdout
    rps = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    codes = dict(re.findall(r"\[(\d{3})\]\s+(\d+) responses", out))
    if rps is None or set(codes) != {"200"}:
        raise RuntimeError(f"hey reported errors or no rate:\n{out}")
    result = {"rps": float(rps.group(1))}
    for pct in ("50", "99"):
        m = re.search(rf"{pct}%+ in ([0-9.]+) secs", out)  # hey prints "50%% in"
        if m:
            result[f"p{pct}_ms"] = round(float(m.group(1)) * 1000, 2)
    return result


def _table(report: dict[str, Any]) -> str:
    """The Markdown table of ``report``: every round's figures per setup, the median and its ratio to one worker."""
    c = report["concurrency"]
    one = report["median_rps"]["1"]
    lines = [
        (
            f"`python -m benchmarks.workers_bench --requests {report['requests_per_run']} --concurrency {c} "
            f"--rounds {len(report['runs']['1'])}` ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
            f"at the end; {time.strftime('%Y-%m-%d', time.gmtime())})"
        ),
        "",
        f"| setup | throughput, {c} connections (req/s) | p50 / p99 at {c} connections | p50, one connection |",
        "|---|---|---|---|",
    ]
    for setup, label in _SETUPS.items():
        runs, median = report["runs"][setup], report["median_rps"][setup]
        ratio = "" if setup == "1" else f"; **{median / one:.2f}x** one worker"
        rates = ", ".join(f"{r['rps']:.0f}" for r in runs)
        lines.append(
            f"| {label} | {rates} (median {median:.0f}{ratio}) "
            f"| {_spread(runs, 'p50_ms')} / {_spread(runs, 'p99_ms')} ms | {_spread(runs, 'sequential_p50_ms')} ms |"
        )
    return "\n".join(lines)


def _spread(runs: list[dict[str, float]], key: str) -> str:
    """``min-max`` of ``key`` over ``runs`` (one value when they agree or there is one run)."""
    values = [r[key] for r in runs if key in r]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}"


@contextmanager
def _gateway(setup: str, cfg: Path, tmp: Path) -> Iterator[str]:
    """The gateway's URL for ``setup`` ("1", "2": embedgate gateway; "uvicorn-2": plain uvicorn --workers 2)."""
    from tests.support.gateway import run_gateway

    if setup != "uvicorn-2":
        with run_gateway(cfg, env={"EMBEDGATE_WORKERS": setup}) as gw:
            yield gw.url
        return
    import httpx

    from schemas.gateway_settings import load_settings
    from tests.support.ports import free_port

    port = free_port()
    metrics_dir = Path(tempfile.mkdtemp(dir=tmp))
    env = {
        **os.environ,
        "_EMBEDGATE_WORKER_SETTINGS": load_settings(cfg).model_dump_json(),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    cmd = [sys.executable, "-m", "uvicorn", "gateway.cli:_worker_app", "--factory", "--workers", "2"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--loop", "asyncio", "--no-access-log"]
    proc = subprocess.Popen(cmd, cwd=_REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("uvicorn --workers 2 did not become ready")
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20000, help="requests per hey run (capped at 100000)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--write", type=Path, help="put the table into this Markdown file, between its markers")
    args = p.parse_args(argv)
    if not _HEY.exists():
        print(f"{_HEY} is missing: run `make hey`", file=sys.stderr)
        return 2
    requests = min(args.requests, 100_000)

    from embedgate.export.demo import build_demo
    from schemas.manifest import entry_model_name
    from tests.support.servers import serve_local

    setups = tuple(_SETUPS)
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in setups}
    with tempfile.TemporaryDirectory(prefix="workers-bench-") as tmp:
        root = Path(tmp)
        demo = build_demo(root / "demo", small=True)
        man = demo.manifest
        body = root / "body.json"
        body.write_text(json.dumps({"inputs": _entry_inputs(man)}))
        with serve_local({entry_model_name(man.model_name): demo.model_dir / "entry"}) as backend:
            cfg = root / "gateway.yaml"
            model = {
                "kind": "passthrough",
                "name": "entry",
                "target": backend.target,
                "backend_name": entry_model_name(man.model_name),
            }
            cfg.write_text(json.dumps({"log": {"access": False}, "models": [model]}))
            for _ in range(args.rounds):
                for setup in setups:
                    with _gateway(setup, cfg, root) as base:
                        url = f"{base}/v1/models/entry:predict"
                        _hey(url, body, 500, args.concurrency)  # warm-up; every worker started
                        run = _hey(url, body, requests, args.concurrency)
                        sequential = _hey(url, body, 300, 1)  # one keep-alive connection: shows ACK stalls
                        run["sequential_p50_ms"] = sequential["p50_ms"]
                        runs[setup].append(run)
    median = {s: statistics.median(r["rps"] for r in rs) for s, rs in runs.items()}
    report: dict[str, Any] = {
        "requests_per_run": requests,
        "concurrency": args.concurrency,
        "runs": runs,
        "median_rps": median,
        "ratio_2_over_1": round(median["2"] / median["1"], 2),
        "ratio_uvicorn_2_over_1": round(median["uvicorn-2"] / median["1"], 2),
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    if args.write is not None:
        write_section(args.write, BEGIN, END, _table(report), "## Gateway workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())

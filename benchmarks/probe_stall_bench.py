"""How long a probe waits while one big embedding predict runs: the longest ``GET /healthz`` during the request.

    .venv/bin/python -m benchmarks.probe_stall_bench [--instances 170000] [--runs 3] [--write docs/benchmarks.md]

Builds the small demo, serves it with serve-local and runs one gateway (default limits except the body and batch
size bounds, raised to admit the request). Per run: one REST ``:predict`` of ``--instances`` demo instances (about
270 bytes each as JSON) on one connection while another keep-alive connection asks ``/healthz`` every 20 ms; prints
the longest ``/healthz`` and the big request's time and status. The baseline in the same run: the longest
``/healthz`` over the same span with no big request in flight (the machine's own jitter). 127.0.0.1 only; every loop
is bounded by the big request, which is bounded by its timeout. ``--write`` puts the table into its section of a
Markdown file (between its markers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.report import markers, write_section

__all__ = ["BEGIN", "END", "main"]

BEGIN, END = markers("probe_stall_bench")

_POLL_S = 0.02
_REQUEST_TIMEOUT_S = 120.0


def _longest_probe(url: str, until: threading.Event, limit_s: float) -> float:
    """Longest /healthz round trip, polled every 20 ms until ``until`` is set or ``limit_s`` passed."""
    import httpx

    worst = 0.0
    end = time.monotonic() + limit_s
    with httpx.Client(timeout=30) as c:
        c.get(f"{url}/healthz")  # connected and warm
        while not until.is_set() and time.monotonic() < end:
            t = time.perf_counter()
            c.get(f"{url}/healthz").raise_for_status()
            worst = max(worst, time.perf_counter() - t)
            time.sleep(_POLL_S)
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=170_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", type=Path, help="put the table into this Markdown file, between its markers")
    args = ap.parse_args(argv)

    import httpx
    import yaml

    from embedgate.export.demo import build_demo, make_examples
    from tests.support.gateway import run_gateway
    from tests.support.servers import serve_local
    from tests.support.stack import embedding_model, exported_backends

    with tempfile.TemporaryDirectory(prefix="probe-stall-") as tmp:
        demo = build_demo(Path(tmp) / "demo", small=True)
        m = demo.manifest
        instances, _ = make_examples(
            args.instances, 5_000, seed=3
        )  # the small demo's user and item vocabulary
        body = json.dumps({"instances": instances}).encode()
        with serve_local(exported_backends(demo.model_dir)) as backend:
            cfg = {
                "log": {"access": False},
                "max_body_bytes": 256 << 20,
                "limits": {"max_instances": 1_000_000, "max_buffered_bytes": 1 << 30, "body_timeout_s": 60},
                "models": [
                    embedding_model(
                        demo.model_dir, entry=backend.target, shards=[[backend.target]] * m.num_shards
                    )
                ],
            }
            path = Path(tmp) / "gateway.yaml"
            path.write_text(yaml.safe_dump(cfg))
            with run_gateway(path) as gw:
                url = f"{gw.url}/v1/models/{m.model_name}:predict"
                loaded: list[float] = []
                idle: list[float] = []
                took: list[float] = []
                for run in range(args.runs):
                    done = threading.Event()
                    status: list[int] = []

                    def big(done: threading.Event = done, status: list[int] = status) -> None:
                        try:
                            with httpx.Client(timeout=_REQUEST_TIMEOUT_S) as c:
                                t = time.perf_counter()
                                r = c.post(url, content=body, headers={"content-type": "application/json"})
                                took.append(time.perf_counter() - t)
                                status.append(r.status_code)
                        finally:
                            done.set()

                    thread = threading.Thread(target=big, name="big-request")
                    thread.start()
                    loaded.append(_longest_probe(gw.url, done, _REQUEST_TIMEOUT_S))
                    thread.join(_REQUEST_TIMEOUT_S)
                    idle.append(_longest_probe(gw.url, threading.Event(), took[-1] if took else 1.0))
                    print(
                        f"run {run}: longest /healthz {loaded[-1] * 1e3:.0f} ms during the request "
                        f"(status {status}, {took[-1] if took else float('nan'):.1f} s), "
                        f"{idle[-1] * 1e3:.0f} ms idle",
                        file=sys.stderr,
                        flush=True,
                    )
    result = {
        "instances": args.instances,
        "body_mb": round(len(body) / 1e6, 1),
        "longest_healthz_ms": [round(x * 1e3) for x in loaded],
        "longest_healthz_idle_ms": [round(x * 1e3) for x in idle],
        "request_s": [round(x, 2) for x in took],
        "median_ms": round(statistics.median(loaded) * 1e3),
    }
    print(json.dumps(result, indent=2))
    if args.write is not None:
        write_section(
            args.write, BEGIN, END, _table(result), "## Probe latency during a big embedding request"
        )
    return 0


def _table(result: dict[str, Any]) -> str:
    """The Markdown table of one run of this benchmark."""
    ms = " / ".join(f"{x} ms" for x in result["longest_healthz_ms"])
    idle = result["longest_healthz_idle_ms"]
    took = result["request_s"]
    return "\n".join(
        [
            (
                f"`python -m benchmarks.probe_stall_bench --instances {result['instances']} --runs {len(took)}` "
                f"({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; "
                f"{time.strftime('%Y-%m-%d', time.gmtime())})"
            ),
            "",
            "| request | longest `/healthz` during it, per run | idle (same span, no big request) | request took |",
            "|---|---|---|---|",
            (
                f"| {result['instances']:,} instances, {result['body_mb']} MB of JSON | {ms} "
                f"| {min(idle)}-{max(idle)} ms | {min(took):.1f}-{max(took):.1f} s |"
            ),
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())

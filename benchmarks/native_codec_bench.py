"""REST predict body -> typed input arrays, per example: the compiled path (``embedgate_native`` through
``gateway.native``) vs the Python reference (``gateway.codec.json_tensor``), in one process, interleaved.

    .venv/bin/python -m benchmarks.native_codec_bench [--rounds 5] [--seconds 0.3] [--write docs/benchmarks.md]

The body is a pass-through model's row-format request: per example 13 float features and a 26-id int64 list (the
shape of a DLRM-style example), JSON written by ``json.dumps``. Each round times, for every batch in turn, three
callables over the same bytes (each repeated for about ``--seconds`` of this process's CPU time, which other
processes on a shared machine disturb less than wall time), and keeps the per-example CPU cost:

* ``reference``: ``json_tensor.loads`` + ``tensors_from_request`` (numpy fast path on, as the gateway runs it);
* ``native``: ``gateway.native.predict_tensors`` (parse and type in Rust, GIL released);
* ``wired``: what the REST predict route runs for a pass-through model today with the native path on:
  ``native.check_predict`` (strict JSON, depth/batch/per-example limits, ``signature_name``: the one pass that
  replaces ``limits.parse_document``, keeping the parsed body) + ``native.checked_tensors``; its reference
  counterpart ``parse_document`` + ``tensors_from_request`` is ``wired ref`` (what runs with
  ``EMBEDGATE_NATIVE=off``).

Reported: the median over rounds (min to max spread) and the ratios reference/native taken within each round.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.report import markers, write_section
from gateway import native
from gateway.codec import json_tensor as jt
from gateway.limits import parse_document
from schemas.gateway_settings import LimitsSettings
from schemas.proto import tfs_pb2

__all__ = ["main"]

BATCHES = (1, 64, 512, 4096)
DT = tfs_pb2.DataType
DTYPES = {"dense": int(DT.DT_FLOAT), "ids": int(DT.DT_INT64)}


def body_for(batch: int, seed: int = 0) -> bytes:
    """A row-format predict body of ``batch`` examples (13 floats + 26 ids each)."""
    rng = random.Random(seed)
    rows = [
        {
            "dense": [round(rng.uniform(-3, 3), 6) for _ in range(13)],
            "ids": [rng.randrange(0, 2_000_000) for _ in range(26)],
        }
        for _ in range(batch)
    ]
    return json.dumps({"instances": rows}).encode()


def _per_call_s(fn: Callable[[], Any], seconds: float) -> float:
    fn()  # warm
    n = 0
    start = time.process_time()
    while True:
        fn()
        n += 1
        elapsed = time.process_time() - start
        if elapsed >= seconds:
            return elapsed / n


def _callables(body: bytes, limits: LimitsSettings) -> dict[str, Callable[[], Any]]:
    fast = not jt.may_contain_bools(body)

    def reference() -> Any:
        return jt.tensors_from_request(jt.loads(body), DTYPES, fast=fast)

    def compiled() -> Any:
        done = native.predict_tensors(body, DTYPES)
        assert done is not None, "the native path left a well-formed body to the reference"
        return done

    def wired() -> Any:
        checked = native.check_predict(body, limits)
        assert checked is not None, "the native check left the body to the reference"
        return native.checked_tensors(checked[1], DTYPES)

    def wired_ref() -> Any:
        return jt.tensors_from_request(parse_document(body, limits), DTYPES, fast=fast)

    return {"reference": reference, "native": compiled, "wired": wired, "wired ref": wired_ref}


def run(rounds: int, seconds: float) -> dict[int, dict[str, list[float]]]:
    """CPU µs per example, by batch and callable, one value per round (batches and callables interleaved)."""
    limits = LimitsSettings()
    bodies = {b: body_for(b) for b in BATCHES}
    out: dict[int, dict[str, list[float]]] = {b: {} for b in BATCHES}
    for r in range(rounds):
        for b in BATCHES:
            fns = list(_callables(bodies[b], limits).items())
            if r % 2:
                fns.reverse()
            for name, fn in fns:
                out[b].setdefault(name, []).append(_per_call_s(fn, seconds) * 1e6 / b)
    return out


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f} to {max(values):.2f})"


def table(results: dict[int, dict[str, list[float]]]) -> str:
    lines = [
        (
            "| batch | reference µs/example | native µs/example | reference ÷ native | wired ref µs/example "
            "| wired µs/example | wired ref ÷ wired |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for b, res in results.items():
        ratio = [r / n for r, n in zip(res["reference"], res["native"], strict=True)]
        wired = [r / n for r, n in zip(res["wired ref"], res["wired"], strict=True)]
        lines.append(
            f"| {b} | {_fmt(res['reference'])} | {_fmt(res['native'])} | {_fmt(ratio)}x "
            f"| {_fmt(res['wired ref'])} | {_fmt(res['wired'])} | {_fmt(wired)}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.3, help="time per callable, batch and round")
    p.add_argument("--write", type=Path, default=None, help="rewrite this benchmark's section of the file")
    args = p.parse_args(argv)
    if native.path() != "native":
        print("embedgate_native is not built or EMBEDGATE_NATIVE=off: run `make install`", file=sys.stderr)
        return 2
    text = table(run(args.rounds, args.seconds))
    cmd = f"python -m benchmarks.native_codec_bench --rounds {args.rounds} --seconds {args.seconds}"
    body = f"Command: `{cmd}`; median over rounds (min to max).\n\n{text}"
    print(body)
    if args.write:
        begin, end = markers("native_codec_bench", str(args.write))
        write_section(
            args.write, begin, end, body, "## REST body parse: native vs Python reference (issue 17)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

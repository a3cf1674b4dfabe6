"""REST response writing, per example: the compiled writer (``embedgate_native`` through ``gateway.native``) vs the
Python reference writer (``gateway.codec.json_tensor.predict_response``), in one process, interleaved.

    .venv/bin/python -m benchmarks.native_response_bench [--rounds 5] [--seconds 0.3] [--write docs/benchmarks.md]

Output maps, as the REST route holds them after decoding the entry's PredictResponse (numpy arrays):

* ``score``: one float32 output of shape (batch, 1), the demo model's and a ranking model's answer, row format
  (``{"predictions": ...}``);
* ``score col``: the same in columnar format (``{"outputs": ...}``);
* ``three``: a float32 score (batch, 1), a float32 (batch, 16) vector and an int64 (batch, 4) tensor, row format
  (one object per example).

Values are random normal floats (9-digit tokens, the common case for model scores). Each round times, for every
case and batch in turn, both writers over the same arrays (each repeated for about ``--seconds`` of this process's
CPU time) and keeps the per-example CPU cost. Reported: the median over rounds (min to max) and the ratio
reference/native taken within each round. Both writers give the same bytes (checked once per case and batch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import markers, write_section
from gateway import native
from gateway.codec import json_tensor as jt

__all__ = ["main"]

BATCHES = (1, 64, 512, 4096)
CASES = ("score", "score col", "three")


def outputs_for(case: str, batch: int, seed: int = 0) -> tuple[dict[str, np.ndarray], jt.Format]:
    """The output map and format of ``case`` at ``batch`` examples."""
    rng = np.random.default_rng(seed)
    score = rng.random((batch, 1), dtype=np.float32)
    if case == "score":
        return {"score": score}, jt.Format.ROW
    if case == "score col":
        return {"score": score}, jt.Format.COLUMNAR
    vec = rng.standard_normal((batch, 16), dtype=np.float32)
    ids = rng.integers(0, 2_000_000, (batch, 4), dtype=np.int64)
    return {"score": score, "vec": vec, "ids": ids}, jt.Format.ROW


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


def _callables(outputs: dict[str, np.ndarray], fmt: jt.Format) -> dict[str, Callable[[], Any]]:
    want = jt.predict_response(outputs, fmt)
    if native.predict_response(outputs, fmt) != want:
        raise SystemExit(
            "the native writer and the reference disagree: run tests/gateway/test_native_response.py"
        )
    return {
        "reference": lambda: jt.predict_response(outputs, fmt),
        "native": lambda: native.predict_response(outputs, fmt),
    }


def run(rounds: int, seconds: float) -> dict[tuple[str, int], dict[str, list[float]]]:
    """CPU µs per example, by (case, batch) and writer, one value per round (all interleaved)."""
    cells = {(c, b): outputs_for(c, b) for c in CASES for b in BATCHES}
    out: dict[tuple[str, int], dict[str, list[float]]] = {k: {} for k in cells}
    for r in range(rounds):
        for key, (outputs, fmt) in cells.items():
            fns = list(_callables(outputs, fmt).items())
            if r % 2:
                fns.reverse()
            for name, fn in fns:
                out[key].setdefault(name, []).append(_per_call_s(fn, seconds) * 1e6 / key[1])
    return out


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f} to {max(values):.2f})"


def table(results: dict[tuple[str, int], dict[str, list[float]]]) -> str:
    lines = [
        "| outputs | batch | reference µs/example | native µs/example | reference ÷ native |",
        "|---|---|---|---|---|",
    ]
    for (case, b), res in results.items():
        ratio = [r / n for r, n in zip(res["reference"], res["native"], strict=True)]
        lines.append(f"| {case} | {b} | {_fmt(res['reference'])} | {_fmt(res['native'])} | {_fmt(ratio)}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.3, help="time per writer, case, batch and round")
    p.add_argument("--write", type=Path, default=None, help="rewrite this benchmark's section of the file")
    args = p.parse_args(argv)
    if native.path() != "native":
        print("embedgate_native is not built or EMBEDGATE_NATIVE=off: run `make install`", file=sys.stderr)
        return 2
    text = table(run(args.rounds, args.seconds))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    cmd = f"python -m benchmarks.native_response_bench --rounds {args.rounds} --seconds {args.seconds}"
    body = f"Command: `{cmd}`; median over rounds (min to max); load average at the end: {load}.\n\n{text}"
    print(body)
    if args.write:
        begin, end = markers("native_response_bench", str(args.write))
        write_section(
            args.write, begin, end, body, "## REST response writer: native vs Python reference (issue 17)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

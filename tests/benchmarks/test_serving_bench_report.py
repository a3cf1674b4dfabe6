"""benchmarks.serving_bench --write: the throughput-vs-clients table and both plots, from a report (no servers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import serving_bench

_TARGETS = ("whole", "split_bare", "gateway_grpc")


def _cell(value: float, ratio: float) -> dict[str, Any]:
    return {
        "p50_ms": value,
        "p99_ms": value,
        "rps": value,
        "min": round(value * 0.9, 3),
        "max": round(value * 1.1, 3),
        "ratio": ratio,
        "ratio_min": round(ratio - 0.05, 2),
        "ratio_max": round(ratio + 0.05, 2),
        "errors": 0,
    }


def _report() -> dict[str, Any]:
    by_clients = {
        str(c): {
            t: _cell(round(100.0 * c / (k + 1), 3), round(1 / (k + 1), 2)) for k, t in enumerate(_TARGETS)
        }
        for c in (1, 4, 8)
    }
    return {
        "machine": {"cores": 2},
        "command": "python -m benchmarks.serving_bench",
        "load_average_start": 1.0,
        "load_average_end": 2.0,
        "latency_p50": {str(b): {t: _cell(float(b), 1.0) for t in _TARGETS} for b in (1, 64)},
        "throughput_by_clients": {"batch": 64, "clients": by_clients},
        "throughput": {"batch": 64, "clients": 4, **by_clients["4"]},
        "passthrough": {
            "clients": 8,
            "batch": 64,
            "rps": {"direct_grpc": _cell(500.0, 1.0)},
            "p99_ms": {"direct_grpc": _cell(20.0, 1.0)},
        },
        "gateway_rss_mb_start": 90.0,
        "gateway_rss_mb_after": 120.0,
    }


def test_write_gives_throughput_per_client_count_and_both_plots(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\n{serving_bench.BEGIN}\nold\n{serving_bench.END}\n\nour reading\n")
    serving_bench._write(_report(), doc)
    text = doc.read_text()
    assert text.endswith(f"{serving_bench.END}\n\nour reading\n") and "\nold\n" not in text
    assert "| target | 1 client | 4 clients | 8 clients |" in text
    # split_bare (the second target) at 4 clients: 200 req/s, half the whole model's
    assert (
        "| split_bare | 50.0 [45.0-55.0] (0.5x [0.45-0.55]) | 200.0 [180.0-220.0] (0.5x [0.45-0.55]) |"
        in text
    )
    assert "![throughput vs clients](img/serving_throughput.png)" in text
    for png in ("serving_latency.png", "serving_throughput.png"):
        assert (tmp_path / "img" / png).read_bytes().startswith(b"\x89PNG")

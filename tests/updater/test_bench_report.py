"""benchmarks.updater_bench --write: rewrites only its own section of docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

from benchmarks import serving_bench, updater_bench


def _report() -> dict[str, object]:
    tp = {"median": 200_000, "min": 100_000, "max": 300_000}
    ratio = {
        "ratio": 0.87,
        "ratio_min": 0.5,
        "ratio_max": 1.8,
        "updater_cpu_ms_per_10k": 10.0,
        "ps_cpu_ms_per_10k": 23.0,
    }
    return {
        "command": "python -m benchmarks.updater_bench",
        "cpus": 2,
        "load_1m": 3.0,
        "dim": 64,
        "shards": 2,
        "rows": 200_000,
        "rounds": 3,
        "throughput": {
            "baseline": {**tp, "ps_cpu_ms_per_10k": 20.0},
            "drain": {
                **tp,
                **ratio,
                "updater_busy": 0.15,
                "iterations": 12.0,
                "iteration_ms": 90.0,
                "group_write_ms": 60.0,
                "groups_per_iteration": 2.0,
            },
            "publish_applied": {**tp, **ratio},
            "publish_only_rows_per_s": 190_000,
        },
        "sustained": [
            {
                "target_rows_per_s": 100_000,
                "runs": 2,
                "achieved_rows_per_s": 99_500,
                "probes": 640,
                "p50_ms": 61.0,
                "p99_ms": 114.0,
                "p99_min_ms": 114.0,
                "p99_max_ms": 120.0,
                "max_ms": 209.0,
                "first_third_p50_ms": 66.0,
                "last_third_p50_ms": 54.0,
                "catch_up_s": 0.19,
                "bounded_runs": 1,
                "updater_cpu_ms_per_10k": 16.0,
                "updater_core_share": 0.15,
            }
        ],
    }


def test_write_replaces_its_section_and_keeps_the_others(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    serving = f"{serving_bench.BEGIN}\nserving table\n{serving_bench.END}"
    doc.write_text(f"# Benchmarks\n\n{serving}\n\nreading of serving\n")
    updater_bench._write(_report(), doc)  # no markers yet: a section is appended
    first = doc.read_text()
    assert first.startswith(f"# Benchmarks\n\n{serving}\n\nreading of serving\n")
    assert first.count(updater_bench.BEGIN) == 1 and first.count(updater_bench.END) == 1
    assert "| 100,000 | 99,500 | 61 ms | 114 ms [114-120] |" in first
    assert "**no** (1 of 2 runs)" in first  # one run of two lost its bound: not reported as bounded
    assert "0.87x [0.5-1.8]" in first
    assert "12 iterations of 90 ms, 2.0 group writes each (concurrent), 60 ms per group write" in first
    doc.write_text(first + "\nour reading after the table\n")
    updater_bench._write(_report(), doc)  # markers present: only the text between them changes
    assert doc.read_text() == first + "\nour reading after the table\n"

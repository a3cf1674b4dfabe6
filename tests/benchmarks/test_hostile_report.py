"""benchmarks.hostile: verdicts, the overload row, the Markdown table and its section, the gzip bomb (pure parts)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from benchmarks import hostile
from benchmarks.hostile import BEGIN, END, ClassResult, gzip_bomb, overload_result, table, verdict
from benchmarks.report import write_section


def test_verdict_names_each_missed_target() -> None:
    ok = ClassResult("shape_bombs", "gRPC", 12, internal_unknown=0, healthz_ms=40.0)
    assert verdict(ok) == []
    bad = ClassResult(
        "x", "REST", 10, five_xx=2, internal_unknown=3, healthz_ms=3400.0, problems=["updater died"]
    )
    assert verdict(bad) == ["updater died", "/healthz 3400 ms", "2 5xx", "3 INTERNAL/UNKNOWN"]
    edge = ClassResult("x", "REST", 1, five_xx=0, healthz_ms=hostile.HEALTHZ_MS)
    assert verdict(edge) == []  # the targets are inclusive


def test_overload_row_from_per_request_outcomes() -> None:
    # 10 s of offered load against a capacity of 100/s: 850 OK, 2000 shed, 3 errors
    codes = ["OK"] * 850 + ["SHED"] * 2000 + ["500", "500", "timeout"]
    lat = [200.0] * 840 + [1500.0] * 10 + [2.0] * 1500 + [30.0] * 500 + [1.0, 1.0, 10_000.0]
    r = overload_result("overload_3x", "REST", codes, lat, 10.0, 100.0)
    assert r.goodput == pytest.approx(0.85)
    assert r.shed_p50_ms == pytest.approx(2.0)
    assert r.ok_p99_ms is not None and 200 < r.ok_p99_ms <= 1500
    assert r.five_xx == 2 and r.internal_unknown is None
    assert verdict(r) == ["2 5xx", f"accepted p99 {r.ok_p99_ms:.0f} ms"]
    assert "850 OK, 2,000 shed, 2 500, 1 timeout" in r.outcome

    g = overload_result(
        "overload_1.5x", "gRPC", ["OK"] * 10 + ["INTERNAL"] + ["SHED"] * 5, [1.0] * 16, 1.0, 100.0
    )
    assert g.internal_unknown == 1 and g.five_xx is None
    assert verdict(g) == ["1 INTERNAL/UNKNOWN", "goodput 0.10x"]


def test_table_rows_and_targets() -> None:
    rows = [
        ClassResult("gzip_bombs", "REST", 20, five_xx=0, healthz_ms=4100.0, outcome="20 400 | fast"),
        ClassResult(
            "malformed", "gRPC", 250, internal_unknown=0, healthz_ms=30.0, outcome="250 INVALID_ARGUMENT"
        ),
    ]
    text = table(rows, "header line")
    lines = text.splitlines()
    assert lines[0] == "header line"
    assert "Targets:" in lines[2] and "<= 250 ms" in lines[2] and "goodput >= 0.8x" in lines[2]
    assert lines[4].startswith("| class | front |")
    assert (
        lines[6] == "| gzip_bombs | REST | 20 | 0 | - | 4,100 ms | 20 400 / fast | missed: /healthz 4100 ms |"
    )
    assert lines[7] == "| malformed | gRPC | 250 | - | 0 | 30 ms | 250 INVALID_ARGUMENT | met |"


def test_table_goes_between_its_markers(tmp_path: Path) -> None:
    doc = tmp_path / "security.md"
    doc.write_text(f"# Security\n\nbefore\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    write_section(doc, BEGIN, END, table([], "new header"), None)
    text = doc.read_text()
    assert "old" not in text and "new header" in text
    assert text.startswith("# Security\n\nbefore\n") and text.endswith("\nafter\n")


def test_gzip_bomb_inflates_to_the_promised_zeros() -> None:
    chunk = 1 << 20
    bomb = gzip_bomb(4 * chunk, chunk)
    assert len(bomb) < 4 * chunk // 100  # a bomb: over 100x
    assert gzip.decompress(bomb) == bytes(4 * chunk)  # a valid member: CRC and size check out


def test_descendants_finds_children_and_grandchildren() -> None:
    """The overload class pins every process the benchmark started: found through /proc, however deep."""
    import os
    import signal
    import subprocess
    import sys

    if not Path("/proc/self/task").exists():
        pytest.skip("no /proc")
    code = "import subprocess; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); p.wait()"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = 0
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        found = hostile._descendants(os.getpid())
        assert child.pid in found and grandchild in found
    finally:
        if grandchild:
            os.kill(grandchild, signal.SIGKILL)
        child.kill()
        child.communicate(timeout=30)  # closes its stdout


def test_bucket_quantile_names_the_bucket_holding_the_quantile() -> None:
    buckets = {0.1: 90.0, 0.5: 98.0, 1.0: 99.5, float("inf"): 100.0}  # cumulative, as Prometheus gives them
    assert hostile._bucket_quantile(buckets, 0.5) == "100 ms"
    assert hostile._bucket_quantile(buckets, 0.99) == "1000 ms"
    assert hostile._bucket_quantile({**buckets, 1.0: 98.0}, 0.99) == "inf"
    assert hostile._bucket_quantile({}, 0.99) == "n/a"


def test_rounds_combine_into_one_row_of_medians() -> None:
    """Goodput, 429 median and accepted p99 are the rounds' medians with their spread; the worst /healthz, every 5xx
    and every problem of any round count; the text ends with the median round's own."""
    rows = [
        ClassResult(
            "overload_3x",
            "REST",
            100,
            five_xx=0,
            healthz_ms=h,
            outcome=f"round {g}",
            goodput=g,
            shed_p50_ms=s,
            ok_p99_ms=p,
        )
        for g, s, p, h in ((0.95, 0.2, 300.0, 40.0), (0.70, 0.4, 900.0, 300.0), (0.85, 0.3, 500.0, 50.0))
    ]
    rows[1].five_xx = 2
    rows[2].problems = ["x"]
    c = hostile.combine_rounds(rows)
    assert c.goodput == pytest.approx(0.85) and c.shed_p50_ms == pytest.approx(0.3) and c.ok_p99_ms == 500.0
    assert c.requests == 300 and c.five_xx == 2 and c.healthz_ms == 300.0 and c.problems == ["x"]
    assert c.outcome.startswith("3 rounds, median [min-max]: goodput 0.85x [0.70-0.95], 429 median 0.3 ms")
    assert c.outcome.endswith("the median round (3): round 0.85")
    assert verdict(c) == ["x", "/healthz 300 ms", "2 5xx"]
    assert hostile.combine_rounds(rows[:1]) is rows[0]
    below = [ClassResult("overload_0.8x", "gRPC", 10, internal_unknown=0, outcome="o")] * 2
    b = hostile.combine_rounds(below)
    assert b.goodput is None and b.five_xx is None and b.internal_unknown == 0 and "goodput" not in b.outcome

"""benchmarks/native_codec_bench.py: its bodies type the same on both paths and the table has every batch."""

from __future__ import annotations

import pytest

from benchmarks import native_codec_bench as bench
from gateway import native
from gateway.codec import json_tensor as jt

pytestmark = pytest.mark.skipif(not native.available(), reason="embedgate_native is not built (make install)")


def test_bench_body_types_the_same_natively() -> None:
    body = bench.body_for(8)
    got = native.predict_tensors(body, bench.DTYPES)
    assert got is not None
    want, fmt = jt.tensors_from_request(jt.loads(body), bench.DTYPES)
    assert got[1] is fmt
    for name, arr in want.items():
        assert got[0][name].dtype == arr.dtype and got[0][name].tobytes() == arr.tobytes()
    assert got[0]["ids"].shape == (8, 26) and got[0]["dense"].shape == (8, 13)


def test_table_has_every_batch() -> None:
    results = bench.run(rounds=1, seconds=0.0)
    text = bench.table(results)
    for b in bench.BATCHES:
        assert f"\n| {b} | " in text

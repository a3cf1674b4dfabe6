"""schemas.deltas: binary/JSON round trips (hypothesis), every bad input with its message, HPS golden bytes."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.deltas import (
    BINARY_MAGIC,
    DeltaError,
    DeltaOp,
    EmbeddingDelta,
    check_against_manifest,
    decode_delta,
    decode_hps,
    encode_delta,
    encode_delta_json,
    encode_hps,
    hps_topic,
)
from schemas.manifest import Manifest

NAMES = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,20}", fullmatch=True)


@st.composite
def deltas(draw: st.DrawFn) -> EmbeddingDelta:
    n = draw(st.integers(1, 20))
    op = draw(st.sampled_from(list(DeltaOp)))
    ids = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n))
    values = None
    if op is DeltaOp.UPSERT:
        dim = draw(st.integers(1, 8))
        flat = draw(st.lists(st.floats(width=32, allow_nan=False), min_size=n * dim, max_size=n * dim))
        values = np.asarray(flat, dtype=np.float32).reshape(n, dim)
    return EmbeddingDelta(
        model=draw(NAMES),
        table=draw(NAMES),
        op=op,
        ids=np.asarray(ids, dtype=np.int64),
        values=values,
        timestamp_ms=draw(st.integers(0, 2**63 - 1)),
        sequence=draw(st.integers(0, 2**63 - 1)),
        producer=draw(st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)),
    )


@settings(max_examples=150, deadline=None)
@given(deltas())
def test_binary_round_trip(delta: EmbeddingDelta) -> None:
    assert decode_delta(encode_delta(delta)) == delta


@settings(max_examples=100, deadline=None)
@given(deltas())
def test_json_round_trip(delta: EmbeddingDelta) -> None:
    assert decode_delta(encode_delta_json(delta)) == delta


@settings(max_examples=100, deadline=None)
@given(deltas(), st.data())
def test_any_truncation_is_a_delta_error(delta: EmbeddingDelta, data: st.DataObject) -> None:
    raw = encode_delta(delta)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DeltaError) as info:
        decode_delta(raw[:cut])
    assert info.value.reason in {"truncated", "bad_magic"}


def _delta(**kw: object) -> EmbeddingDelta:
    base: dict[str, object] = {
        "model": "demo",
        "table": "item",
        "op": "upsert",
        "ids": [7, 8],
        "values": [[1.0, 2.0], [3.0, 4.0]],
        "timestamp_ms": 1000,
        "sequence": 3,
        "producer": "t0",
    }
    base.update(kw)
    return EmbeddingDelta(**base)  # type: ignore[arg-type]


def test_binary_golden_bytes() -> None:
    raw = encode_delta(_delta())
    expected = (
        b"EGDM"
        + bytes([1, 1])
        + b"\0\0"
        + struct.pack("<qqIIBBBB", 1000, 3, 2, 2, 4, 4, 2, 0)
        + b"demo"
        + b"item"
        + b"t0"
        + struct.pack("<qq", 7, 8)
        + struct.pack("<4f", 1, 2, 3, 4)
    )
    assert raw == expected
    assert len(raw) == 36 + 10 + 16 + 16


def test_delete_golden_bytes() -> None:
    raw = encode_delta(_delta(op="delete", values=None, ids=[5], producer=""))
    assert raw == b"EGDM\x01\x02\x00\x00" + struct.pack(
        "<qqIIBBBB", 1000, 3, 1, 0, 4, 4, 0, 0
    ) + b"demoitem" + (struct.pack("<q", 5))


def _patch(raw: bytes, offset: int, fmt: str, value: int) -> bytes:
    b = bytearray(raw)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


GOOD = encode_delta(_delta())


@pytest.mark.parametrize(
    ("raw", "reason", "message"),
    [
        (b"XXXX" + GOOD[4:], "bad_magic", r"wrong magic b'XXXX' at offset 0"),
        (b"", "truncated", r"truncated at offset 0"),
        (b"EG", "truncated", r"truncated at offset 2"),
        (GOOD[:20], "truncated", r"truncated at offset 20: header needs 36 bytes"),
        (GOOD[:-1], "truncated", rf"truncated at offset {len(GOOD) - 1}: n=2, dim=2 need {len(GOOD)} bytes"),
        (GOOD[:50], "truncated", r"truncated at offset 50: .*ids incomplete"),
        (GOOD + b"\0\0\0\0", "shape_mismatch", r"4 trailing bytes after offset .*n\*dim does not match"),
        (_patch(GOOD, 28, "<I", 3), "truncated", r"n=2, dim=3"),
        (_patch(GOOD, 28, "<I", 1), "shape_mismatch", r"trailing bytes"),
        (_patch(GOOD, 5, "<B", 9), "unknown_op", r"unknown op code 9 at offset 5"),
        (_patch(GOOD, 4, "<B", 2), "bad_version", r"unsupported format version 2 at offset 4"),
        (_patch(GOOD, 6, "<H", 1), "invalid_field", r"reserved header bytes"),
        (_patch(GOOD, 24, "<I", 0), "shape_mismatch", r"n = 0 ids"),
        (_patch(GOOD, 28, "<I", 0), "shape_mismatch", r"upsert with dim = 0"),
        (_patch(GOOD, 8, "<q", -5), "invalid_field", r"negative timestamp_ms -5 at offset 8"),
        (_patch(GOOD, 32, "<B", 200), "truncated", r"model name needs bytes 36\.\.236"),
        (GOOD[:36] + b"9emo" + GOOD[40:], "invalid_field", r"model name '9emo' is not a valid name"),
        (b"HCTR\x08\x00\x00\x00", "bad_magic", r"HPS message .* on a delta topic"),
        (None, "bad_magic", r"null value"),
        (b"{not json", "invalid_json", r"invalid JSON at offset 1"),
        (b'{"model": "demo"}', "invalid_json", r"table: Field required"),
        (
            b'{"model":"demo","table":"item","op":"add","ids":[1],"timestamp_ms":1}',
            "unknown_op",
            r"unknown op 'add'",
        ),
        (
            b'{"model":"demo","table":"item","op":"upsert","ids":[1,2],"values":[[1,2]],"timestamp_ms":1}',
            "shape_mismatch",
            r"values has 1 rows but there are 2 ids",
        ),
        (
            b'{"model":"demo","table":"item","op":"upsert","ids":[1,2],"values":[[1,2],[3]],"timestamp_ms":1}',
            "shape_mismatch",
            r"different lengths \[1, 2\]",
        ),
        (
            b'{"model":"demo","table":"item","op":"upsert","ids":[1],"timestamp_ms":1}',
            "invalid_field",
            r"an upsert needs values",
        ),
        (
            b'{"model":"demo","table":"item","op":"delete","ids":[],"timestamp_ms":1}',
            "invalid_field",
            r"ids must not be empty",
        ),
        (
            b'{"model":"demo","table":"item","op":"delete","ids":[1],"timestamp_ms":1,"extra":2}',
            "invalid_json",
            r"extra: Extra inputs are not permitted",
        ),
    ],
)
def test_bad_input_names_the_problem(raw: bytes | None, reason: str, message: str) -> None:
    with pytest.raises(DeltaError, match=message) as info:
        decode_delta(raw)
    assert info.value.reason == reason


# -- HPS --------------------------------------------------------------------------------------------------------------
HPS_GOLDEN = bytes.fromhex(
    "48435452"  # "HCTR"
    "08000000"  # 8 bytes per vector (dim 2)
    "0700000000000000"
    "0000803f"
    "00000040"  # key 7: [1.0, 2.0]
    "feffffffffffffff"
    "000040c0"
    "0000c03f"  # key -2: [-3.0, 1.5]
)


def test_hps_golden_decode() -> None:
    d = decode_hps("hps_et.demo.item", HPS_GOLDEN, timestamp_ms=123, sequence=9)
    assert d is not None
    assert (d.model, d.table, d.op, d.timestamp_ms, d.sequence) == ("demo", "item", DeltaOp.UPSERT, 123, 9)
    assert d.ids.tolist() == [7, -2]
    assert d.values is not None and d.values.tolist() == [[1.0, 2.0], [-3.0, 1.5]]


def test_hps_encode_matches_golden() -> None:
    assert encode_hps([7, -2], [[1.0, 2.0], [-3.0, 1.5]]) == HPS_GOLDEN
    assert struct.unpack("<I", HPS_GOLDEN[:4])[0] == 0x52544348
    assert hps_topic("demo", "item") == "hps_et.demo.item"


def test_hps_beacon_and_null_are_ignored() -> None:
    assert decode_hps("hps_et.demo.item", b"HCTR\x08\x00\x00\x00") is None
    assert decode_hps("hps_et.demo.item", None) is None


@pytest.mark.parametrize(
    ("topic", "value", "key", "reason", "message"),
    [
        ("hps_et.demo", HPS_GOLDEN, None, "bad_topic", r"not hps_et.<model>.<table>"),
        ("hps_et.demo.item", HPS_GOLDEN, b"k", "unexpected_key", r"has a key"),
        ("hps_et.demo.item", b"HCT", None, "truncated", r"truncated at offset 3"),
        ("hps_et.demo.item", b"XCTR" + HPS_GOLDEN[4:], None, "bad_magic", r"wrong magic b'XCTR'"),
        (
            "hps_et.demo.item",
            HPS_GOLDEN[:-3],
            None,
            "truncated",
            r"truncated at offset 24: 13 bytes of a 16-byte",
        ),
        (
            "hps_et.demo.item",
            b"HCTR\x07\x00\x00\x00" + b"\0" * 15,
            None,
            "shape_mismatch",
            r"bytes per vector 7",
        ),
        ("hps_et.my-model.item", HPS_GOLDEN, None, "unknown_model", r"'my-model' cannot name"),
    ],
)
def test_hps_bad_input(topic: str, value: bytes, key: bytes | None, reason: str, message: str) -> None:
    with pytest.raises(DeltaError, match=message) as info:
        decode_hps(topic, value, key=key)
    assert info.value.reason == reason


# -- manifest checks ----------------------------------------------------------------------------------------------------
MANIFEST = Manifest.model_validate(
    {
        "model_name": "demo",
        "version": 1,
        "tables": [{"name": "item", "dim": 2}, {"name": "free", "dim": 2, "allow_nan": True}],
        "sparse_features": [{"name": "item_id", "table": "item"}],
        "partition": {"num_shards": 2},
        "entry": {"outputs": [{"name": "p", "shape": [1]}]},
    }
)


@pytest.mark.parametrize(
    ("delta", "reason", "message"),
    [
        (_delta(model="other"), "unknown_model", r"model 'other'"),
        (_delta(table="user"), "unknown_table", r"has no table 'user' \(tables: item, free\)"),
        (
            _delta(values=[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]),
            "dim_mismatch",
            r"has dim 2, the delta has dim 3",
        ),
        (_delta(values=[[1.0, 2.0], [np.nan, 4.0]]), "nan_values", r"row 1 \(id 8\) holds NaN/Inf"),
        (_delta(values=[[np.inf, 2.0], [1.0, 4.0]]), "nan_values", r"row 0 \(id 7\)"),
        (_delta(values=[[np.inf, 2.0], [-np.inf, 4.0]]), "nan_values", r"row 0 \(id 7\)"),  # sum is NaN
        (_delta(values=[[3e38, 3e38], [3e38, -np.inf]]), "nan_values", r"row 1 \(id 8\)"),
    ],
)
def test_manifest_checks(delta: EmbeddingDelta, reason: str, message: str) -> None:
    with pytest.raises(DeltaError, match=message) as info:
        check_against_manifest(delta, MANIFEST)
    assert info.value.reason == reason


def test_manifest_checks_pass() -> None:
    check_against_manifest(_delta(), MANIFEST)
    # finite rows whose float32 sum overflows
    check_against_manifest(_delta(values=[[3e38, 3e38], [3e38, 3e38]]), MANIFEST)
    check_against_manifest(_delta(table="free", values=[[np.nan, 1.0], [2.0, 3.0]]), MANIFEST)
    check_against_manifest(_delta(op="delete", values=None), MANIFEST)


def test_binary_decode_views_the_message_bytes() -> None:
    """Zero-copy: the decoded ids and rows are read-only views of the message buffer, not copies."""
    d = _delta(ids=np.arange(1000, dtype=np.int64), values=np.ones((1000, 2), np.float32))
    raw = encode_delta(d)
    got = decode_delta(raw)
    assert got.values is not None
    buf = np.frombuffer(raw, np.uint8)
    assert np.shares_memory(got.ids, buf) and np.shares_memory(got.values, buf)
    assert not got.ids.flags.writeable and not got.values.flags.writeable
    assert got == d


def test_arrays_are_read_only_and_typed() -> None:
    d = _delta(ids=np.asarray([1, 2], dtype=np.uint8))
    assert d.ids.dtype == np.int64 and not d.ids.flags.writeable
    assert d.values is not None and d.values.dtype == np.float32
    assert BINARY_MAGIC == b"EGDM"

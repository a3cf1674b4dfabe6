"""gateway.grpc_front.messages (pure): parsing client messages and checking them against the limits."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.errors import InvalidArgument, PayloadTooLarge
from gateway.grpc_front.messages import (
    _ITEM_BYTES,
    MAX_NAME_BYTES,
    MAX_RANK,
    check_examples,
    check_message,
    check_spec_sizes,
    check_tensor,
    input_bytes,
    parse_message,
)
from gateway.grpc_front.messages import _varint as messages_varint
from schemas.gateway_settings import LimitsSettings
from schemas.proto import tfs_pb2
from tests.support.native import native_mode

_LIMITS = LimitsSettings(max_instances=1000, max_ids_per_feature=50)
_MAX_BODY = 1 << 20
DT = tfs_pb2.DataType


def _tensor(shape: list[int], dtype: Any = DT.DT_FLOAT) -> tfs_pb2.TensorProto:
    t = tfs_pb2.TensorProto(dtype=dtype)
    for size in shape:
        t.tensor_shape.dim.add().size = size
    return t


@settings(max_examples=300, deadline=None)
@given(
    shape=st.lists(st.integers(-5, 2**62), max_size=6) | st.lists(st.integers(0, 40), max_size=8),
    dtype=st.sampled_from([DT.DT_FLOAT, DT.DT_DOUBLE, DT.DT_INT8, DT.DT_STRING, DT.DT_BFLOAT16]),
)
def test_check_tensor_is_the_exact_size_or_the_right_error(shape: list[int], dtype: Any) -> None:
    """Within the bounds: the exact decoded bytes; else InvalidArgument (negative) or PayloadTooLarge (sizes)."""
    item = {DT.DT_FLOAT: 4, DT.DT_DOUBLE: 8, DT.DT_INT8: 1, DT.DT_STRING: 8, DT.DT_BFLOAT16: 8}[dtype]
    t = _tensor(shape, dtype)
    if any(s < 0 for s in shape):
        with pytest.raises(InvalidArgument, match="sizes must be >= 0"):
            check_tensor("input 'x'", t, _LIMITS, _MAX_BODY)
    elif shape and shape[0] > _LIMITS.max_instances:
        with pytest.raises(PayloadTooLarge, match="limits.max_instances"):
            check_tensor("input 'x'", t, _LIMITS, _MAX_BODY)
    elif math.prod(shape) * item > _MAX_BODY:
        with pytest.raises(PayloadTooLarge, match=r"decodes to more than 1048576 bytes \(max_body_bytes\)"):
            check_tensor("input 'x'", t, _LIMITS, _MAX_BODY)
    else:
        assert check_tensor("input 'x'", t, _LIMITS, _MAX_BODY) == math.prod(shape) * item


def test_rank_and_unknown_rank() -> None:
    assert check_tensor("x", _tensor([1] * MAX_RANK), _LIMITS, _MAX_BODY) == 4
    with pytest.raises(
        InvalidArgument, match=f"x: the tensor has {MAX_RANK + 1} dimensions, more than {MAX_RANK}"
    ):
        check_tensor("x", _tensor([1] * (MAX_RANK + 1)), _LIMITS, _MAX_BODY)
    t = tfs_pb2.TensorProto(dtype=DT.DT_FLOAT)
    t.tensor_shape.unknown_rank = True
    assert check_tensor("x", t, _LIMITS, _MAX_BODY) == 0
    long_shape = [1] * 20 + [2**60]
    with pytest.raises(PayloadTooLarge, match=r"\[1, 1, 1, 1, 1, 1, 1, 1, \.\.\.\] \(21 dimensions\)"):
        check_tensor("x", _tensor(long_shape), _LIMITS, _MAX_BODY)


def _examples(n: int, values: int, context: bool = False) -> tfs_pb2.Input:
    inp = tfs_pb2.Input()
    target = inp.example_list_with_context if context else inp.example_list
    for _ in range(n):
        target.examples.add().features.feature["f"].int64_list.value.extend(range(values))
    if context:
        inp.example_list_with_context.context.features.feature["c"].bytes_list.value.extend([b"a"] * values)
    return inp


def test_check_examples() -> None:
    check_examples(_examples(1000, 50), _LIMITS)
    check_examples(tfs_pb2.Input(), _LIMITS)  # no examples at all: the core words that error
    with pytest.raises(PayloadTooLarge, match="the input has 1001 examples, more than the limit of 1000"):
        check_examples(_examples(1001, 1), _LIMITS)
    with pytest.raises(PayloadTooLarge, match="feature 'f' of example 0 has 51 values"):
        check_examples(_examples(2, 51), _LIMITS)
    with pytest.raises(PayloadTooLarge, match="feature 'c' of the context has 51 values"):
        check_examples(_examples(0, 51, context=True), _LIMITS)
    check_examples(_examples(2, 51), _LIMITS, per_feature=False)


def test_parse_message_names_the_message_and_nothing_internal() -> None:
    for kind, name in (
        (tfs_pb2.PredictRequest, "PredictRequest"),
        (tfs_pb2.ClassificationRequest, "ClassificationRequest"),
        (tfs_pb2.RegressionRequest, "RegressionRequest"),
        (tfs_pb2.GetModelMetadataRequest, "GetModelMetadataRequest"),
        (tfs_pb2.GetModelStatusRequest, "GetModelStatusRequest"),
    ):
        with pytest.raises(InvalidArgument) as exc:
            parse_message(kind, b"\xff\xff\xff", _LIMITS, _MAX_BODY)
        assert exc.value.message == f"Cannot parse the {name} message"
        assert exc.value.__cause__ is None and exc.value.__suppress_context__


def test_parse_message_checks_and_sizes() -> None:
    req = tfs_pb2.PredictRequest()
    req.inputs["a"].CopyFrom(_tensor([3, 2]))
    req.inputs["s"].CopyFrom(_tensor([3], DT.DT_STRING))
    parsed = parse_message(tfs_pb2.PredictRequest, req.SerializeToString(), _LIMITS, _MAX_BODY)
    assert parsed.decoded_bytes == 3 * 2 * 4 + 3 * 8 and set(parsed.message.inputs) == {"a", "s"}
    assert check_message(tfs_pb2.PredictRequest, req.SerializeToString(), _LIMITS, _MAX_BODY) == 48
    req.inputs["b"].CopyFrom(_tensor([1, -1]))
    with pytest.raises(InvalidArgument, match="input 'b': dimension 1 of the tensor shape is -1"):
        parse_message(tfs_pb2.PredictRequest, req.SerializeToString(), _LIMITS, _MAX_BODY)
    reg = tfs_pb2.RegressionRequest(input=_examples(2, 51))
    raw = reg.SerializeToString()
    assert len(raw) > _LIMITS.max_ids_per_feature  # large enough for the per-feature pass
    with pytest.raises(PayloadTooLarge, match="max_ids_per_feature"):
        parse_message(tfs_pb2.RegressionRequest, raw, _LIMITS, _MAX_BODY)
    cls = tfs_pb2.ClassificationRequest(input=_examples(1001, 0))
    with pytest.raises(PayloadTooLarge, match="max_instances"):
        parse_message(tfs_pb2.ClassificationRequest, cls.SerializeToString(), _LIMITS, _MAX_BODY)


_SPEC_TEXT = st.text(alphabet="ab.", max_size=20) | st.integers(4090, 4100).map(lambda n: "x" * n)


@given(
    name=_SPEC_TEXT,
    signature=_SPEC_TEXT,
    label=st.none() | _SPEC_TEXT,
    kind=st.sampled_from(
        [
            tfs_pb2.PredictRequest,
            tfs_pb2.ClassificationRequest,
            tfs_pb2.RegressionRequest,
            tfs_pb2.GetModelMetadataRequest,
            tfs_pb2.GetModelStatusRequest,
        ]
    ),
)
def test_spec_sizes_from_the_wire_agree_with_the_parsed_message(
    name: str, signature: str, label: str | None, kind: type[Any]
) -> None:
    spec = tfs_pb2.ModelSpec(name=name, signature_name=signature)
    if label is None:
        spec.version.value = 7
    else:
        spec.version_label = label
    raw = kind(model_spec=spec).SerializeToString()
    too_long = [
        f
        for f, v in (("name", name), ("signature_name", signature), ("version_label", label))
        if v and len(v) > MAX_NAME_BYTES
    ]
    if too_long:
        with pytest.raises(
            InvalidArgument, match=rf"model_spec\.({'|'.join(too_long)}) is (4,09[7-9]|4,100) bytes"
        ):
            check_spec_sizes(raw)
    else:
        check_spec_sizes(raw)


@given(st.binary(max_size=64))
def test_spec_sizes_leave_what_they_cannot_read_to_the_parser(raw: bytes) -> None:
    try:
        check_spec_sizes(raw)
    except InvalidArgument as exc:  # only for a readable spec with a long string, which 64 bytes cannot hold
        pytest.fail(str(exc))


def _spec_outcome(raw: bytes, mode: str) -> str | None:
    with native_mode(mode):
        try:
            check_spec_sizes(raw)
        except InvalidArgument as exc:
            return exc.message
    return None


_LONG = st.integers(4094, 4098).map(lambda n: b"x" * n)
_FIELD = st.one_of(
    st.tuples(st.sampled_from([1, 2, 3, 4, 5, 9]), st.just(2), st.binary(max_size=8) | _LONG),
    st.tuples(st.integers(1, 20), st.sampled_from([0, 1, 5]), st.binary(min_size=8, max_size=8)),
    st.tuples(st.integers(1, 20), st.sampled_from([3, 6, 7]), st.just(b"")),
)


def _varint(value: int) -> bytes:
    out = b""
    while value >= 0x80:
        out += bytes([value & 0x7F | 0x80])
        value >>= 7
    return out + bytes([value])


def _wire(fields: list[tuple[int, int, bytes]]) -> bytes:
    """Fields framed by hand: length-delimited values with their length, fixed and varint values as they are."""
    out = b""
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        if wire == 2:
            out += _varint(len(value)) + value
        elif wire == 0:
            out += bytes([value[0] & 0x7F])
        elif wire == 1:
            out += value
        elif wire == 5:
            out += value[:4]
    return out


@settings(max_examples=300, deadline=None)
@given(
    spec=st.lists(st.tuples(st.sampled_from([1, 3, 4]), st.just(2), _LONG) | _FIELD, max_size=5),
    before=st.lists(_FIELD, max_size=70),
    after=st.lists(_FIELD, max_size=3),
    cut=st.sampled_from([None, None, None]) | st.integers(0, 9000),
    junk=st.binary(max_size=64),
)
def test_spec_sizes_read_natively_equal_the_reference(
    spec: list[tuple[int, int, bytes]],
    before: list[tuple[int, int, bytes]],
    after: list[tuple[int, int, bytes]],
    cut: int | None,
    junk: bytes,
) -> None:
    """The native reading (native/src/spec_sizes.rs) and the reference give the same refusal or none, on messages
    with long and short spec strings, unknown and fixed-width fields, more fields than are read, several specs,
    truncation and arbitrary bytes."""
    if not native.available() or not hasattr(native._module(), "spec_too_long"):
        pytest.skip("embedgate_native is not built with the spec reading (make install)")
    raw = _wire([*before, (1, 2, _wire(spec)), *after])
    if cut is not None:
        raw = raw[:cut]
    for message in (raw, junk, junk + raw):
        assert _spec_outcome(message, "auto") == _spec_outcome(message, "off")


def _signed(value: int) -> bytes:
    """A varint of an int64 (negative values as protobuf writes them: ten bytes of two's complement)."""
    return _varint(value & (2**64 - 1))


def _framed(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


_SIZES = st.integers(-3, 40) | st.integers(-(2**63), 2**63 - 1) | st.sampled_from([1, 2, 1000, 1001, 262_144])


def _some(item: st.SearchStrategy[Any], most: int = 2) -> st.SearchStrategy[list[Any]]:
    """Mostly exactly one ``item`` (protobuf's plain reading), else none or several (a merged or last-wins one)."""
    return st.one_of(item.map(lambda x: [x]), item.map(lambda x: [x]), st.lists(item, max_size=most))


_DIM = _some(_SIZES).map(lambda sizes: b"".join(b"\x08" + _signed(s) for s in sizes))
_SHAPE = st.tuples(
    st.lists(_DIM, max_size=4) | st.lists(_DIM, min_size=63, max_size=66),
    st.sampled_from([None, None, 0, 1]),
).map(lambda s: b"".join(_framed(2, d) for d in s[0]) + (b"" if s[1] is None else b"\x18" + _signed(s[1])))
_DTYPES = st.sampled_from([0, 1, 2, 3, 4, 7, 9, 14, 19, 21, 23, 99, -1])
_TENSOR = st.tuples(_some(_DTYPES), _some(_SHAPE), st.binary(max_size=8)).map(
    lambda t: (
        b"".join(b"\x08" + _signed(d) for d in t[0])
        + b"".join(_framed(2, s) for s in t[1])
        + (_framed(4, t[2]) if t[2] else b"")
    )
)
_ENTRY = st.tuples(_some(st.sampled_from(["a", "b", "c", "d", "e", "f", "é"])), _some(_TENSOR)).map(
    lambda e: b"".join(_framed(1, k.encode()) for k in e[0]) + b"".join(_framed(2, v) for v in e[1])
)


def _reference_bytes(message: tfs_pb2.PredictRequest, limits: LimitsSettings, max_body: int) -> object:
    try:
        return sum(check_tensor(f"input {k!r}", t, limits, max_body) for k, t in message.inputs.items())
    except (InvalidArgument, PayloadTooLarge) as exc:
        return type(exc).__name__


@settings(max_examples=400, deadline=None)
@given(
    entries=st.lists(_ENTRY, max_size=5),
    spec=st.booleans(),
    max_instances=st.sampled_from([1, 1000]),
    max_body=st.sampled_from([64, _MAX_BODY]),
)
def test_input_bytes_read_natively_equal_the_reference(
    entries: list[bytes], spec: bool, max_instances: int, max_body: int
) -> None:
    """The native shape check (native/src/shape_check.rs) answers only what the reference (check_tensor over the
    parsed message) answers, the same bytes; it declines every refusal (the reference words it) and answers every
    message protobuf reads plainly (each key, dtype, shape and dim size once) whose inputs all pass."""
    if not native.available() or not hasattr(native._module(), "predict_input_bytes"):
        pytest.skip("embedgate_native is not built with the shape check (make install)")
    raw = (_framed(1, b"\x0a\x01m") if spec else b"") + b"".join(_framed(2, e) for e in entries)
    message = tfs_pb2.PredictRequest.FromString(raw)
    limits = LimitsSettings(max_instances=max_instances, max_ids_per_feature=50)
    want = _reference_bytes(message, limits, max_body)
    got = native.predict_input_bytes(raw, _ITEM_BYTES, 8, MAX_RANK, max_instances, max_body)
    if got is not None:
        assert got == want
    plain = _plainly_read(entries)
    if isinstance(want, int) and plain:
        assert got == want
    with native_mode("auto"):
        assert _outcome(message, raw, limits, max_body) == want
    with native_mode("off"):
        assert _outcome(message, raw, limits, max_body) == want


def _outcome(message: tfs_pb2.PredictRequest, raw: bytes, limits: LimitsSettings, max_body: int) -> object:
    try:
        return input_bytes(message, raw, limits, max_body)
    except (InvalidArgument, PayloadTooLarge) as exc:
        return type(exc).__name__


def _plainly_read(entries: list[bytes]) -> bool:
    """Whether every entry has at most one key (all distinct), one value, and its tensor one dtype and one shape
    whose dims have at most one size each: the readings the native check must answer."""
    keys = []
    for e in entries:
        if not _once(e, 1, 2):
            return False
        keys.append(next(iter(tfs_pb2.PredictRequest.FromString(_framed(2, e)).inputs)))
        for tensor in _values(e, 2):
            if not _once(tensor, 1, 2):
                return False
            for shape in _values(tensor, 2):
                if not all(_once(dim, 1) for dim in _values(shape, 2)):
                    return False
    return len(keys) == len(set(keys))


def _once(buf: bytes, *numbers: int) -> bool:
    """Whether each of the field ``numbers`` occurs at most once at the top level of ``buf``."""
    seen = [n for n, _ in _fields(buf)]
    return all(seen.count(n) <= 1 for n in numbers)


def _values(buf: bytes, number: int) -> list[bytes]:
    return [v for n, v in _fields(buf) if n == number]


def _fields(buf: bytes) -> list[tuple[int, bytes]]:
    """(number, payload) of each top-level field of the well-formed ``buf`` (varints and length-delimited only)."""
    out: list[tuple[int, bytes]] = []
    i = 0
    while i < len(buf):
        tag, i = _read_varint(buf, i)
        start = i
        n, i = _read_varint(buf, i)
        if tag & 7 == 0:  # a varint: its own bytes
            out.append((tag >> 3, buf[start:i]))
        else:
            out.append((tag >> 3, buf[i : i + n]))
            i += n
    return out


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    read = messages_varint(buf, i, len(buf))
    assert read is not None, "the test frames well-formed messages"
    return read


@pytest.mark.parametrize(
    "shape",
    [
        [1000],
        [1001],
        [262_144],
        [262_145],
        [2, 131_072],
        [2, 131_073],
        [-1],
        [0, 2**62],
        [2**62, 0],
        [3] * 64,
        [1] * 65,
    ],
)
def test_input_bytes_at_the_bounds(shape: list[int]) -> None:
    """At each bound (batch, decoded bytes, sign, rank) the native check answers as the reference or declines."""
    if not native.available() or not hasattr(native._module(), "predict_input_bytes"):
        pytest.skip("embedgate_native is not built with the shape check (make install)")
    message = tfs_pb2.PredictRequest()
    message.inputs["x"].CopyFrom(_tensor(shape))
    raw = message.SerializeToString()
    want = _reference_bytes(message, _LIMITS, _MAX_BODY)
    got = native.predict_input_bytes(raw, _ITEM_BYTES, 8, MAX_RANK, _LIMITS.max_instances, _MAX_BODY)
    assert got == (want if isinstance(want, int) else None)

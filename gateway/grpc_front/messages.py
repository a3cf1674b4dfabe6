"""Client request messages of the gRPC front: parsed from bytes and checked against ``limits`` before any use. Pure.

The gRPC front registers its methods with raw bytes in (no deserializer), so a message is only parsed after the
token check and the buffered-bytes reservation (``gateway.grpc_front.servicer``). :func:`parse_message` then parses
it and applies the same bounds as REST (``LimitsSettings``), before any tensor is decoded:

* a message that does not parse is :class:`~gateway.errors.InvalidArgument` ("Cannot parse the PredictRequest
  message"), never with the parser's exception text or our internal proto names;
* every Predict input tensor: rank at most :data:`MAX_RANK`, no negative dimension (InvalidArgument), the batch (the
  first dimension) at most ``limits.max_instances``, and the bytes it decodes to (elements x element size, 8 per
  string) at most ``max_body_bytes``, the most a REST body may hold after gunzip (PayloadTooLarge, i.e.
  RESOURCE_EXHAUSTED). A TensorProto may give one value for a whole shape (TF's fill rule), so a 30-byte message can
  ask for gigabytes: the count is computed from the shape alone, with no allocation;
* Classify/Regress: at most ``limits.max_instances`` examples and at most ``limits.max_ids_per_feature`` values per
  feature of one example (PayloadTooLarge), as REST's ``examples`` lists.

:func:`parse_message` returns the message and the bytes its tensors decode to, which the servicer reserves in the
buffered-bytes budget beyond the message's own size. The tensors' bounds are read from the message's bytes natively
when every one passes (:func:`input_bytes`); :func:`check_tensor` is the reference and words every refusal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from google.protobuf.message import DecodeError, Message

from gateway.errors import MAX_NAME_BYTES, InvalidArgument, PayloadTooLarge, name_too_long
from schemas.gateway_settings import LimitsSettings
from schemas.proto import tfs_pb2
from schemas.tensors import NP_DTYPES

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_RANK",
    "Parsed",
    "check_examples",
    "check_message",
    "check_spec_sizes",
    "check_spec_sizes_reference",
    "check_tensor",
    "input_bytes",
    "parse_message",
]

MAX_RANK: Final = 64  # dimensions of one tensor (TF's own bound is 254; no model input comes close to 64)
_SPEC_STRINGS: Final = {1: "name", 3: "signature_name", 4: "version_label"}  # ModelSpec's string fields
_SCAN_FIELDS: Final = (
    64  # top-level fields check_spec_sizes looks at before leaving the message to the parser
)
_STRING_BYTES: Final = 8  # one decoded string element costs at least a pointer
_DEFAULT_BYTES: Final = 8  # an element of a dtype without a numpy form (never decoded by the gateway)

M = TypeVar("M", bound=Message)

# Public names of the messages (TF Serving's); never the module path of our generated protos.
_NAMES: Final[dict[type[Message], str]] = {
    tfs_pb2.PredictRequest: "PredictRequest",
    tfs_pb2.ClassificationRequest: "ClassificationRequest",
    tfs_pb2.RegressionRequest: "RegressionRequest",
    tfs_pb2.GetModelMetadataRequest: "GetModelMetadataRequest",
    tfs_pb2.GetModelStatusRequest: "GetModelStatusRequest",
}


@dataclass(frozen=True)
class Parsed(Generic[M]):
    """A checked request message and the bytes its input tensors decode to (0 for messages without tensors)."""

    message: M
    decoded_bytes: int


def parse_message(kind: type[M], raw: bytes, limits: LimitsSettings, max_body_bytes: int) -> Parsed[M]:
    """``raw`` parsed as ``kind`` and checked (see the module docstring). Raises InvalidArgument / PayloadTooLarge."""
    message = _parse(kind, raw)
    decoded = 0
    if isinstance(message, tfs_pb2.PredictRequest):
        decoded = input_bytes(message, raw, limits, max_body_bytes)
    elif isinstance(message, tfs_pb2.ClassificationRequest | tfs_pb2.RegressionRequest):
        # Each value costs at least one byte on the wire: a smaller message cannot break the per-feature count.
        check_examples(message.input, limits, per_feature=len(raw) > limits.max_ids_per_feature)
    return Parsed(message, decoded)


def check_message(kind: type[M], raw: bytes, limits: LimitsSettings, max_body_bytes: int) -> int:
    """:func:`parse_message` for a parse worker process: only the decoded bytes come back (or the error)."""
    return parse_message(kind, raw, limits, max_body_bytes).decoded_bytes


def _parse(kind: type[M], raw: bytes) -> M:
    try:
        message: M = kind.FromString(raw)
    except (DecodeError, RuntimeError, ValueError):  # upb: DecodeError; recursion and size guards: the others
        raise InvalidArgument(f"Cannot parse the {_NAMES.get(kind, 'request')} message") from None
    return message


def input_bytes(
    message: tfs_pb2.PredictRequest, raw: bytes, limits: LimitsSettings, max_body_bytes: int
) -> int:
    """The bytes the inputs of ``message`` (parsed from ``raw``) decode to; raises as :func:`check_tensor` for the
    first input that breaks a bound. Read from ``raw`` natively when every input passes
    (``gateway.native.predict_input_bytes``: about 1 µs an input against 4-8 µs here), else checked here."""
    from gateway import native

    fast = native.predict_input_bytes(
        raw, _ITEM_BYTES, _DEFAULT_BYTES, MAX_RANK, limits.max_instances, max_body_bytes
    )
    if fast is not None:
        return fast
    return sum(
        check_tensor(f"input {name!r}", t, limits, max_body_bytes) for name, t in message.inputs.items()
    )


def check_tensor(where: str, t: tfs_pb2.TensorProto, limits: LimitsSettings, max_body_bytes: int) -> int:
    """The bytes ``t`` decodes to; raises when its shape breaks a bound (``where`` names it in the message)."""
    if t.tensor_shape.unknown_rank:
        return 0  # no shape: nothing is filled, the values are all there is (the codecs refuse it when read)
    dims = t.tensor_shape.dim
    if len(dims) > MAX_RANK:
        raise InvalidArgument(f"{where}: the tensor has {len(dims)} dimensions, more than {MAX_RANK}")
    sizes = [d.size for d in dims]
    for i, size in enumerate(sizes):
        if size < 0:
            raise InvalidArgument(f"{where}: dimension {i} of the tensor shape is {size}; sizes must be >= 0")
    if sizes and sizes[0] > limits.max_instances:
        raise PayloadTooLarge(
            f"{where} has a batch of {sizes[0]}, more than the limit of {limits.max_instances} "
            "(limits.max_instances)"
        )
    item = _element_bytes(t.dtype)
    cap = max_body_bytes // item  # elements allowed; the product stops growing past it (no huge integers)
    count = 1
    for size in sizes:
        count = min(count * size, cap + 1)
    if count > cap:
        shown = _shape_text(sizes)
        raise PayloadTooLarge(
            f"{where} of shape {shown} decodes to more than {max_body_bytes} bytes (max_body_bytes)"
        )
    return count * item


def _element_bytes(dtype: int) -> int:
    np_dtype = NP_DTYPES.get(dtype)
    if np_dtype is None:
        return _DEFAULT_BYTES
    return _STRING_BYTES if np_dtype.kind == "O" else max(1, int(np_dtype.itemsize))


# element bytes by DataType number, as _element_bytes gives them (the native check's table)
_ITEM_BYTES: Final = tuple(_element_bytes(d) for d in range(max(NP_DTYPES) + 1))


def _shape_text(sizes: list[int]) -> str:
    if len(sizes) <= 8:
        return str(sizes)
    return f"[{', '.join(map(str, sizes[:8]))}, ...] ({len(sizes)} dimensions)"


def check_examples(inp: tfs_pb2.Input, limits: LimitsSettings, *, per_feature: bool = True) -> None:
    """PayloadTooLarge when ``inp`` holds more than ``max_instances`` examples or, with ``per_feature``, a feature of
    one example (or of the context) holds more than ``max_ids_per_feature`` values."""
    kind = inp.WhichOneof("kind")
    if kind == "example_list":
        examples = inp.example_list.examples
        context = None
    elif kind == "example_list_with_context":
        examples = inp.example_list_with_context.examples
        context = inp.example_list_with_context.context
    else:
        return
    if len(examples) > limits.max_instances:
        raise PayloadTooLarge(
            f"the input has {len(examples)} examples, more than the limit of {limits.max_instances} "
            "(limits.max_instances)"
        )
    if not per_feature:
        return
    if context is not None:
        _check_features(context, "the context", limits.max_ids_per_feature)
    for i, example in enumerate(examples):
        _check_features(example, f"example {i}", limits.max_ids_per_feature)


def _check_features(example: tfs_pb2.Example, where: str, cap: int) -> None:
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind is None:
            continue
        n = len(getattr(feature, kind).value)
        if n > cap:
            raise PayloadTooLarge(
                f"feature {name!r} of {where} has {n} values, more than the limit of {cap} "
                "(limits.max_ids_per_feature)"
            )


def check_spec_sizes(raw: bytes) -> None:
    """Refuse a request whose ``model_spec`` strings are longer than :data:`MAX_NAME_BYTES` (InvalidArgument naming
    the field and its size), from the wire format alone: every request message of TF Serving's API has its
    ``model_spec`` as field 1. Without it, a 60 MB model name was copied, pickled, parsed and decoded before the
    gateway could answer NOT_FOUND, each step holding the interpreter for tens of milliseconds (``/healthz`` waited
    0.3-0.6 s). Reads at most :data:`_SCAN_FIELDS` top-level fields and the spec's own; whatever it cannot read is
    left to the parser, which words the error. Read natively when the native path is on
    (``gateway.native.spec_too_long``, native/src/spec_sizes.rs: 6 µs for a message of 39 inputs, against 58 µs), else by
    :func:`check_spec_sizes_reference`; the same answer for every message (``tests/gateway/test_grpc_messages.py``)."""
    from gateway import native

    found = native.spec_too_long(raw, MAX_NAME_BYTES, _SCAN_FIELDS)
    if found is None:
        check_spec_sizes_reference(raw)
    elif found:
        number, size = found
        raise name_too_long(f"model_spec.{_SPEC_STRINGS[number]}", size)


def check_spec_sizes_reference(raw: bytes) -> None:
    """:func:`check_spec_sizes` in Python (the reference of the native reading)."""
    spec = None
    for number, start, end in _length_fields(raw, 0, len(raw), _SCAN_FIELDS):
        if number == 1:
            spec = (start, end)  # the last occurrence wins, as when parsing (merged; its strings replaced)
    if spec is None:
        return
    for number, start, end in _length_fields(raw, spec[0], spec[1], _SCAN_FIELDS):
        field = _SPEC_STRINGS.get(number)
        if field is not None and end - start > MAX_NAME_BYTES:
            raise name_too_long(f"model_spec.{field}", end - start)


def _length_fields(buf: bytes, pos: int, end: int, limit: int) -> list[tuple[int, int, int]]:
    """(field number, value start, value end) of the length-delimited fields among the first ``limit`` fields of
    ``buf[pos:end]``; stops early (with what it read) at anything malformed."""
    out: list[tuple[int, int, int]] = []
    for _ in range(limit):
        if pos >= end:
            break
        read = _varint(buf, pos, end)
        if read is None:
            break
        key, pos = read
        wire = key & 7
        if wire == 0:
            skipped = _varint(buf, pos, end)
            if skipped is None:
                break
            pos = skipped[1]
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size = _varint(buf, pos, end)
            if size is None or size[1] + size[0] > end:
                break
            out.append((key >> 3, size[1], size[1] + size[0]))
            pos = size[1] + size[0]
        else:  # groups (deprecated) and invalid wire types: the parser decides
            break
    return out


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int] | None:
    """The varint at ``pos`` and the position after it, or None when it does not end within 10 bytes / ``end``."""
    value = 0
    for shift in range(0, 70, 7):
        if pos >= end:
            return None
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
    return None

"""tf.Example codec: TF Serving's classify/regress JSON, base64 values and serialized tf.Example bytes. Pure, no I/O.

* :func:`input_from_json` turns a ``:classify`` / ``:regress`` body (``"examples"`` plus optional ``"context"``) into
  an :class:`~schemas.proto.tfs_pb2.Input` with TF Serving's rules and error texts (``json_tensor.cc``
  ``FillClassifyRegressRequestFromJson`` / ``AddValueToFeature``; ../shared/notes/tfserving-api.md §2.9).
* ``{"b64": ...}`` values are decoded with :func:`gateway.codec.rapidjson.b64_decode` (absl's rules, §2.6).
* :func:`parse_example` parses serialized tf.Example bytes with our own protos (never TensorFlow).

Every failure raises :class:`gateway.errors.InvalidArgument`.
"""

from __future__ import annotations

import math
from typing import Any, Final

from google.protobuf.message import DecodeError

from gateway.codec.rapidjson import b64_decode, debug_string, json_type, render_number
from gateway.errors import InvalidArgument, clip
from schemas.proto import tfs_pb2

__all__ = ["input_from_json", "parse_example"]

METHODS: Final = ("classify", "regress")

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_U64_MAX: Final = 2**64 - 1
_FLT_MAX: Final = 3.4028234663852886e38

# -- tf.Example bytes -------------------------------------------------------------------------------------------------


def parse_example(data: bytes, index: int) -> tfs_pb2.Example:
    """Parse serialized tf.Example ``data``; ``index`` is the example's position in the request, used in errors."""
    try:
        example: tfs_pb2.Example = tfs_pb2.Example.FromString(data)
        return example
    except DecodeError as exc:
        raise InvalidArgument(f"example {index}: the bytes do not parse as a serialized tf.Example") from exc


# -- classify / regress JSON ------------------------------------------------------------------------------------------


def input_from_json(body: dict[str, Any], method: str) -> tfs_pb2.Input:
    """TF Serving's classify/regress request JSON (already parsed) -> :class:`tfs_pb2.Input`.

    ``body["context"]`` (optional object) becomes ``example_list_with_context.context``; ``body["examples"]``
    (required non-empty array of objects) the examples. Per feature (a value or a flat list): string or ``{"b64":
    ...}`` -> bytes_list; JSON float (written with ``.``/exponent, or NaN/Infinity) -> float_list; integer or
    true/false -> int64_list (1/0); ``[]`` -> a feature with no kind. The first element fixes the kind. Error texts are
    TF Serving's, including its quirk that a missing ``examples`` key says "When method is classify" for both
    methods. ``signature_name`` is not looked at here (the caller checks it first, as TF Serving does).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not isinstance(body, dict):
        raise InvalidArgument(f"JSON Value: {debug_string(body)} Is not object")
    inp = tfs_pb2.Input()
    has_context = "context" in body
    if has_context:
        _fill_example(body["context"], inp.example_list_with_context.context)
    examples = body.get("examples", _MISSING)
    if examples is _MISSING:
        # json_tensor.cc hard-codes "classify" for both methods.
        raise InvalidArgument(
            f"JSON Value: {debug_string(body)} When method is classify, key 'examples' is expected and was not found"
        )
    if not isinstance(examples, list):
        raise InvalidArgument(
            f"JSON Value: {debug_string(body)} Expecting 'examples' value to be an list/array"
        )
    if not examples:
        raise InvalidArgument(f"JSON Value: {debug_string(body)} 'examples' value is an empty array")
    target = inp.example_list_with_context.examples if has_context else inp.example_list.examples
    for value in examples:
        _fill_example(value, target.add())
    return inp


_MISSING: Final = object()

_KIND_TEXT: Final = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


def _fill_example(value: Any, example: tfs_pb2.Example) -> None:
    if not isinstance(value, dict):
        raise InvalidArgument(f"Example must be JSON object but got JSON {json_type(value)}")
    features = example.features.feature
    for name, content in value.items():
        kind, values = _feature_values(clip(str(name)), content)  # the name is only quoted in errors
        feature = features[str(name)]
        if kind is None:
            feature.SetInParent()  # present, no kind (from [])
        else:
            getattr(feature, kind).value.extend(values)


def _feature_values(name: str, content: Any) -> tuple[str | None, list[Any]]:
    """(kind field name or None, values) for one JSON feature, with AddValueToFeature's checks and texts."""
    items = content if isinstance(content, list) else [content]
    kind: str | None = None
    values: list[Any] = []
    for val in items:
        this_kind, converted = _element(name, val, kind)
        if kind is not None and this_kind != kind:
            raise InvalidArgument(
                f"Unexpected element type in feature: {name} expecting type: {_KIND_TEXT[kind]}"
            )
        kind = this_kind
        values.append(converted)
    return kind, values


def _element(name: str, val: Any, kind: str | None) -> tuple[str, Any]:
    """One JSON element -> (kind, value); ``kind`` is the feature's kind so far (checked before value errors)."""
    if val is None or isinstance(val, list):
        raise InvalidArgument(f"Feature: {name} has element with unexpected JSON type: {json_type(val)}")
    if isinstance(val, bool):
        return "int64_list", int(val)
    if isinstance(val, dict):
        if not _is_b64_object(val):
            raise InvalidArgument(f"Feature: {name} has element with unexpected JSON type: Object")
        _check_kind(name, kind, "bytes_list")
        return "bytes_list", b64_decode(val["b64"])
    if isinstance(val, str):
        return "bytes_list", val.encode("utf-8", "surrogatepass")
    if isinstance(val, int):
        if _I64_MIN <= val <= _I64_MAX:
            return "int64_list", val
        if _I64_MAX < val <= _U64_MAX:  # rapidjson: a uint64 number, not a double
            _check_kind(name, kind, "int64_list")
            raise InvalidArgument(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
        # rapidjson parses integers beyond (u)int64 as doubles.
        _check_kind(name, kind, "float_list")
        as_float = float(val) if abs(val) < 2**1024 else math.inf
        if abs(as_float) > _FLT_MAX:
            raise InvalidArgument(f"Cannot convert JSON value: {val} to float without loss of precision.")
        return "float_list", as_float
    if isinstance(val, float):
        _check_kind(name, kind, "float_list")
        if math.isfinite(val) and abs(val) > _FLT_MAX:
            raise InvalidArgument(
                f"Cannot convert JSON value: {render_number(val)} to float without loss of precision."
            )
        return "float_list", val
    raise InvalidArgument(f"Feature: {name} has element with unexpected JSON type: {json_type(val)}")


def _check_kind(name: str, kind: str | None, wanted: str) -> None:
    if kind is not None and kind != wanted:
        raise InvalidArgument(
            f"Unexpected element type in feature: {name} expecting type: {_KIND_TEXT[kind]}"
        )


def _is_b64_object(val: dict[str, Any]) -> bool:
    """json_tensor.cc IsValBase64Object: exactly one member, "b64", whose value is a string."""
    return len(val) == 1 and isinstance(val.get("b64"), str)


# -- rendering JSON values inside error texts (json_tensor.cc JsonTypeString / JsonValueToDebugString) ----------------

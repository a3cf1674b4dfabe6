"""TF Serving's JSON tensor encoding (``tensorflow_serving/util/json_tensor.cc``), pure: no I/O, no grpc.

Request side::

    doc = loads(body)                                   # NaN/Inf tokens, int vs float literals kept apart
    sig = signature_name(doc)                           # "" when absent
    tensors, fmt = tensors_from_request(doc, dtypes)    # {input: ndarray} + ROW ("instances") / COLUMNAR ("inputs")

``dtypes`` maps each signature input to its ``DataType`` (from GetModelMetadata); shapes come from the JSON only
(first element at each level), exactly as TF Serving infers them. Errors are ``InvalidArgument`` (or
``Unimplemented`` for dtypes JSON cannot express) with TF Serving's texts.

Response side::

    predict_response(outputs, fmt) -> bytes             # {"predictions": ...} or {"outputs": ...}
    regress_response(values) / classify_response(classes) / error_body(message)

Bodies are byte for byte what TF Serving's rapidjson PrettyWriter writes (layout notes above the response section);
numbers as ``WriteDecimal`` prints them (``gateway.codec.numbers``); DT_STRING outputs named ``*_bytes`` as
``{"b64": ...}``. Numeric outputs are encoded with numpy, without Python code per value.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import numpy as np
import orjson

from gateway.codec.numbers import SMALL, bool_tokens, float_tokens, format_float, int_tokens
from gateway.codec.rapidjson import PrettyWriter, b64_decode, debug_string, json_type, write_string
from gateway.codec.tensor import dtype_for
from gateway.errors import GatewayError, InvalidArgument, Unimplemented, clip, status_string
from schemas.proto import tfs_pb2

__all__ = [
    "Format",
    "as_bytes",
    "check_request_keys",
    "checked_names",
    "classify_response",
    "dtype_name",
    "error_body",
    "format_float",
    "loads",
    "may_contain_bools",
    "predict_response",
    "regress_response",
    "signature_name",
    "tensors_from_request",
]

DT = tfs_pb2.DataType


class Format(Enum):
    ROW = "instances"
    COLUMNAR = "inputs"


# ---- parsing --------------------------------------------------------------------------------------------------

# A JSON string (kept as is) or a NaN/Inf token outside strings (rewritten to Python json's spelling).
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|(-?)(Infinity|Inf|NaN)\b', re.DOTALL)
_PY_JSON_ERRORS = (
    ("Expecting value", "Invalid value."),
    ("Expecting property name", "Missing a name for object member."),
    ("Expecting ':'", "Missing a colon after a name of object member."),
    ("Expecting ',' delimiter", "Missing a comma or ']' after an array element."),
    ("Unterminated string", "Missing a closing quotation mark in string."),
    ("Invalid control character", "Invalid encoding in string."),
    ("Invalid \\escape", "Invalid escape character in string."),
)


_TOO_BIG = "Number too big to be stored in double."


def _fix_token(m: re.Match[str]) -> str:
    word = m.group(2)
    if word is None:
        return m.group(0)
    if word == "NaN":
        return "NaN"  # -NaN is NaN
    return ("-" if m.group(1) else "") + "Infinity"


def loads(data: bytes | str) -> Any:
    """Parse a request body as rapidjson does for TF Serving; the root must be an object.

    Integer literals stay ``int`` (any size), literals with ``.``/exponent become ``float``; ``NaN``, ``Inf``,
    ``Infinity`` (optionally with ``-``) are accepted. Like TF Serving's ``ParseStream`` (no
    ``kParseStopWhenDoneFlag``), anything but whitespace after the root value is an error ("The document root must not
    be followed by other values."); a NUL byte ends the document, as it ends rapidjson's stream.
    """
    if not data:
        raise InvalidArgument("JSON Parse error: The document is empty")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "number is infinity" in str(exc):
            raise InvalidArgument(f"JSON Parse error: {_TOO_BIG} at offset: {exc.pos}") from None
        doc = _slow_loads(data)
    if not isinstance(doc, dict):
        raise InvalidArgument(f"JSON Value: {debug_string(doc)} Is not object")
    return doc


def _slow_loads(data: bytes | str) -> Any:
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    start = len(text) - len(text.lstrip(" \t\r\n"))
    if start == len(text):
        raise InvalidArgument(f"JSON Parse error: The document is empty. at offset: {start}")
    fixed = _TOKENS.sub(_fix_token, text) if ("In" in text or "NaN" in text) else text

    def parse_float(literal: str) -> float:
        v = float(literal)
        if math.isinf(v):
            raise InvalidArgument(f"JSON Parse error: {_TOO_BIG} at offset: {max(fixed.find(literal), 0)}")
        return v

    try:
        doc, end = json.JSONDecoder(parse_float=parse_float).raw_decode(fixed, start)
    except json.JSONDecodeError as exc:
        msg = next((r for p, r in _PY_JSON_ERRORS if exc.msg.startswith(p)), "Invalid value.")
        raise InvalidArgument(f"JSON Parse error: {msg} at offset: {exc.pos}") from None
    except RecursionError:
        raise InvalidArgument("JSON Parse error: document nested too deeply") from None
    rest = fixed[end:].lstrip(" \t\r\n")
    if rest and not rest.startswith("\0"):
        # byte offset of the first value after the root (in the rewritten text when Inf/NaN tokens were rewritten)
        offset = len(fixed[: len(fixed) - len(rest)].encode("utf-8", errors="replace"))
        raise InvalidArgument(
            f"JSON Parse error: The document root must not be followed by other values. at offset: {offset}"
        )
    return doc


def signature_name(doc: Mapping[str, Any]) -> str:
    """The optional ``signature_name`` ("" when absent); it must be a string."""
    sig = doc.get("signature_name", "")
    if not isinstance(sig, str):
        raise InvalidArgument(
            f"JSON Value: {debug_string(doc)} not formatted correctly. 'signature_name' key must be a string value."
        )
    return sig


# ---- debug strings (values quoted in error messages) -------------------------------------------------------------


def dtype_name(dtype: int) -> str:
    """``DataTypeString``: ``float``, ``int64``, ``string`` ..."""
    try:
        name: str = DT.Name(dtype)
        return name.removeprefix("DT_").lower()
    except ValueError:
        return f"unknown dtype {dtype}"


# ---- base64 ------------------------------------------------------------------------------------------------------


def _is_b64(v: Any) -> bool:
    return isinstance(v, dict) and len(v) == 1 and isinstance(v.get("b64"), str)


# ---- leaves ------------------------------------------------------------------------------------------------------

_INT_RANGES: dict[int, tuple[int, int]] = {
    DT.DT_INT32: (-(2**31), 2**31 - 1),
    DT.DT_INT16: (-(2**31), 2**31 - 1),  # TF checks IsInt() only: no 8/16-bit range check
    DT.DT_INT8: (-(2**31), 2**31 - 1),
    DT.DT_UINT8: (-(2**31), 2**31 - 1),
    DT.DT_INT64: (-(2**63), 2**63 - 1),
    DT.DT_UINT32: (0, 2**32 - 1),
    DT.DT_UINT64: (0, 2**64 - 1),
}
_NP_FOR_JSON: dict[int, Any] = {
    DT.DT_FLOAT: np.float32,
    DT.DT_DOUBLE: np.float64,
    DT.DT_INT32: np.int32,
    DT.DT_INT16: np.int32,  # int_val holds int32; narrowing happens when the tensor is encoded (as in TF)
    DT.DT_INT8: np.int32,
    DT.DT_UINT8: np.int32,
    DT.DT_INT64: np.int64,
    DT.DT_UINT32: np.uint32,
    DT.DT_UINT64: np.uint64,
    DT.DT_BOOL: np.bool_,
    DT.DT_STRING: object,
}


def _type_error(v: Any, dtype: int) -> InvalidArgument:
    return InvalidArgument(
        f"JSON Value: {debug_string(v)} Type: {json_type(v)} is not of expected type: {dtype_name(dtype)}"
    )


def _leaf(v: Any, dtype: int) -> Any:
    t = type(v)
    if dtype == DT.DT_FLOAT or dtype == DT.DT_DOUBLE:
        if t is float:
            return v
        if t is int:
            try:
                return float(v)
            except OverflowError:
                return math.inf if v > 0 else -math.inf
        raise _type_error(v, dtype)
    if dtype in _INT_RANGES:
        if t is int:
            lo, hi = _INT_RANGES[dtype]
            if lo <= v <= hi:
                return v
        raise _type_error(v, dtype)
    if dtype == DT.DT_BOOL:
        if t is bool:
            return v
        raise _type_error(v, dtype)
    if dtype == DT.DT_STRING:
        if t is str:
            return v.encode("utf-8", errors="surrogateescape")
        if t is dict:
            if not _is_b64(v):
                raise InvalidArgument(
                    f"JSON Value: {debug_string(v)} not formatted correctly for base64 data"
                )
            return b64_decode(v["b64"])
        raise _type_error(v, dtype)
    if t is dict:
        raise _type_error(v, dtype)
    raise Unimplemented(f"Conversion of JSON Value: {debug_string(v)} to type: {dtype_name(dtype)}")


def _shape_of(value: Any) -> list[int]:
    shape: list[int] = []
    v = value
    while isinstance(v, list):
        shape.append(len(v))
        if not v:
            break
        v = v[0]
    return shape


def _fill(val: Any, level: int, shape: list[int], dtype: int, out: list[Any]) -> None:
    rank = len(shape)
    if not isinstance(val, list):
        if level != rank:
            raise InvalidArgument(
                f"JSON Value: {debug_string(val)} found at incorrect level: {level + 1} in the JSON DOM. "
                f"Expected at level: {rank}"
            )
        out.append(_leaf(val, dtype))
        return
    if level >= rank:
        raise InvalidArgument(f"Encountered list at unexpected level: {level} expected < {rank}")
    if len(val) != shape[level]:
        raise InvalidArgument(
            f"Encountered list at unexpected size: {len(val)} at level: {level} expected size: {shape[level]}"
        )
    if level == rank - 1:
        append = out.append
        for x in val:
            if isinstance(x, list):
                raise InvalidArgument(f"Encountered list at unexpected level: {level + 1} expected < {rank}")
            append(_leaf(x, dtype))
    else:
        for x in val:
            _fill(x, level + 1, shape, dtype, out)


def _values(value: Any, dtype: int) -> tuple[list[int], list[Any]]:
    """Shape (from the first element at each level) and flat leaves of one JSON tensor value."""
    shape = _shape_of(value)
    flat: list[Any] = []
    try:
        _fill(value, 0, shape, dtype, flat)
    except RecursionError:
        raise InvalidArgument("JSON value nested too deeply") from None
    return shape, flat


def _array(flat: list[Any], shape: list[int], dtype: int) -> np.ndarray:
    np_dtype = _NP_FOR_JSON[dtype]
    if np_dtype is object:
        arr = np.empty(len(flat), dtype=object)
        arr[:] = flat
    else:
        with np.errstate(over="ignore"):
            arr = np.array(flat, dtype=np_dtype)
    return arr.reshape(shape)


_FLOAT_DTYPES = (DT.DT_FLOAT, DT.DT_DOUBLE)


def may_contain_bools(body: bytes) -> bool:
    """Whether the raw body could hold a JSON ``true``/``false`` (numpy would silently turn those into numbers,
    so the vectorised fast path below is only used when this is False)."""
    return b"true" in body or b"false" in body


def _fast_array(value: Any, dtype: int) -> np.ndarray | None:
    """The tensor for ``value`` built by numpy in C when that is certainly what the exact rules give, else None.

    Only numeric dtypes; only rectangular lists of numbers (ragged lists, strings, objects, out-of-range integers
    fall back to the exact per-value path, which produces TF Serving's error texts). The caller guarantees the body
    holds no booleans.
    """
    if dtype not in _FLOAT_DTYPES and dtype not in _INT_RANGES:
        return None
    try:
        arr = np.array(value)
    except (ValueError, OverflowError, TypeError):
        return None
    if list(arr.shape) != _shape_of(value):
        return None
    kind = arr.dtype.kind
    if dtype in _FLOAT_DTYPES:
        if kind not in "if":
            return None
        with np.errstate(over="ignore"):
            return arr.astype(_NP_FOR_JSON[dtype])
    if kind not in "iu":
        return None
    if arr.size:
        lo, hi = _INT_RANGES[dtype]
        if int(arr.min()) < lo or int(arr.max()) > hi:
            return None
    return arr.astype(_NP_FOR_JSON[dtype])


def _shape_str(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


# ---- request -----------------------------------------------------------------------------------------------------


def tensors_from_request(
    doc: Mapping[str, Any], dtypes: Mapping[str, int], *, fast: bool = False
) -> tuple[dict[str, np.ndarray], Format]:
    """Signature inputs as numpy arrays from a parsed predict body, by TF Serving's row/columnar rules.

    ``dtypes`` maps signature input names to ``DataType`` values; an empty map is an error (as in TF Serving the
    caller words it with the signature name, so pass at least one input). ``fast=True`` (only when
    ``not may_contain_bools(body)``) lets numpy build well-formed numeric tensors in C; results are identical.
    """
    if check_request_keys(doc) is Format.ROW:
        return _from_instances(doc["instances"], dtypes, fast), Format.ROW
    return _from_inputs(doc["inputs"], dtypes, fast), Format.COLUMNAR


def check_request_keys(doc: Mapping[str, Any]) -> Format:
    """The request's format by the instances/inputs presence rules (embedding models parse the values themselves)."""
    has_instances = "instances" in doc
    has_inputs = "inputs" in doc
    if has_instances and has_inputs:
        raise InvalidArgument(
            f"JSON Value: {debug_string(dict(doc))} Not formatted correctly expecting only one of 'inputs' or "
            "'instances' keys to exist "
        )
    if has_instances:
        instances = doc["instances"]
        if not isinstance(instances, list):
            raise InvalidArgument(
                f"JSON Value: {debug_string(dict(doc))} Expecting 'instances' to be an list/array"
            )
        if not instances:
            raise InvalidArgument(f"JSON Value: {debug_string(dict(doc))} No values in 'instances' array")
        return Format.ROW
    if has_inputs:
        return Format.COLUMNAR
    raise InvalidArgument("Missing 'inputs' or 'instances' key")


def _is_element_object(v: Any) -> bool:
    return isinstance(v, dict) and not _is_b64(v)


class _Stack:
    """Per-input accumulation of row-format items (first item fixes size and shape)."""

    def __init__(self, dtype: int) -> None:
        self.dtype = dtype
        self.shape: list[int] | None = None
        self.size = 0
        self.flat: list[Any] = []

    def add(self, value: Any) -> None:
        shape, flat = _values(value, self.dtype)
        if self.shape is None:
            self.shape, self.size = shape, len(flat)
        elif self.size != len(flat):
            raise InvalidArgument(f"Expecting tensor size: {self.size} but got: {len(flat)}")
        elif self.shape != shape:
            raise InvalidArgument(f"Expecting shape {_shape_str(self.shape)} but got: {_shape_str(shape)}")
        self.flat.extend(flat)


def _fast_instances(instances: list[Any], dtypes: Mapping[str, int]) -> dict[str, np.ndarray] | None:
    names = sorted(dtypes)
    first = instances[0]
    if _is_element_object(first):
        keys = set(names)
        if not all(type(e) is dict and e.keys() == keys for e in instances):
            return None
        out: dict[str, np.ndarray] = {}
        for n in names:
            arr = _fast_array([e[n] for e in instances], dtypes[n])
            if arr is None:
                return None
            out[n] = arr
        return out
    if len(names) != 1 or isinstance(first, dict):
        return None
    arr = _fast_array(instances, dtypes[names[0]])
    return None if arr is None else {names[0]: arr}


def _from_instances(
    instances: list[Any], dtypes: Mapping[str, int], fast: bool = False
) -> dict[str, np.ndarray]:
    if fast and (done := _fast_instances(instances, dtypes)) is not None:
        return done
    names = sorted(dtypes)
    if not isinstance(instances[0], dict) and len(names) > 1:
        raise InvalidArgument(
            "instances is a plain list, but expecting list of objects as multiple input tensors required as per "
            "tensorinfo_map"
        )
    objects = _is_element_object(instances[0])
    stacks: dict[str, _Stack] = {}
    for i, elem in enumerate(instances):
        if objects:
            if not _is_element_object(elem):
                raise InvalidArgument(f"Expecting object but got list at item {i} of input list")
            for name, value in elem.items():
                try:
                    if name not in dtypes:
                        raise InvalidArgument(f"JSON object: does not have named input: {clip(name)}")
                    stacks.setdefault(name, _Stack(dtypes[name])).add(value)
                except GatewayError as exc:
                    raise InvalidArgument(
                        f"Failed to process element: {i} key: {clip(name)} of 'instances' list. "
                        f"Error: {status_string(exc)}"
                    ) from None
            if set(elem) != set(names):
                raise InvalidArgument(
                    f"Failed to process element: {i} of 'instances' list. JSON object: {debug_string(elem)} "
                    f"keys must be equal to: {','.join(names)}"
                )
        else:
            if _is_element_object(elem):
                raise InvalidArgument(f"Expecting value/list but got object at item {i} of input list")
            name = names[0]
            try:
                stacks.setdefault(name, _Stack(dtypes[name])).add(elem)
            except GatewayError as exc:
                raise InvalidArgument(
                    f"Failed to process element: {i} of 'instances' list. Error: {status_string(exc)}"
                ) from None
    out: dict[str, np.ndarray] = {}
    for name, st in stacks.items():
        out[name] = _array(st.flat, [len(instances), *(st.shape or [])], st.dtype)
    return out


def _tensor(value: Any, dtype: int, fast: bool) -> np.ndarray:
    if fast and (arr := _fast_array(value, dtype)) is not None:
        return arr
    shape, flat = _values(value, dtype)
    return _array(flat, shape, dtype)


def _from_inputs(val: Any, dtypes: Mapping[str, int], fast: bool = False) -> dict[str, np.ndarray]:
    names = sorted(dtypes)
    if not isinstance(val, dict) or _is_b64(val):
        if len(names) > 1:
            raise InvalidArgument(
                "inputs is a plain value/list, but expecting an object as multiple input tensors required as per "
                "tensorinfo_map"
            )
        return {names[0]: _tensor(val, dtypes[names[0]], fast)}
    out: dict[str, np.ndarray] = {}
    for name in names:
        if name not in val:
            raise InvalidArgument(f"Missing named input: {name} in 'inputs' object.")
        out[name] = _tensor(val[name], dtypes[name], fast)
    return out


# ---- response ----------------------------------------------------------------------------------------------------
#
# TF Serving writes every success body with rapidjson's PrettyWriter (json_tensor.cc MakeJsonFromTensors, ...):
#
# * row format: ``{"predictions": [...]}``; each prediction is written with single-line arrays, so one output gives
#   ``[item, item, ...`` on the key's line and the closing ``]`` on its own line; several outputs give one
#   multi-line object per prediction, each member's value a single-line array;
# * columnar format: ``{"outputs": ...}`` with the default layout: every array element on its own line, indented
#   4 spaces per nesting level;
# * classify/regress: ``{"results": ...}``; regress values on one line, classify one single-line list per example.
#
# ``_reference_predict`` drives the PrettyWriter model value by value (the reference); ``predict_response`` builds
# the same bytes for numeric tensors with numpy: one token matrix per tensor, per-element prefix/suffix strings chosen
# from small tables by the element's position (how many arrays open before it / close after it), NUL padding
# dropped in one pass. Strings, empty dimensions and zero batches go through the reference.

_WRITABLE_KINDS = "fiubOSU"
_UNWRITABLE = (np.float16, np.uint16)


def _tf_type_name(arr: np.ndarray) -> str:
    try:
        return dtype_name(dtype_for(arr))
    except GatewayError:
        return str(arr.dtype)


def _check_writable(name: str, arr: np.ndarray) -> None:
    if arr.dtype.kind not in _WRITABLE_KINDS or arr.dtype.type in _UNWRITABLE:
        raise InvalidArgument(f"Failed to write JSON value for tensor type: {_tf_type_name(arr)}")


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


def as_bytes(x: Any) -> bytes:
    """A string tensor element as the bytes the writer writes (``str`` as UTF-8, lone surrogates kept)."""
    return x if isinstance(x, bytes) else _utf8(str(x))


def checked_names(outputs: Mapping[str, np.ndarray], fmt: Format) -> tuple[list[str], int]:
    """Sorted output names (and the batch size for ROW, else -1), with TF Serving's shape checks, then dtype checks:
    ``InvalidArgument`` with TF Serving's texts for what :func:`predict_response` cannot write. Also run by the
    native writer (``gateway.native.predict_response``) before it writes, so both word errors the same."""
    if not outputs:
        raise InvalidArgument("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    batch = -1
    if fmt is Format.ROW:
        for n in names:
            a = outputs[n]
            if a.ndim == 0:
                raise InvalidArgument(f"Tensor name: {n} has no shape information ")
            if batch >= 0 and a.shape[0] != batch:
                raise InvalidArgument(
                    f"Tensor name: {n} has inconsistent batch size: {a.shape[0]} expecting: {batch}"
                )
            batch = a.shape[0]
    for n in names:
        _check_writable(n, outputs[n])
    return names, batch


# -- reference (value by value through the PrettyWriter model) --


def _emitter(w: PrettyWriter, arr: np.ndarray, name: str) -> Any:
    flat = arr.reshape(-1)
    kind = arr.dtype.kind
    if kind == "f":
        double = arr.dtype == np.float64
        values = flat.tolist()
        return lambda i: w.raw(format_float(values[i], double=double).encode())
    if kind in "iu":
        ints = flat.tolist()
        return lambda i: w.raw(str(ints[i]).encode())
    if kind == "b":
        bools = flat.tolist()
        return lambda i: w.raw(b"true" if bools[i] else b"false")
    raws = [as_bytes(x) for x in flat.tolist()]
    if not name.endswith("_bytes"):
        return lambda i: w.string(raws[i])

    def b64(i: int) -> None:
        w.start_object()
        w.key(b"b64")
        w.string(base64.b64encode(raws[i]))
        w.end_object()

    return b64


def _write_tensor(w: PrettyWriter, shape: Sequence[int], dim: int, emit: Any, offset: int) -> int:
    if dim >= len(shape):
        emit(offset)
        return offset + 1
    w.start_array()
    for _ in range(shape[dim]):
        offset = _write_tensor(w, shape, dim + 1, emit, offset)
    w.end_array()
    return offset


def _reference_predict(outputs: Mapping[str, np.ndarray], fmt: Format) -> bytes:
    names, batch = checked_names(outputs, fmt)
    w = PrettyWriter()
    emit = {n: _emitter(w, outputs[n], n) for n in names}
    multi = len(names) > 1
    w.start_object()
    if fmt is Format.ROW:
        w.key(b"predictions")
        w.start_array()
        offsets = dict.fromkeys(names, 0)
        for _ in range(batch):
            if multi:
                w.start_object()
            w.single_line_arrays = True
            for n in names:
                if multi:
                    w.key(_utf8(n))
                offsets[n] = _write_tensor(w, outputs[n].shape, 1, emit[n], offsets[n])
            w.single_line_arrays = False
            if multi:
                w.end_object()
        w.end_array()
    else:
        w.key(b"outputs")
        if multi:
            w.start_object()
        for n in names:
            if multi:
                w.key(_utf8(n))
            _write_tensor(w, outputs[n].shape, 0, emit[n], 0)
        if multi:
            w.end_object()
    w.end_object()
    return w.getvalue()


# -- vectorised --


def _tokens(arr: np.ndarray) -> np.ndarray | None:
    kind = arr.dtype.kind
    if kind == "f":
        return float_tokens(arr)
    if kind in "iu":
        return int_tokens(arr)
    if kind == "b":
        return bool_tokens(arr)
    return None


@functools.lru_cache(maxsize=128)
def _opens_closes(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per element of a row-major tensor (no empty dim): arrays opening before it, arrays closing after it."""
    n = math.prod(shape)
    idx = np.arange(n, dtype=np.int64)
    opens = np.zeros(n, np.int64)
    closes = np.zeros(n, np.int64)
    first = np.ones(n, bool)
    last = np.ones(n, bool)
    stride = 1
    for size in reversed(shape):
        pos = (idx // stride) % size
        first &= pos == 0
        last &= pos == size - 1
        opens += first
        closes += last
        stride *= size
    opens.flags.writeable = False
    closes.flags.writeable = False
    return opens, closes


@functools.lru_cache(maxsize=256)
def _table(strings: tuple[bytes, ...]) -> np.ndarray:
    width = max(1, *(len(s) for s in strings))
    out = np.zeros((len(strings), width), np.uint8)
    for i, s in enumerate(strings):
        out[i, : len(s)] = np.frombuffer(s, np.uint8)
    return out


def _assemble(
    tokens: np.ndarray,
    pre: np.ndarray,
    pre_table: Sequence[bytes],
    suf: np.ndarray,
    suf_table: Sequence[bytes],
) -> np.ndarray:
    return np.concatenate([_table(tuple(pre_table))[pre], tokens, _table(tuple(suf_table))[suf]], axis=1)


def _compact(rows: np.ndarray) -> bytes:
    flat = rows.reshape(-1)
    packed: bytes = flat[flat != 0].tobytes()
    return packed


def _by_innermost_row(
    tokens: np.ndarray, shape: tuple[int, ...], first_sep: bytes, sep: bytes
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The innermost arrays of a tensor as rows: each value preceded by ``sep`` (``first_sep`` for the first of its
    row), plus per row the arrays opening before it and closing after it, innermost included (both >= 1)."""
    length = shape[-1]
    count = tokens.shape[0] // length
    seps = _table((first_sep, sep))[np.minimum(np.arange(length), 1)]
    inner = np.concatenate(
        [np.broadcast_to(seps, (count, length, seps.shape[1])), tokens.reshape(count, length, -1)], axis=2
    ).reshape(count, -1)
    if len(shape) == 1:
        return inner, np.ones(1, np.int64), np.ones(1, np.int64)
    opens, closes = _opens_closes(shape[:-1])
    return inner, opens + 1, closes + 1


def _single_line(tokens: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Rows of a tensor written with single-line arrays: ``[[a, b], [c, d]]``."""
    rank = len(shape)
    inner, opens, closes = _by_innermost_row(tokens, shape, b"", b", ")
    pre = opens.copy()
    pre[1:] += rank + 1
    pre_table = [b"[" * o for o in range(rank + 1)] + [b", " + b"[" * o for o in range(rank + 1)]
    return _assemble(inner, pre, pre_table, closes, [b"]" * c for c in range(rank + 1)])


def _multi_line(tokens: np.ndarray, shape: tuple[int, ...], depth: int) -> bytes:
    """A tensor written with the default layout, its first ``[`` at writer nesting ``depth``."""
    rank = len(shape)
    if rank == 0:
        return _compact(tokens)
    value_line = b"\n" + b"    " * (depth + rank)
    inner, opens, closes = _by_innermost_row(tokens, shape, value_line, b"," + value_line)

    def prefix(o: int, first: bool) -> bytes:
        parts = [] if first else [b","]
        for m in range(rank - o, rank):
            parts.append(b"[" if m == 0 else b"\n" + b"    " * (depth + m) + b"[")
        return b"".join(parts)

    pre = opens.copy()
    pre[1:] += rank + 1
    pre_table = [prefix(o, True) for o in range(rank + 1)] + [prefix(o, False) for o in range(rank + 1)]
    suf_table = [
        b"".join(b"\n" + b"    " * (depth + m) + b"]" for m in range(rank - 1, rank - 1 - c, -1))
        for c in range(rank + 1)
    ]
    return _compact(_assemble(inner, pre, pre_table, closes, suf_table))


def _pad(rows: np.ndarray, width: int) -> np.ndarray:
    if rows.shape[-1] == width:
        return rows
    pad = [(0, 0)] * (rows.ndim - 1) + [(0, width - rows.shape[-1])]
    return np.pad(rows, pad)


def _fast_row_objects(
    names: list[str], tokens: dict[str, np.ndarray], outputs: Mapping[str, np.ndarray]
) -> bytes:
    batch = outputs[names[0]].shape[0]
    parts = []
    for j, n in enumerate(names):
        item_shape = tuple(outputs[n].shape[1:])
        rank = len(item_shape)
        per_item = math.prod(item_shape)
        key = (b"," if j else b"") + b"\n            " + write_string(_utf8(n)) + b": "
        # prefixes: 0..rank = ", " + "["*o inside an item; rank+1 = first element; rank+2 = first of a later item
        pre_table = [b", " + b"[" * o for o in range(rank + 1)]
        opener = b"\n        {" if j == 0 else b""
        pre_table += [opener + key + b"[" * rank, (b"," + opener if j == 0 else b"") + key + b"[" * rank]
        closer = b"\n        }" if j == len(names) - 1 else b""
        suf_table = [b"]" * c for c in range(rank + 1)] + [b"]" * rank + closer]
        if rank:
            opens, closes = _opens_closes(item_shape)
            pre = np.tile(opens, batch)
            suf = np.tile(closes, batch)
        else:
            pre = np.zeros(batch, np.int64)
            suf = np.zeros(batch, np.int64)
        pre[::per_item] = rank + 2
        pre[0] = rank + 1
        suf[per_item - 1 :: per_item] = rank + 1
        rows = _assemble(tokens[n], pre, pre_table, suf, suf_table)
        parts.append(rows.reshape(batch, per_item, rows.shape[-1]))
    width = max(p.shape[-1] for p in parts)
    return _compact(np.concatenate([_pad(p, width) for p in parts], axis=1))


def _fast_predict(outputs: Mapping[str, np.ndarray], fmt: Format, small: int = SMALL) -> bytes | None:
    names, batch = checked_names(outputs, fmt)
    if batch == 0 or any(outputs[n].size == 0 for n in names):
        return None
    if sum(outputs[n].size for n in names) < small:
        return None  # a handful of values: the value-by-value writer is faster than numpy's fixed costs
    tokens: dict[str, np.ndarray] = {}
    for n in names:
        t = _tokens(outputs[n])
        if t is None:
            return None
        tokens[n] = t
    if fmt is Format.ROW:
        if len(names) == 1:
            a = outputs[names[0]]
            text = _compact(_single_line(tokens[names[0]], tuple(a.shape)))
            return b'{\n    "predictions": ' + text[:-1] + b"\n    ]\n}"
        return b'{\n    "predictions": [' + _fast_row_objects(names, tokens, outputs) + b"\n    ]\n}"
    if len(names) == 1:
        a = outputs[names[0]]
        return b'{\n    "outputs": ' + _multi_line(tokens[names[0]], tuple(a.shape), 1) + b"\n}"
    members = [
        (b"," if j else b"")
        + b"\n        "
        + write_string(_utf8(n))
        + b": "
        + _multi_line(tokens[n], tuple(outputs[n].shape), 2)
        for j, n in enumerate(names)
    ]
    return b'{\n    "outputs": {' + b"".join(members) + b"\n    }\n}"


def predict_response(outputs: Mapping[str, np.ndarray], fmt: Format) -> bytes:
    """``{"predictions": [...]}`` (ROW) or ``{"outputs": ...}`` (COLUMNAR), byte for byte as TF Serving writes it.

    Outputs are written in name order. Numeric and boolean tensors are encoded with numpy (no Python code per
    value); string tensors (``*_bytes`` as ``{"b64": ...}``), empty tensors and zero batches value by value. Errors:
    ``InvalidArgument`` with TF Serving's texts (empty map, rank-0 or inconsistent batch in ROW, dtypes JSON cannot
    carry such as half, uint16, complex).
    """
    body = _fast_predict(outputs, fmt)
    return body if body is not None else _reference_predict(outputs, fmt)


def regress_response(values: Sequence[float] | np.ndarray) -> bytes:
    """``{"results": [v, ...]}``; values are float32 (``Regression.value``)."""
    arr = np.asarray(values, dtype=np.float32).reshape(-1)
    if not arr.size:
        raise InvalidArgument("Cannot convert empty RegressionResults to JSON")
    return b'{\n    "results": ' + _compact(_single_line(float_tokens(arr), (arr.size,))) + b"\n}"


def classify_response(results: Sequence[Sequence[tuple[str, float]]]) -> bytes:
    """``{"results": [[[label, score], ...], ...]}`` (one list of classes per example; scores are float32)."""
    if not results:
        raise InvalidArgument("Cannot convert empty ClassificationResults to JSON")
    w = PrettyWriter()
    w.start_object()
    w.key(b"results")
    w.start_array()
    for classes in results:
        w.single_line_arrays = True
        w.start_array()
        for label, score in classes:
            w.start_array()
            w.string(as_bytes(label))
            w.raw(format_float(float(np.float32(score))).encode())
            w.end_array()
        w.end_array()
        w.single_line_arrays = False
    w.end_array()
    w.end_object()
    return w.getvalue()


def error_body(message: str) -> bytes:
    """``{"error": message}`` as TF Serving pretty-prints it."""
    return b'{\n    "error": ' + write_string(_utf8(message)) + b"\n}"

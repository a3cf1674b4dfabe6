"""A received ``PredictRequest``'s bytes -> the request and its content inputs' values, in as few copies as may be.

:func:`parse_predict_request` is serve-local's receive path. With the native module (``embedgate_native``,
``native/src/predict_req.rs``) it splits the bytes without the GIL: each input whose tensor is a numeric
``tensor_content`` of exactly its shape's bytes becomes a read-only numpy view of the received bytes (no protobuf
copy, no field read copy), and protobuf parses only the small rest (``model_spec``, ``output_filter``, every other
input). Without the module, with ``EMBEDGATE_SERVE_DIRECT_RUN=off``, or when the split declines (malformed bytes, a
key sent twice, ...), protobuf parses the whole message and the inputs are decoded from it
(:func:`reference_parse`, the reference). Either way the values are the same and a message protobuf cannot parse is
an :class:`InvalidArgumentError` naming protobuf's error.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tensorflow_serving.apis import predict_pb2

from embedgate.localserve.errors import InvalidArgumentError
from embedgate.localserve.tensors import content_dtype

__all__ = ["ContentInputs", "parse_predict_request", "reference_parse"]

DIRECT_ENV = "EMBEDGATE_SERVE_DIRECT_RUN"  # "off": Session.run and the protobuf parse (the reference paths)

# alias -> (DataType number, value): the inputs taken out of the request by the split
ContentInputs = dict[str, tuple[int, np.ndarray]]


@functools.cache
def _module() -> ModuleType | None:
    try:
        import embedgate_native
    except ImportError:  # a tree without the native build: the reference path
        return None
    return embedgate_native


def _split_fn() -> Any:
    """The native split, or None when the module (or a build with the split) is missing or the env turns it off."""
    fn = getattr(_module(), "split_predict_request", None)
    if fn is None or os.environ.get(DIRECT_ENV) == "off":
        return None
    return fn


def parse_predict_request(raw: bytes) -> tuple[predict_pb2.PredictRequest, ContentInputs]:
    """(the request without its content inputs, the content inputs); raises :class:`InvalidArgumentError` for bytes
    that are not a ``PredictRequest``. The arrays are read-only views of ``raw`` (they keep it alive)."""
    split = _split_fn()
    parts = split(raw) if split is not None else None
    if parts is None:
        return _parse(raw), {}
    rest, found = parts
    contents: ContentInputs = {}
    for alias, dtype, dims, offset, length in found:
        np_dtype = content_dtype(dtype)
        assert np_dtype is not None  # the split takes only these dtypes
        view = np.frombuffer(raw, np_dtype, count=length // np_dtype.itemsize, offset=offset)
        contents[alias] = (dtype, view.reshape(dims))
    return _parse(rest), contents


def reference_parse(raw: bytes) -> predict_pb2.PredictRequest:
    """The whole message parsed by protobuf (the reference; every input stays in ``request.inputs``)."""
    return _parse(raw)


def _parse(raw: bytes) -> predict_pb2.PredictRequest:
    try:
        return predict_pb2.PredictRequest.FromString(raw)
    except DecodeError as exc:
        raise InvalidArgumentError(f"Could not parse the PredictRequest: {exc}") from exc

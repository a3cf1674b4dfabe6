"""One loaded SavedModel version, run the way ``tensorflow_model_server`` runs it.

The version's MetaGraph (tag ``serve``) is restored with ``tf.compat.v1.saved_model.loader.load`` into its own
``tf.Graph`` and ``tf.compat.v1.Session``; requests call ``Session.run`` with the signature's tensor names. The
session lives as long as the version is loaded, so resource state (e.g. a ``MutableHashTable`` written by a PS
``upsert_<t>`` signature) persists across requests to that version. ``Session.run`` is thread-safe; a
:class:`Servable` may serve many requests at once. :meth:`close` must be called only when no request uses it
(``manager.py`` guarantees that).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.client import pywrap_tf_session as tf_session
from tensorflow.python.util import deprecation
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    input_pb2,
    predict_pb2,
    regression_pb2,
)

from embedgate.localserve.batching import Batcher, BatchingParameters
from embedgate.localserve.errors import (
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    ServingError,
)
from embedgate.localserve.request import DIRECT_ENV, ContentInputs
from embedgate.localserve.tensors import (
    decode_tensor,
    dtype_name,
    encode_tensor,
    shape_compatible,
    shape_of_proto,
)

__all__ = ["DEFAULT_SIGNATURE", "Servable"]

_log = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
_CLASSIFY_INPUTS = "inputs"
_CLASSES = "classes"
_SCORES = "scores"

_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}
_PLAN_CACHE_SIZE = 32  # run plans kept per servable (one per feed-name set and fetch list seen; LRU)


@dataclass(frozen=True)
class _RunPlan:
    """The graph endpoints of one (sorted feed names, fetch names) pair, resolved once.

    ``feeds[i]`` is the ``TF_Output`` of the i-th sorted feed name, fed an array of ``dtypes[i]`` whose shape fits
    ``shapes[i]`` (None = unknown rank; -1 = any size); ``fetches`` the ``TF_Output`` of each fetch, in order.
    """

    feeds: tuple[Any, ...]
    dtypes: tuple[np.dtype[Any], ...]
    shapes: tuple[tuple[int, ...] | None, ...]
    fetches: tuple[Any, ...]

    def accepts(self, values: Sequence[np.ndarray]) -> bool:
        """Whether every value is an ndarray of its feed's dtype and a compatible shape: what ``Session.run``'s
        Python checks would let through unchanged (anything else goes to ``Session.run``, for its errors)."""
        for value, dtype, shape in zip(values, self.dtypes, self.shapes, strict=True):
            if type(value) is not np.ndarray or value.dtype != dtype:
                return False
            if shape is not None and (
                len(shape) != value.ndim
                or any(e >= 0 and e != a for e, a in zip(shape, value.shape, strict=True))
            ):
                return False
        return True


class _ServableError(ServingError):
    """An error raised by TensorFlow while running; keeps TF's own canonical code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Servable:
    """A loaded version of one model. Build with :meth:`load`; thread-safe; :meth:`close` once, when unused."""

    def __init__(
        self, name: str, version: int, path: Path, session: Any, meta_graph: meta_graph_pb2.MetaGraphDef
    ) -> None:
        self.name = name
        self.version = version
        self.path = path
        self._session = session
        self._meta_graph = meta_graph
        self._closed = False
        self._close_lock = threading.Lock()
        self._batcher: Batcher | None = None
        self._plans: OrderedDict[tuple[tuple[str, ...], tuple[str, ...]], _RunPlan | None] = OrderedDict()
        self._plans_lock = threading.Lock()

    @classmethod
    def load(
        cls, name: str, version: int, path: Path, *, batching: BatchingParameters | None = None
    ) -> Servable:
        """Restore the ``serve`` MetaGraph of ``path`` into a new graph and session (runs its init ops); with
        ``batching``, concurrent Predict calls are merged (``batching.py``)."""
        graph = tf.Graph()
        session = tf.compat.v1.Session(
            graph=graph, config=tf.compat.v1.ConfigProto(allow_soft_placement=True)
        )
        try:
            # the loader TF Serving's C++ loader mirrors; its deprecation notice (use tf.saved_model.load) is noise here
            with graph.as_default(), deprecation.silence():
                meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(path))
        except BaseException:
            session.close()
            raise
        graph.finalize()
        servable = cls(name, version, path, session, meta_graph)
        if batching is not None:
            servable._batcher = Batcher(batching, servable._run, name=f"{name}-{version}")
        return servable

    # -- metadata -----------------------------------------------------------------------------------------------
    @property
    def signature_defs(self) -> Mapping[str, meta_graph_pb2.SignatureDef]:
        signature_defs: Mapping[str, meta_graph_pb2.SignatureDef] = self._meta_graph.signature_def
        return signature_defs

    def signature_def_map(self) -> get_model_metadata_pb2.SignatureDefMap:
        out = get_model_metadata_pb2.SignatureDefMap()
        for key, sig in self._meta_graph.signature_def.items():
            out.signature_def[key].CopyFrom(sig)
        return out

    def signature(self, name: str) -> tuple[str, meta_graph_pb2.SignatureDef]:
        """(resolved name, SignatureDef); empty name = ``serving_default``; FAILED_PRECONDITION if absent."""
        key = name or DEFAULT_SIGNATURE
        sig = self._meta_graph.signature_def.get(key)
        if sig is None:
            raise FailedPreconditionError(f'Serving signature key "{key}" not found.')
        return key, sig

    # -- predict ------------------------------------------------------------------------------------------------
    def predict(
        self,
        request: predict_pb2.PredictRequest,
        *,
        as_content: bool = False,
        timeout: float | None = None,
        contents: ContentInputs | None = None,
    ) -> predict_pb2.PredictResponse:
        """Run the request's signature; ``timeout`` (seconds, None = none) bounds ``Session.run``. ``contents``: inputs
        already taken out of the received bytes (``request.py``), checked like ``request.inputs``; no alias is in
        both."""
        key, sig = self.signature(request.model_spec.signature_name)
        if sig.method_name not in (PREDICT_METHOD, CLASSIFY_METHOD, REGRESS_METHOD):
            raise InternalError(
                f"Expected prediction signature method_name to be one of {{{PREDICT_METHOD}, {CLASSIFY_METHOD}, "
                f"{REGRESS_METHOD}}}. Was: {sig.method_name}"
            )
        contents = contents or {}
        _check_input_names(sig, [*request.inputs.keys(), *contents])
        feeds = {}
        for alias in sorted([*request.inputs, *contents]):
            info = sig.inputs[alias]
            if alias in contents:
                dtype, value = contents[alias]
                _check_dtype(alias, dtype, info, sig)
                value = _check_shape(alias, value, info)
            else:
                value = _decode_input(alias, request.inputs[alias], info, sig)
            feeds[_tensor_name(info, alias)] = value
        aliases = _output_aliases(sig, list(request.output_filter))
        infos = [sig.outputs[a] for a in aliases]
        fetches = [_tensor_name(i, a) for a, i in zip(aliases, infos, strict=True)]
        if self._batcher is not None and _batched_outputs(infos):
            values = self._batcher.run(feeds, fetches, timeout)
        else:
            values = self._run(feeds, fetches, timeout)
        response = predict_pb2.PredictResponse()
        _fill_spec(response.model_spec, self.name, self.version, key)
        for alias, info, value in zip(aliases, infos, values, strict=True):
            response.outputs[alias].CopyFrom(
                encode_tensor(value, _output_dtype(info, value), as_content=as_content)
            )
        return response

    # -- classify / regress -------------------------------------------------------------------------------------
    def classify(
        self, request: classification_pb2.ClassificationRequest, *, timeout: float | None = None
    ) -> classification_pb2.ClassificationResponse:
        key, sig = self.signature(request.model_spec.signature_name)
        if sig.method_name != CLASSIFY_METHOD:
            raise InvalidArgumentError(
                f"Expected classification signature method_name to be {CLASSIFY_METHOD}. "
                f"Was: {sig.method_name}"
            )
        input_info = _single_input(sig)
        classes_info = sig.outputs.get(_CLASSES)
        scores_info = sig.outputs.get(_SCORES)
        if classes_info is None and scores_info is None:
            raise InvalidArgumentError(
                f'Expected classification signature outputs to contain at least one of "{_CLASSES}" or '
                f'"{_SCORES}". Signature was: {sorted(sig.outputs)}'
            )
        examples = _serialized_examples(request.input)
        fetch_aliases = [a for a, i in ((_CLASSES, classes_info), (_SCORES, scores_info)) if i is not None]
        fetches = [_tensor_name(sig.outputs[a], a) for a in fetch_aliases]
        values = dict(
            zip(
                fetch_aliases,
                self._run({_tensor_name(input_info, _CLASSIFY_INPUTS): examples}, fetches, timeout),
                strict=True,
            )
        )
        n = len(examples)
        classes = values.get(_CLASSES)
        scores = values.get(_SCORES)
        for alias, arr in ((_CLASSES, classes), (_SCORES, scores)):
            if arr is not None and (arr.ndim != 2 or arr.shape[0] != n):
                raise InvalidArgumentError(
                    f"Expected Tensor shape: [batch_size num_classes] but got "
                    f"{list(arr.shape)} for output {alias!r} (batch_size {n})"
                )
        if classes is not None and scores is not None and classes.shape != scores.shape:
            raise InvalidArgumentError(
                f"Tensors class and score should match in shape: classes {list(classes.shape)}"
                f" vs scores {list(scores.shape)}"
            )
        response = classification_pb2.ClassificationResponse()
        _fill_spec(response.model_spec, self.name, self.version, key)
        width = (classes if classes is not None else scores).shape[1]  # type: ignore[union-attr]
        for row in range(n):
            result = response.result.classifications.add()
            for col in range(width):
                cls = result.classes.add()
                if classes is not None:
                    label = classes[row, col]
                    cls.label = label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)
                if scores is not None:
                    cls.score = float(scores[row, col])
        return response

    def regress(
        self, request: regression_pb2.RegressionRequest, *, timeout: float | None = None
    ) -> regression_pb2.RegressionResponse:
        key, sig = self.signature(request.model_spec.signature_name)
        if sig.method_name != REGRESS_METHOD:
            raise InvalidArgumentError(
                f"Expected regression signature method_name to be {REGRESS_METHOD}. Was: {sig.method_name}"
            )
        input_info = _single_input(sig)
        if len(sig.outputs) != 1:
            raise InvalidArgumentError(f"Expected one output Tensor. Signature has {len(sig.outputs)}")
        ((out_alias, out_info),) = sig.outputs.items()
        examples = _serialized_examples(request.input)
        (values,) = self._run(
            {_tensor_name(input_info, _CLASSIFY_INPUTS): examples},
            [_tensor_name(out_info, out_alias)],
            timeout,
        )
        n = len(examples)
        if not (values.shape == (n,) or values.shape == (n, 1)):
            raise InvalidArgumentError(
                "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] "
                f"but got {list(values.shape)} (batch_size {n})"
            )
        response = regression_pb2.RegressionResponse()
        _fill_spec(response.model_spec, self.name, self.version, key)
        for v in values.reshape(-1):
            response.result.regressions.add(value=float(v))
        return response

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def close(self) -> None:
        with self._close_lock:
            if not self._closed:
                self._closed = True
                if self._batcher is not None:
                    self._batcher.close()
                self._session.close()

    def _run(self, feeds: dict[str, Any], fetches: Sequence[str], timeout: float | None) -> list[np.ndarray]:
        # Like TF Serving, the request's deadline becomes the session-run timeout (DEADLINE_EXCEEDED when hit).
        options = None
        if timeout is not None:
            options = tf.compat.v1.RunOptions(timeout_in_ms=max(1, int(timeout * 1000)))
        try:
            if os.environ.get(DIRECT_ENV) != "off":  # "off": every run through Session.run (the reference)
                names = tuple(sorted(feeds))
                plan = self._plan(names, tuple(fetches))
                values = [feeds[n] for n in names]
                if plan is not None and plan.accepts(values):
                    return self._run_direct(plan, values, options)
            return list(self._session.run(list(fetches), feed_dict=feeds, options=options))
        except tf.errors.OpError as exc:
            code = _STATUS_BY_NUMBER.get(int(exc.error_code), grpc.StatusCode.UNKNOWN)
            raise _ServableError(code, exc.message) from exc
        except (ValueError, TypeError) as exc:  # Python-side feed checks (shape, dtype conversion)
            raise InvalidArgumentError(str(exc)) from exc

    def _run_direct(self, plan: _RunPlan, values: Sequence[np.ndarray], options: Any) -> list[np.ndarray]:
        """One ``TF_SessionRun`` with the plan's endpoints: what ``Session.run`` ends in, without re-resolving and
        re-checking every feed and fetch by name on each call (TF Serving's C++ ``Session::Run`` has no such step)."""
        options_buf = (
            tf_session.TF_NewBufferFromString(options.SerializeToString()) if options is not None else None
        )
        try:
            results = self._session._call_tf_sessionrun(
                options_buf, dict(zip(plan.feeds, values, strict=True)), list(plan.fetches), [], None
            )
        finally:
            if options_buf is not None:
                tf_session.TF_DeleteBuffer(options_buf)
        return list(results)

    def _plan(self, feed_names: tuple[str, ...], fetches: tuple[str, ...]) -> _RunPlan | None:
        """The cached run plan of these names (built on first use), or None when a name does not resolve to a plain
        feedable tensor / fetchable tensor (``Session.run`` then runs and reports it)."""
        key = (feed_names, fetches)
        with self._plans_lock:
            if key in self._plans:
                self._plans.move_to_end(key)
                return self._plans[key]
            plan = _build_plan(self._session.graph, feed_names, fetches)
            self._plans[key] = plan
            if len(self._plans) > _PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)
            return plan


def _build_plan(graph: Any, feed_names: tuple[str, ...], fetches: tuple[str, ...]) -> _RunPlan | None:
    try:
        feeds = [graph.as_graph_element(n, allow_tensor=True, allow_operation=False) for n in feed_names]
        outs = [graph.as_graph_element(n, allow_tensor=True, allow_operation=False) for n in fetches]
    except (KeyError, ValueError, TypeError):
        return None
    if not all(graph.is_feedable(t) for t in feeds) or not all(graph.is_fetchable(t) for t in outs):
        return None
    if len(set(fetches)) != len(fetches):
        return None
    shapes = tuple(
        None if t.shape.rank is None else tuple(-1 if d is None else int(d) for d in t.shape.as_list())
        for t in feeds
    )
    try:
        dtypes = tuple(np.dtype(t.dtype.as_numpy_dtype) for t in feeds)
    except TypeError:  # a dtype numpy cannot hold (resource, variant): Session.run reports it
        return None
    return _RunPlan(
        feeds=tuple(t._as_tf_output() for t in feeds),
        dtypes=dtypes,
        shapes=shapes,
        fetches=tuple(t._as_tf_output() for t in outs),
    )


def _batched_outputs(infos: Sequence[meta_graph_pb2.TensorInfo]) -> bool:
    """Whether every output has a leading batch dimension (-1) in the signature, so a batch can be split back."""
    for info in infos:
        shape = shape_of_proto(info.tensor_shape)
        if not shape or shape[0] != -1:
            return False
    return True


def _fill_spec(spec: Any, name: str, version: int, signature_name: str) -> None:
    spec.name = name
    spec.version.value = version
    spec.signature_name = signature_name


def _tensor_name(info: meta_graph_pb2.TensorInfo, alias: str) -> str:
    if info.WhichOneof("encoding") != "name":
        raise FailedPreconditionError(
            f"tensor alias {alias!r}: only dense tensors are supported "
            f"(encoding {info.WhichOneof('encoding')})"
        )
    name: str = info.name
    return name


def _check_input_names(sig: meta_graph_pb2.SignatureDef, sent: Any) -> None:
    request_inputs = sorted(sent)
    signature_inputs = sorted(sig.inputs)
    if len(request_inputs) > len(signature_inputs) or (
        len(request_inputs) < len(signature_inputs) and not sig.defaults
    ):
        extra = sorted(set(request_inputs) - set(signature_inputs))
        missing = sorted(set(signature_inputs) - set(request_inputs))
        raise InvalidArgumentError(
            f"input size does not match signature: {len(request_inputs)}!={len(signature_inputs)} "
            f"len({{{','.join(request_inputs)}}}) != len({{{','.join(signature_inputs)}}}). "
            f"Sent extra: {{{','.join(extra)}}}. Missing but required: {{{','.join(missing)}}}."
        )
    for alias in request_inputs:
        if alias not in sig.inputs:
            raise InvalidArgumentError(
                f"input tensor alias not found in signature: {alias}. Inputs expected to be "
                f"in the set {{{','.join(signature_inputs)}}}."
            )
    missing = [a for a in signature_inputs if a not in sent and a not in sig.defaults]
    if missing:
        raise InvalidArgumentError(
            f"input size does not match signature: missing inputs without a default: {{{','.join(missing)}}}."
        )


def _decode_input(
    alias: str, proto: Any, info: meta_graph_pb2.TensorInfo, sig: meta_graph_pb2.SignatureDef
) -> np.ndarray:
    _check_dtype(alias, proto.dtype, info, sig)
    try:
        value = decode_tensor(proto)
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a half_val out of 16 bits
        raise InvalidArgumentError(f"tensor parsing error: {alias} ({exc})") from exc
    return _check_shape(alias, value, info)


def _check_dtype(
    alias: str, dtype: int, info: meta_graph_pb2.TensorInfo, sig: meta_graph_pb2.SignatureDef
) -> None:
    if dtype != info.dtype:
        index = sorted(sig.inputs).index(alias)
        raise InvalidArgumentError(
            f"Expects arg[{index}] to be {dtype_name(info.dtype)} but "
            f"{dtype_name(dtype)} is provided (input {alias!r})"
        )


def _check_shape(alias: str, value: np.ndarray, info: meta_graph_pb2.TensorInfo) -> np.ndarray:
    expected = shape_of_proto(info.tensor_shape)
    if not shape_compatible(tuple(value.shape), expected):
        raise InvalidArgumentError(
            f"input {alias!r}: shape {list(value.shape)} is not compatible with the "
            f"signature's shape {expected}"
        )
    return value


def _output_aliases(sig: meta_graph_pb2.SignatureDef, output_filter: list[str]) -> list[str]:
    if not output_filter:
        return list(sig.outputs)
    seen: set[str] = set()
    for alias in output_filter:
        if alias not in sig.outputs:
            raise InvalidArgumentError(
                f"output tensor alias not found in signature: {alias} Outputs expected to be "
                f"in the set {{{','.join(sorted(sig.outputs))}}}."
            )
        if alias in seen:
            raise InvalidArgumentError(f"duplicate output tensor alias: {alias}")
        seen.add(alias)
    return output_filter


def _output_dtype(info: meta_graph_pb2.TensorInfo, value: np.ndarray) -> int:
    if info.dtype:
        return int(info.dtype)
    return int(tf.dtypes.as_dtype(value.dtype).as_datatype_enum)


def _single_input(sig: meta_graph_pb2.SignatureDef) -> meta_graph_pb2.TensorInfo:
    if len(sig.inputs) != 1:
        raise InvalidArgumentError(f"Expected one input Tensor. Signature has {len(sig.inputs)}")
    (info,) = sig.inputs.values()
    return info


def _serialized_examples(inp: input_pb2.Input) -> np.ndarray:
    """Serialized tf.Examples of an ``Input``; with context, context then example (proto merge: example wins)."""
    kind = inp.WhichOneof("kind")
    if kind == "example_list":
        serialized = [e.SerializeToString() for e in inp.example_list.examples]
    elif kind == "example_list_with_context":
        ctx = inp.example_list_with_context.context.SerializeToString()
        serialized = [ctx + e.SerializeToString() for e in inp.example_list_with_context.examples]
    else:
        serialized = []
    if not serialized:
        raise InvalidArgumentError("Input is empty.")
    return np.array(serialized, dtype=object)

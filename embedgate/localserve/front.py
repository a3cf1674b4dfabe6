"""serve-local's gRPC port in front of its Python gRPC server: the native gate (``native/src/gate.rs``).

Why (issue 22): gRPC's Python server receives a large message in many small pieces under the interpreter lock. An
entry request of 5.3 MB cost it 3.5-6.5 ms, against 0.8-1.1 ms for 0.53 MB, which put the entry call alone above the
whole model served as one SavedModel. The gate receives ``Predict`` calls natively, off the interpreter lock, into
one buffer (``native/src/direct.rs``); worker threads here take each whole message (one copy into a ``bytes``),
run the same servicer method the Python server runs, and hand back the serialized answer or the status. Every other
method (``Classify``, ``Regress``, ``GetModelMetadata``, the model service, compressed requests) is relayed by the
gate to the Python server, which listens on a Unix socket in a private directory.

The Python server listening on the port itself is the reference: ``EMBEDGATE_SERVE_FRONT=python``, a tree without
the native module, or TLS (``--ssl_config_file``; the gate speaks plain HTTP/2 only). The answers are the same on
both (``tests/localserve/test_front.py``).
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import Any, NoReturn

import grpc

__all__ = [
    "FRONT_ENV",
    "PREDICT_PATH",
    "NativeFront",
    "gate_wanted",
    "native_front",
    "serve_call",
    "upstream_dir",
]

_log = logging.getLogger(__name__)

FRONT_ENV = "EMBEDGATE_SERVE_FRONT"  # "python": the gRPC server listens on the port itself (the reference)
PREDICT_PATH = "/tensorflow.serving.PredictionService/Predict"
_POLL_S = 0.5  # how long a worker waits for a call before it looks at the stop flag
# a client's call may send this much before the gate reads it: an entry request of several MB in one or two flow-
# control round trips (with 1 MiB, a 5.3 MB request waited for five window updates)
_STREAM_WINDOW = 8 << 20

Handler = Callable[[bytes, Any], Any]
"""A servicer method taking the received bytes and a context, returning the response message."""


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _Context:
    """What the servicers use of ``grpc.ServicerContext``, for a call the gate took."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def time_remaining(self) -> float | None:
        left: float | None = self._call.time_remaining()
        return left

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise _Aborted(code, details)

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """As gRPC gives it: ``-bin`` values decoded from their base64 (padding optional), the others as text."""
        return tuple(
            (k, base64.b64decode(v + b"=" * (-len(v) % 4)) if k.endswith("-bin") else v.decode("latin-1"))
            for k, v in self._call.metadata()
        )


def serve_call(call: Any, handler: Handler) -> None:
    """Run ``handler`` on one call the gate took and answer it: the serialized message, or the status it aborted
    with (the servicers turn every error into an abort; anything else escaping is INTERNAL, as gRPC's server does)."""
    ctx = _Context(call)
    try:
        response = handler(call.take_message(), ctx)
    except _Aborted as exc:
        call.respond(int(exc.code.value[0]), exc.details)
        return
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes a status
        _log.exception("request failed")
        call.respond(int(grpc.StatusCode.INTERNAL.value[0]), f"Unexpected {type(exc).__name__}")
        return
    call.respond(0, "", response.SerializeToString())


class NativeFront:
    """A gate relaying to the Python server behind it (in ``directory``), with ``threads`` workers answering
    ``Predict`` through ``predict``."""

    def __init__(self, gate: Any, directory: str, predict: Handler, threads: int) -> None:
        self._gate = gate
        self._dir = directory
        self._predict = predict
        self._stopping = threading.Event()
        self._workers = [
            threading.Thread(target=self._work, name=f"direct-{i}", daemon=True)
            for i in range(max(1, threads))
        ]
        for t in self._workers:
            t.start()

    def _work(self) -> None:
        while True:
            call = self._gate.next_call(_POLL_S)
            if call is None:
                if self._stopping.is_set():
                    return
                continue
            serve_call(call, self._predict)

    def close(self, grace_s: float) -> None:
        """Stop listening; the calls in flight get up to ``grace_s`` seconds; then the workers end."""
        self._gate.close(grace_s)
        self._stopping.set()
        for t in self._workers:
            t.join(timeout=grace_s + 2 * _POLL_S)
        shutil.rmtree(self._dir, ignore_errors=True)


def upstream_dir() -> tuple[str, str]:
    """(a private 0700 directory, the ``unix:`` address of a socket in it) for the Python server behind the gate."""
    directory = tempfile.mkdtemp(prefix="serve-local-grpc-")
    return directory, f"unix:{os.path.join(directory, 'server.sock')}"


def _gate_class() -> Any:
    try:
        import embedgate_native
    except ImportError:  # a tree without the native build: the Python server listens itself
        return None
    gate_cls = getattr(embedgate_native, "GrpcGate", None)
    return gate_cls if gate_cls is not None and hasattr(gate_cls, "next_call") else None


def gate_wanted(*, tls: bool) -> bool:
    """Whether the gate fronts the port: not with TLS, ``EMBEDGATE_SERVE_FRONT=python`` or no native module (the
    Python server then listens on the port itself)."""
    return not tls and os.environ.get(FRONT_ENV, "gate") != "python" and _gate_class() is not None


def native_front(
    host: str, port: int, directory: str, upstream: str, predict: Handler, threads: int
) -> NativeFront:
    """The gate on ``host:port`` in front of the Python server already listening at ``upstream`` (when
    :func:`gate_wanted`). Raises OSError when the port is taken."""
    gate = _gate_class()(
        host,
        port,
        upstream.removeprefix("unix:"),
        2**62,  # no admission bound: serve-local is a backend, it answers every call
        0,
        "",
        8,
        direct=[PREDICT_PATH],
        max_message=2**31 - 1,
        max_calls=max(1, threads) * 4,
        reuse_port=False,
        stream_window=_STREAM_WINDOW,
    )
    return NativeFront(gate, directory, predict, threads)

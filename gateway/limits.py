"""Per-request bounds: body reading, buffered bytes, JSON structure, and parsing large bodies off the event loop.

What one request may cost is bounded by ``GatewaySettings.limits`` (``LimitsSettings``) and ``max_body_bytes``:

* :func:`read_body` reads at most ``max_body_bytes`` (also after decompression), reserving every byte in the app's
  :class:`BufferedBytes` first (all bodies being read or processed, REST and gRPC, share
  ``limits.max_buffered_bytes``; 429 above). The caller bounds the read in time (``limits.body_timeout_s``). A
  gzip/deflate body is inflated on the parse threads by :func:`inflate`, streaming, within ``max_body_bytes`` and
  ``limits.max_decompression_ratio`` (413 as soon as either is passed).
* :func:`parse_json` parses a body with the tensor codec's rules and then checks its shape: nesting depth
  (``max_json_depth``, checked on the raw bytes before parsing, so no parser recursion can blow up), lone UTF-16
  surrogates in strings, the batch size (``max_instances``) and values per feature per instance
  (``max_ids_per_feature``). Each failure is a 400/413 naming the limit.
* :func:`offload` runs a CPU-heavy pure function (parsing, feature validation) on the request's parse thread pool
  when the request's body is at least ``limits.offload_bytes``; small requests run inline (a thread hop costs more
  than they do). The event loop thus keeps answering ``/healthz`` and small requests while a big one is parsed.
* :class:`ParsePool` (``limits.parse_processes`` > 0) parses and types large bodies in worker processes instead:
  single C calls (JSON parsing, numpy conversion of huge lists, protobuf encoding) hold the GIL of the process that
  runs them, so threads alone still stall the loop for the length of one such call. :func:`parse_pool` is the pool of
  the current request when its body is large, else None.

The pool and the limits reach the codec calls of one request through a context variable set by :func:`request_scope`
(``contextvars`` follow the request's tasks), so the service layer keeps its signatures. Outside a request scope
(unit tests of the service) every call runs inline with the default limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import ctypes.util
import functools
import multiprocessing
import os
import re
import select
import signal
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final, ParamSpec, TypeVar

import numpy as np
from starlette.requests import Request

from gateway.codec import json_tensor as jt
from gateway.errors import InvalidArgument, PayloadTooLarge, ResourceExhausted, Unavailable, clip
from schemas.gateway_settings import LimitsSettings

__all__ = [
    "RATIO_FLOOR",
    "BufferedBytes",
    "ParsePool",
    "check_structure",
    "current_limits",
    "inflate",
    "json_depth",
    "offload",
    "parse_document",
    "parse_json",
    "parse_pool",
    "plain_scope",
    "read_body",
    "release_memory",
    "release_memory_soon",
    "request_scope",
]

P = ParamSpec("P")
T = TypeVar("T")

_DEFAULT_LIMITS: Final = LimitsSettings()
_BIG_BODY: Final = 8 * 1024 * 1024  # after a request this large, give freed heap pages back to the OS


@dataclass(frozen=True)
class _Scope:
    limits: LimitsSettings
    executor: ThreadPoolExecutor | None
    big: bool  # parse on the executor
    procs: ParsePool | None  # parse worker processes (None: threads only)


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "embedgate_request_limits", default=None
)


@contextmanager
def request_scope(
    limits: LimitsSettings,
    executor: ThreadPoolExecutor | None,
    body_bytes: int,
    procs: ParsePool | None = None,
    *,
    offload_bytes: int | None = None,
) -> Iterator[None]:
    """Make ``limits``, ``executor`` and ``procs`` apply to :func:`parse_json` / :func:`offload` /
    :func:`parse_pool` calls inside the block. The request is large (worked off the loop) from ``offload_bytes``
    (default ``limits.offload_bytes``)."""
    threshold = limits.offload_bytes if offload_bytes is None else offload_bytes
    big = executor is not None and body_bytes >= threshold
    token = _SCOPE.set(_Scope(limits, executor, big, procs))
    try:
        yield
    finally:
        _SCOPE.reset(token)


@contextmanager
def plain_scope(body_bytes: int) -> Iterator[None]:
    """Inside the current request scope: the request is large only from ``limits.plain_offload_bytes``, for a body
    whose whole work is a few native passes without the GIL (an embedding model's REST body its one-pass parser
    answered), as :func:`request_scope`'s ``offload_bytes`` does for a plain gRPC PredictRequest."""
    scope = _SCOPE.get()
    if scope is None:
        yield
        return
    limits = scope.limits
    with request_scope(
        limits, scope.executor, body_bytes, scope.procs, offload_bytes=limits.plain_offload_bytes
    ):
        yield


def current_limits() -> LimitsSettings:
    """The limits of the current request scope (the defaults outside one)."""
    scope = _SCOPE.get()
    return scope.limits if scope is not None else _DEFAULT_LIMITS


def parse_pool() -> ParsePool | None:
    """The parse worker processes when the current request's body is large and ``limits.parse_processes`` > 0."""
    scope = _SCOPE.get()
    if scope is None or not scope.big:
        return None
    return scope.procs


class ParsePool:
    """``workers`` parse processes (started by "forkserver": never a fork of this process, which runs gRPC threads).

    Functions and arguments must be picklable, and so must their results and exceptions: a GatewayError raised in a
    worker is re-raised here unchanged (same class, same message). A worker that dies (e.g. killed for memory) fails
    its request with 503 and the pool is replaced for the next ones.

    The workers die with the process that made the pool, however it ends (SIGKILL, a crash): each one watches it
    (:func:`_die_with`), and the forkserver exits by itself when its last client is gone, so nothing is orphaned.
    """

    def __init__(self, workers: int, preload: tuple[str, ...] = ("gateway.routes.rest_codec",)) -> None:
        self.workers = workers
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(preload))
        self._lock = threading.Lock()
        self._pool = self._new()

    def _new(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self.workers, mp_context=self._ctx, initializer=_die_with, initargs=(os.getpid(),)
        )

    def _submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        with self._lock:
            try:
                return self._pool.submit(_in_worker, fn, *args)
            except BrokenProcessPool:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = self._new()
                return self._pool.submit(_in_worker, fn, *args)

    def warm(self) -> None:
        """Start the workers now (imports included), not on the first large request."""
        for _ in range(self.workers):
            self._submit(int)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker; blocks the calling thread (call it from a parse thread, not the loop)."""
        try:
            return self._submit(fn, *args).result()
        except BrokenProcessPool:
            raise _worker_died() from None

    async def acall(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker, awaited. On cancellation a call not yet started is dropped."""
        try:
            return await asyncio.wrap_future(self._submit(fn, *args))
        except BrokenProcessPool:
            raise _worker_died() from None

    def shutdown(self) -> None:
        with self._lock:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _in_worker(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a parse worker; after a large body, the worker's freed heap goes back to the OS."""
    try:
        return fn(*args)
    finally:
        release_memory(max((len(a) for a in args if isinstance(a, bytes)), default=0))


_PR_SET_PDEATHSIG: Final = 1  # <linux/prctl.h>


def _die_with(owner: int) -> None:
    """Parse worker initializer: exit as soon as process ``owner`` (the gateway process that made the pool) is gone.

    On Linux the worker's parent (the forkserver) is also made to SIGKILL it when it exits (``PR_SET_PDEATHSIG``);
    and a daemon thread waits on a pidfd of ``owner`` (readable once it terminated; no pid-reuse race), else polls
    it every second, then ends the worker with ``os._exit``. Without this a SIGKILLed gateway leaves its workers
    blocked on the call queue forever (they hold its write end themselves, so they never read EOF)."""
    if sys.platform == "linux":
        name = ctypes.util.find_library("c")
        if name is not None:
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(name, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    fd: int | None = None
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        os._exit(0)  # the owner is already gone
    except (OSError, AttributeError):  # no pidfd (old kernel, not Linux): poll the pid
        fd = None
    threading.Thread(target=_watch_owner, args=(owner, fd), name="embedgate-owner-watch", daemon=True).start()


def _watch_owner(owner: int, fd: int | None) -> None:
    if fd is not None:
        select.select([fd], [], [])  # a pidfd becomes readable when its process terminates
        os._exit(0)
    while True:
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:  # the pid was reused by another user's process: the owner is gone
            os._exit(0)
        threading.Event().wait(1.0)


def _worker_died() -> Unavailable:
    return Unavailable("A request parsing worker exited (out of memory?); retry later")


async def offload(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)``, on the parse threads when the current request is large, else inline.

    ``fn`` must be pure (no event-loop objects). If the awaiting task is cancelled (deadline), the thread finishes
    its call and the result is dropped; nothing that follows in the request runs.
    """
    scope = _SCOPE.get()
    if scope is None or not scope.big or scope.executor is None:
        return fn(*args, **kwargs)
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    return await loop.run_in_executor(scope.executor, functools.partial(ctx.run, fn, *args, **kwargs))


# ---- buffered bytes -----------------------------------------------------------------------------------------------


class BufferedBytes:
    """Body bytes held by all requests of one app; ``reserve`` refuses (429) past ``limit``. One event loop."""

    def __init__(self, limit: int, retry_after: int) -> None:
        self.limit = limit
        self.current = 0
        self._retry_after = retry_after

    def check_room(self) -> None:
        """ResourceExhausted when nothing more fits (a front refuses before it receives a body of unknown size)."""
        if self.current >= self.limit:
            self._refuse()

    def reserve(self, n: int) -> None:
        if self.current + n > self.limit:
            self._refuse()
        self.current += n

    @property
    def refusal_text(self) -> str:
        """What a request that does not fit is told (also by the native gRPC gate, which holds bytes of its own)."""
        return f"Too many request bytes being processed (limits.max_buffered_bytes={self.limit}); retry later"

    def _refuse(self) -> None:
        raise ResourceExhausted(self.refusal_text, retry_after=self._retry_after)

    def release(self, n: int) -> None:
        self.current -= n


JOIN_OFF_LOOP_BYTES: Final = 1 << 20
"""A body at least this large is joined from its chunks on ``read_body``'s executor, not on the event loop."""


def join_chunks(chunks: list[bytes]) -> bytes:
    """A body's chunks as one bytes object (releases the GIL while it copies a megabyte or more)."""
    return b"".join(chunks)


async def read_body(
    request: Request,
    limit: int,
    buffered: BufferedBytes,
    held: list[int],
    *,
    executor: Executor | None = None,
    max_ratio: int = _DEFAULT_LIMITS.max_decompression_ratio,
) -> bytes:
    """The whole body, decompressed when ``Content-Encoding`` is ``gzip`` (``x-gzip``) or ``deflate``; at most
    ``limit`` bytes either way. A body of :data:`JOIN_OFF_LOOP_BYTES` or more is joined on ``executor``.

    Every byte kept is reserved in ``buffered`` first and added to ``held[0]``; the caller releases ``held[0]`` when
    the request ends (also on errors). A compressed body is inflated on ``executor`` (the parse threads; zlib
    releases the GIL while it inflates; inline when None) in steps, and refused with 413 as soon as the output passes
    ``limit`` or, past :data:`RATIO_FLOOR` bytes, ``max_ratio`` times the compressed bytes read so far (see
    :func:`inflate`): a gzip bomb costs a few steps, never its full size. Raises InvalidArgument (size, bad or
    truncated stream), PayloadTooLarge (decompression limits), ResourceExhausted (buffered bytes) and starlette's
    ``ClientDisconnect``.
    """
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and len(declared) < 20 and int(declared) > limit:
        raise InvalidArgument(
            f"Request body of {declared} bytes exceeds the limit of {limit} bytes (max_body_bytes)"
        )
    encoding = _encoding(request.headers.get("content-encoding", ""))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        if not chunk:
            continue
        size += len(chunk)
        if size > limit:
            raise InvalidArgument(f"Request body exceeds the limit of {limit} bytes (max_body_bytes)")
        buffered.reserve(len(chunk))
        held[0] += len(chunk)
        chunks.append(chunk)
    if executor is None or size < JOIN_OFF_LOOP_BYTES:
        body = join_chunks(chunks)
    else:  # one copy of tens of megabytes would hold the loop; bytes.join releases the GIL while it copies
        body = await asyncio.get_running_loop().run_in_executor(executor, join_chunks, chunks)
    chunks.clear()
    if encoding is None or not body:
        return body
    # The most the output may reach is reserved first; what is not used is given back.
    room = min(limit, max(RATIO_FLOOR, max_ratio * len(body)))
    buffered.reserve(room)
    held[0] += room
    work = functools.partial(inflate, body, encoding, limit, max_ratio)
    if executor is None:
        out = work()
    else:
        out = await asyncio.get_running_loop().run_in_executor(executor, work)
    buffered.release(room - len(out))
    held[0] -= room - len(out)
    return out


_WBITS: Final = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# Decompressed bytes below which the ratio is not enforced (small bodies may compress very well).
RATIO_FLOOR: Final = 1024 * 1024
_INFLATE_STEP: Final = 1024 * 1024  # decompressed bytes per zlib call


def _encoding(header: str) -> str | None:
    """The one content coding of a ``Content-Encoding`` value (None for none / identity / unknown codings, whose
    bodies are read as they are); InvalidArgument for more than one compression."""
    codings = [c.strip().lower() for c in header.split(",") if c.strip() and c.strip().lower() != "identity"]
    known = [c for c in codings if c in _WBITS]
    if len(known) > 1:
        raise InvalidArgument(
            f"Content-Encoding {header[:64]!r}: only one compression (gzip or deflate) is supported"
        )
    return known[0] if known else None


def inflate(data: bytes, encoding: str, limit: int, max_ratio: int) -> bytes:
    """``data`` decompressed (``encoding``: gzip, x-gzip or deflate, i.e. the zlib format), streaming: at most
    ``limit`` bytes out (PayloadTooLarge above) and, once more than :data:`RATIO_FLOOR` bytes came out, at most
    ``max_ratio`` times the input consumed so far (PayloadTooLarge). Pure, blocking; memory: the output so far plus
    one step. InvalidArgument for a corrupt or truncated stream."""
    d = zlib.decompressobj(_WBITS[encoding])
    parts: list[bytes] = []
    size = 0
    pending = data
    try:
        while not d.eof:
            part = d.decompress(pending, _INFLATE_STEP)
            pending = d.unconsumed_tail
            size += len(part)
            if size > limit:
                raise PayloadTooLarge(
                    f"Request body decompresses to more than {limit} bytes (max_body_bytes); refused while "
                    "decompressing"
                )
            consumed = len(data) - len(pending) - len(d.unused_data)
            if size > RATIO_FLOOR and size > max_ratio * max(consumed, 1):
                raise PayloadTooLarge(
                    f"Request body decompresses to more than {max_ratio} times its compressed size "
                    f"({size} bytes from {consumed}; limits.max_decompression_ratio)"
                )
            parts.append(part)
            if not part and not pending:
                break  # all input consumed without the end of the stream
    except zlib.error as exc:
        raise InvalidArgument(f"Unable to decompress the {encoding} request body: {exc}") from None
    if not d.eof:
        raise InvalidArgument(f"Unable to decompress the {encoding} request body: the stream is truncated")
    return b"".join(parts)


# ---- JSON structure -----------------------------------------------------------------------------------------------

_OPEN: Final = (ord("["), ord("{"))
_CLOSE: Final = (ord("]"), ord("}"))
_CHUNK: Final = 1 << 20
_RAW_DEPTH_BYTES: Final = 64 * 1024  # from this size on, the vectorised depth scan is cheaper
_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEP: Final = [1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256)]
_QUOTE: Final = ord('"')
_BACKSLASH: Final = ord("\\")
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def json_depth(data: bytes) -> int:
    """Deepest array/object nesting of JSON text ``data``; brackets inside strings do not count.

    Vectorised over the raw bytes in 1 MiB chunks (bounded memory, no recursion, numpy releases the GIL): a quote
    opens or closes a string unless an odd run of backslashes precedes it; brackets count only outside strings. For
    text that is not valid JSON the result is still finite and the parser reports the real error.
    """
    a = np.frombuffer(data, dtype=np.uint8)
    level = 0
    deepest = 0
    in_string = False
    backslashes = 0  # length of the backslash run ending right before the chunk
    for start in range(0, len(a), _CHUNK):
        part = a[start : start + _CHUNK]
        n = len(part)
        opens = (part == _OPEN[0]) | (part == _OPEN[1])
        closes = (part == _CLOSE[0]) | (part == _CLOSE[1])
        raw_quotes = part == _QUOTE
        if in_string or raw_quotes.any():
            is_bs = part == _BACKSLASH
            if backslashes or is_bs.any():
                idx = np.arange(n, dtype=np.int32)
                # index of the last non-backslash byte at or before each position
                last_plain = np.maximum.accumulate(np.where(is_bs, np.int32(-1 - backslashes), idx))
                before = np.empty(n, dtype=np.int32)  # backslashes right before each position
                before[0] = backslashes
                np.subtract(idx[:-1], last_plain[:-1], out=before[1:])
                quotes = raw_quotes & (before % 2 == 0)
                backslashes = int(n - 1 - last_plain[-1]) if is_bs[-1] else 0
            else:
                quotes = raw_quotes
            parity = np.cumsum(quotes, dtype=np.int32)
            if in_string:
                parity += 1
            inside = (parity & 1).astype(bool)
            outside = ~(inside | quotes)
            opens &= outside
            closes &= outside
            in_string = bool(inside[-1])  # parity after the last byte
        else:
            backslashes = 0
        levels = np.cumsum(opens, dtype=np.int32)
        levels -= np.cumsum(closes, dtype=np.int32)
        deepest = max(deepest, level + int(levels.max()))
        level += int(levels[-1])
    return deepest


def _has_lone_surrogate(doc: Any) -> str | None:
    """The first string (key or value) of ``doc`` holding a lone UTF-16 surrogate, or None. Iterative."""
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return v
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def _batch_sizes(doc: dict[str, Any]) -> Iterator[tuple[str, int]]:
    for key in ("instances", "examples"):
        v = doc.get(key)
        if isinstance(v, list):
            yield key, len(v)
    inputs = doc.get("inputs")
    if isinstance(inputs, list):
        yield "inputs", len(inputs)
    elif isinstance(inputs, dict):
        for name, v in inputs.items():
            if isinstance(v, list):
                yield f"inputs[{clip(name)!r}]", len(v)


def _per_feature(doc: dict[str, Any]) -> Iterator[tuple[str, int, list[Any]]]:
    """(feature, instance index, value) for every list-valued feature of every instance (row and columnar)."""
    for key in ("instances", "examples"):
        items = doc.get(key)
        if isinstance(items, list):
            for i, item in enumerate(items):
                if isinstance(item, dict):
                    for name, v in item.items():
                        if type(v) is list:
                            yield name, i, v
                elif type(item) is list:
                    yield key, i, item
    inputs = doc.get("inputs")
    if isinstance(inputs, dict):
        for name, column in inputs.items():
            if type(column) is list:
                for i, v in enumerate(column):
                    if type(v) is list:
                        yield name, i, v
    context = doc.get("context")
    if isinstance(context, dict):
        for name, v in context.items():
            if type(v) is list:
                yield name, 0, v


def check_structure(doc: dict[str, Any], limits: LimitsSettings) -> None:
    """413 when the batch is larger than ``max_instances`` or a feature of one instance has more than
    ``max_ids_per_feature`` values. Costs one pass over instances x features, after the batch size is known."""
    for where, n in _batch_sizes(doc):
        if n > limits.max_instances:
            raise PayloadTooLarge(
                f"{where} has {n} entries, more than the limit of {limits.max_instances} (limits.max_instances)"
            )
    cap = limits.max_ids_per_feature
    for name, i, v in _per_feature(doc):
        if len(v) > cap:
            raise PayloadTooLarge(
                f"feature {clip(name)!r} at example {i} has {len(v)} values, more than the limit of {cap} "
                "(limits.max_ids_per_feature)"
            )


def _small_depth(body: bytes) -> int:
    """:func:`json_depth` for small bodies: strings removed by a regex, then a running sum over the brackets only."""
    text = _STRING.sub(b'""', body) if b'"' in body else body
    brackets = text.translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _too_deep(depth: int, limits: LimitsSettings) -> InvalidArgument:
    return InvalidArgument(
        f"JSON Parse error: nesting depth {depth} exceeds the limit of {limits.max_json_depth} (limits.max_json_depth)"
    )


def parse_document(body: bytes, limits: LimitsSettings) -> dict[str, Any]:
    """``json_tensor.loads(body)`` after the depth check, then the surrogate and count checks (pure, blocking)."""
    # Depth is checked on the raw bytes before parsing. Fewer brackets than the limit cannot nest deeper than it (two
    # C-speed counts); small bodies use the regex scan, large ones the vectorised one.
    if body.count(b"[") + body.count(b"{") > limits.max_json_depth:
        depth = json_depth(body) if len(body) >= _RAW_DEPTH_BYTES else _small_depth(body)
        if depth > limits.max_json_depth:
            raise _too_deep(depth, limits)
    doc: dict[str, Any] = jt.loads(body)
    if _SURROGATE_ESCAPE.search(body) is not None:
        bad = _has_lone_surrogate(doc)
        if bad is not None:
            shown = bad.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")[:64]
            raise InvalidArgument(f"JSON Parse error: lone UTF-16 surrogate in string {shown!r}")
    # Each entry or value costs at least 2 bytes: a body this small cannot break the count limits.
    if len(body) >= 2 * min(limits.max_instances, limits.max_ids_per_feature):
        check_structure(doc, limits)
    return doc


async def parse_json(body: bytes) -> dict[str, Any]:
    """``json_tensor.loads(body)`` plus the structure limits of the current request (off the loop when large)."""
    return await offload(parse_document, body, current_limits())


# ---- memory -------------------------------------------------------------------------------------------------------


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return fn


def release_memory(body_bytes: int) -> None:
    """After a large request, return freed heap pages to the OS (glibc keeps them otherwise). Blocking, short."""
    if body_bytes >= _BIG_BODY:
        trim = _malloc_trim()
        if trim is not None:
            trim(0)


def release_memory_soon(executor: Executor | None, body_bytes: int) -> None:
    """:func:`release_memory` on ``executor`` (malloc_trim can take a while: not on the event loop), and only after a
    body large enough for it to trim. Submitting a job that does nothing cost every request a hand-off of the
    interpreter lock: the worker thread woke and waited for the lock, and took it the next time the loop let it go
    (in a send or a native call), so on a busy machine the loop waited for the worker to be scheduled (a REST predict
    of the demo model at batch 64 spent 1.6 ms in the entry call's hand-off, 0.05 ms without it)."""
    if body_bytes >= _BIG_BODY and executor is not None:
        with contextlib.suppress(RuntimeError):  # executor already shut down
            executor.submit(release_memory, body_bytes)

"""glibc malloc settings for a serving process: large temporaries are reused, and the free memory goes back to the OS.

Two costs pull apart. A PS write call (``upsert_<t>`` of ~16 k rows at dim 64) allocates a few tensors of about 4 MB;
glibc keeps freed heap memory in the process, in one arena per allocating thread (up to 8 per core: serve-local's
gRPC workers and TensorFlow's thread pools), which kept 83-128 MB after one rewrite of a PS, whatever its size
(docs/benchmarks.md, issue 19). A large request (an entry call at batch 2048 is 3-14 MB) passes through a few
buffers of its own size (gRPC's message, the parsed request, the tensors fed to TensorFlow): when those come from a
fresh ``mmap`` every time, as they do below a fixed 1 MiB mmap threshold, every page is faulted in, zeroed and
unmapped again on each request (5,300 page faults and ~25 ms of CPU per 5 MB entry call against 280 faults with
the buffers reused; docs/serve-local.md "Memory").

:func:`configure_malloc` fixes glibc's mmap threshold at :data:`MMAP_THRESHOLD` (32 MiB: the largest glibc's own
*dynamic* threshold reaches; fixing it turns the dynamic adjustment off) and the trim threshold at
:data:`TRIM_THRESHOLD` (the 2x glibc pairs with it), so request-sized blocks come from the heap and are reused from
one request to the next; and, when asked, limits the arenas. Each only unless the standard glibc environment
variable (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_ARENA_MAX``) sets it already: glibc reads
those at process start, and they are what a ``tensorflow_model_server`` container sets (``docs/deployment.md``, *PS
memory and glibc malloc*). Call it first thing in the process, before threads start (an arena limit counts only for
arenas made after it). What the arenas keep is returned by :func:`trim_malloc`, which serve-local calls on a timer
(every 2 s by default): the memory a PS write leaves behind goes back within that interval, without an mmap per
large block in between. Not glibc (e.g. musl, macOS): nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Mapping
from typing import cast

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "configure_malloc", "trim_malloc"]

_log = logging.getLogger(__name__)

MMAP_THRESHOLD = 32 << 20  # bytes: smaller blocks come from the heap (and are reused); larger ones are mmap'ed
TRIM_THRESHOLD = 64 << 20  # bytes of free heap top that free() keeps; the rest goes back at once
ARENA_MAX = 2  # malloc arenas in all for a server that does not trim (glibc's default: 8 per core)
_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers (glibc malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_ENV = {
    _M_TRIM_THRESHOLD: "MALLOC_TRIM_THRESHOLD_",
    _M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_",
    _M_ARENA_MAX: "MALLOC_ARENA_MAX",
}


def configure_malloc(
    environ: Mapping[str, str] | None = None, *, arena_max: int | None = None
) -> dict[str, int]:
    """Set glibc's mmap threshold to :data:`MMAP_THRESHOLD`, its trim threshold to :data:`TRIM_THRESHOLD` and, with
    ``arena_max``, the arena limit, each unless ``environ`` (default ``os.environ``) names its glibc variable. Returns
    {variable name: value set}; empty when nothing was set (all from the environment, or the C library is not
    glibc). Without a periodic :func:`trim_malloc` the thresholds let the arenas keep freed blocks of up to
    :data:`MMAP_THRESHOLD`: a process that does not trim should set ``MALLOC_MMAP_THRESHOLD_`` lower."""
    env = os.environ if environ is None else environ
    wanted = {_M_MMAP_THRESHOLD: MMAP_THRESHOLD, _M_TRIM_THRESHOLD: TRIM_THRESHOLD}
    if arena_max is not None:
        wanted[_M_ARENA_MAX] = arena_max
    todo = {param: value for param, value in wanted.items() if _ENV[param] not in env}
    mallopt = _mallopt()
    if not todo or mallopt is None:
        return {}
    done: dict[str, int] = {}
    for param, value in todo.items():
        if mallopt(param, value) == 1:  # mallopt returns 1 on success
            done[_ENV[param]] = value
        else:
            _log.warning("mallopt(%s=%d) failed; glibc's default stays", _ENV[param], value)
    return done


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None when the process's C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: musl has mallopt as a stub)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int], int], fn)


def trim_malloc() -> bool:
    """Return the free memory of every malloc arena to the OS (glibc ``malloc_trim(0)``: also the free pages inside
    the heaps, not only their tops). True if memory was released; False when none was, or not glibc. Thread-safe
    (glibc locks each arena in turn); costs a walk of the free lists."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return bool(fn(0))

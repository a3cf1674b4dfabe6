"""glibc malloc settings for a serving process: large temporaries go back to the OS, and so does what the arenas keep.

Why: a PS write call (``upsert_<t>`` of ~16 k rows at dim 64) allocates a few tensors of about 4 MB (the request,
its decoded values, the gathered rows). glibc serves an allocation above ``M_MMAP_THRESHOLD`` with its own ``mmap``
and unmaps it on free, but the threshold is *dynamic*: after such a block is freed glibc raises the threshold to its
size (up to 32 MB), so from then on these temporaries come from the heap and, once freed, stay in the process. Every
thread that allocates gets an arena of its own (up to 8 per core), each keeping its own free blocks. With serve-local's
gRPC workers and TensorFlow's thread pools this kept 83-128 MB after one rewrite of a PS, whatever its size
(docs/benchmarks.md, issue 19).

:func:`configure_malloc` fixes the threshold at :data:`MMAP_THRESHOLD` (which also turns the dynamic adjustment off)
and, when asked, limits the arenas; each unless the standard glibc environment variable (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_ARENA_MAX``) sets it already: glibc reads those at process start, and they are what a
``tensorflow_model_server`` container sets (``docs/deployment.md``, *PS memory and glibc malloc*). Call it first thing
in the process, before threads start (an arena limit counts only for arenas made after it). serve-local sets the
threshold only and calls :func:`trim_malloc` on a timer, which returns what the arenas keep without funnelling every
thread through :data:`ARENA_MAX` arenas. Not glibc (e.g. musl, macOS): nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Mapping
from typing import cast

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD", "configure_malloc", "trim_malloc"]

_log = logging.getLogger(__name__)

MMAP_THRESHOLD = 1 << 20  # bytes: larger blocks are mmap'ed and returned to the OS on free
ARENA_MAX = 2  # malloc arenas in all for a server that does not trim (glibc's default: 8 per core)
_M_MMAP_THRESHOLD = -3  # mallopt parameter numbers (glibc malloc.h)
_M_ARENA_MAX = -8
_ENV = {_M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_", _M_ARENA_MAX: "MALLOC_ARENA_MAX"}


def configure_malloc(
    environ: Mapping[str, str] | None = None, *, arena_max: int | None = None
) -> dict[str, int]:
    """Set glibc's mmap threshold to :data:`MMAP_THRESHOLD` and, with ``arena_max``, the arena limit, each unless
    ``environ`` (default ``os.environ``) names its glibc variable. Returns {variable name: value set}; empty when
    nothing was set (all from the environment, or the C library is not glibc)."""
    env = os.environ if environ is None else environ
    wanted = {_M_MMAP_THRESHOLD: MMAP_THRESHOLD}
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

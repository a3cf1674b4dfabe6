"""glibc malloc settings for a serving process: where large blocks come from, and giving free memory back to the OS.

Two costs pull apart. A PS write call (``upsert_<t>`` of ~16 k rows at dim 64) allocates a few tensors of about 4 MB.
glibc serves an allocation above ``M_MMAP_THRESHOLD`` with its own ``mmap`` and unmaps it on free, but the threshold
is *dynamic*: after such a block is freed glibc raises the threshold to its size (up to 32 MB), so from then on these
temporaries come from the heap and, once freed, stay in the process, in one arena per allocating thread (up to 8 per
core: serve-local's gRPC workers and TensorFlow's thread pools). This kept 83-128 MB after one rewrite of a PS,
whatever its size (docs/benchmarks.md, issue 19). A fixed 1 MiB threshold keeps them mmap'ed.

A large request pays for that: an entry call at batch 2048 (3-14 MB) passes through a few buffers of its own size
(gRPC's message, the parsed request), and with a 1 MiB threshold each is a fresh ``mmap`` on every request, every
page faulted in, zeroed and unmapped again (about 5,300 page faults per 5 MB entry call, against about 280 with the
buffers reused from the heap; docs/serve-local.md "Memory"). A server that mostly takes large requests (an entry
model) wants a threshold above its requests' size.

:func:`configure_malloc` fixes glibc's mmap threshold at ``mmap_threshold`` (default :data:`MMAP_THRESHOLD`, 1 MiB,
for a PS; :data:`ENTRY_MMAP_THRESHOLD` for an entry server; fixing it turns the dynamic adjustment off) and the trim
threshold at twice that, the pair glibc's own dynamic mode keeps (so a block freed at the top of the heap stays for
the next request instead of going back at once); and, when asked, limits the arenas. Each only unless the standard
glibc environment variable (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_ARENA_MAX``) sets it
already: glibc reads those at process start, and they are what a ``tensorflow_model_server`` container sets
(``docs/deployment.md``, *PS memory and glibc malloc*). Call it first thing in the process, before threads start (an
arena limit counts only for arenas made after it). serve-local calls :func:`trim_malloc` on a timer, which returns
what the arenas keep without funnelling every thread through :data:`ARENA_MAX` arenas. Not glibc (e.g. musl,
macOS): nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Mapping
from typing import cast

__all__ = ["ARENA_MAX", "ENTRY_MMAP_THRESHOLD", "MMAP_THRESHOLD", "configure_malloc", "trim_malloc"]

_log = logging.getLogger(__name__)

MMAP_THRESHOLD = 1 << 20  # bytes: larger blocks are mmap'ed and returned to the OS on free (a PS's writes)
# bytes: an entry server's requests (up to 14 MB) reuse heap blocks (glibc's max)
ENTRY_MMAP_THRESHOLD = 32 << 20
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
    environ: Mapping[str, str] | None = None,
    *,
    mmap_threshold: int = MMAP_THRESHOLD,
    arena_max: int | None = None,
) -> dict[str, int]:
    """Set glibc's mmap threshold to ``mmap_threshold`` bytes and its trim threshold to twice that (``0``: neither,
    glibc's dynamic thresholds stay) and, with ``arena_max``, the arena limit, each unless ``environ`` (default
    ``os.environ``) names its glibc variable. Returns {variable name: value set}; empty when nothing was set (all
    from the environment, or the C library is not glibc). Raises ValueError for a negative threshold."""
    if mmap_threshold < 0:
        raise ValueError(f"mmap_threshold must be >= 0 bytes, got {mmap_threshold}")
    env = os.environ if environ is None else environ
    wanted = (
        {_M_MMAP_THRESHOLD: mmap_threshold, _M_TRIM_THRESHOLD: 2 * mmap_threshold} if mmap_threshold else {}
    )
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

"""serve-local's malloc settings (embedgate/localserve/memory.py): what they change, and that the environment wins.

The observable effect is glibc's own accounting (``mallinfo2().hblkhd``, bytes in mmap'ed blocks, before and after a 4 MB ``malloc``): with glibc's
dynamic threshold a 4 MB block freed once makes the next 4 MB blocks come from the heap (where freed memory stays in
the process); with the fixed threshold they are mmap'ed again (and unmapped on free). Each case runs in a fresh
interpreter, as the settings are per process."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from embedgate.localserve.memory import ARENA_MAX, MMAP_THRESHOLD, configure_malloc

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc only"
)

_CHILD = r"""
import ctypes, json, sys
from embedgate.localserve.memory import configure_malloc
set_ = configure_malloc(arena_max=int(sys.argv[2]) if len(sys.argv) > 2 else None) if sys.argv[1] == "configure" else {}
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc.mallinfo2.restype = Info
size = 4 << 20  # a 16 384-row upsert's values at dim 64
libc.free(libc.malloc(size))  # glibc's dynamic threshold rises to 4 MB here
before = libc.mallinfo2().hblkhd
block = libc.malloc(size)
print(json.dumps({"set": set_, "mmapped": libc.mallinfo2().hblkhd - before}))
libc.free(block)
"""


def _child(mode: str, *extra: str, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environ.update(env, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, *extra],
        capture_output=True,
        text=True,
        env=environ,
        check=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_fixed_threshold_keeps_large_temporaries_mmapped() -> None:
    default = _child("default")
    fixed = _child("configure")
    assert default["mmapped"] == 0  # the second 4 MB block came from the heap: glibc keeps it when freed
    assert isinstance(fixed["mmapped"], int) and fixed["mmapped"] >= 4 << 20
    assert fixed["set"] == {
        "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD
    }  # serve-local's call: arenas as glibc has them


def test_environment_settings_win() -> None:
    # a deployment's own MALLOC_MMAP_THRESHOLD_ (here glibc's dynamic default is approximated by a large one) stays
    kept = _child("configure", str(ARENA_MAX), MALLOC_MMAP_THRESHOLD_=str(64 << 20))
    assert kept["mmapped"] == 0
    assert kept["set"] == {"MALLOC_ARENA_MAX": ARENA_MAX}
    assert (
        configure_malloc({"MALLOC_MMAP_THRESHOLD_": "1", "MALLOC_ARENA_MAX": "1"}, arena_max=ARENA_MAX) == {}
    )


_TRIM_CHILD = r"""
import ctypes, json
from embedgate.localserve.memory import trim_malloc
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
blocks = [libc.malloc(64 << 10) for _ in range(2000)]  # 128 MB of heap blocks (below any mmap threshold)
for b in blocks:
    libc.memset(b, 1, 64 << 10)
for b in blocks[:-1]:  # all free, but the last one pins the heap's top: free() alone returns nothing
    libc.free(b)
held = rss()
released = trim_malloc()
print(json.dumps({"held": held, "after": rss(), "released": released}))
"""


def test_trim_returns_the_free_pages_inside_the_heap() -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _TRIM_CHILD],
        capture_output=True,
        text=True,
        env={**environ, "PYTHONPATH": str(REPO)},
        check=True,
        timeout=120,
    )
    got = json.loads(out.stdout)
    assert got["released"] is True
    assert got["held"] - got["after"] > 100 << 20  # most of the 128 MB freed inside the heap went back

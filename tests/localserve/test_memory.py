"""serve-local's malloc settings (embedgate/localserve/memory.py): what they change, and that the environment wins.

The observable effect is glibc's own accounting (``mallinfo2()``: ``hblkhd``, bytes in mmap'ed blocks; ``fordblks``,
free bytes the arenas keep) around 4 MB ``malloc`` calls (a PS write's temporaries; an entry request's buffers are
1-14 MB). With glibc's dynamic threshold the first such block is mmap'ed and the following ones come from the heap;
with serve-local's default 1 MiB threshold every one is mmap'ed (and unmapped on free); with the entry setting
(``--malloc_mmap_threshold_bytes=33554432``) every one comes from the heap and a freed one stays there for the next
(no page faults per request; the periodic trim returns it). Each case runs in a fresh interpreter, as the settings
are per process."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from embedgate.localserve.memory import ARENA_MAX, ENTRY_MMAP_THRESHOLD, MMAP_THRESHOLD, configure_malloc

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc only"
)

_CHILD = r"""
import ctypes, json, sys
from embedgate.localserve.memory import configure_malloc
kw = {"arena_max": int(sys.argv[2])} if len(sys.argv) > 2 and sys.argv[2] else {}
if len(sys.argv) > 3:
    kw["mmap_threshold"] = int(sys.argv[3])
set_ = configure_malloc(**kw) if sys.argv[1] == "configure" else {}
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc.mallinfo2.restype = Info
size = 4 << 20  # a 16 384-row upsert's values at dim 64; an entry request's buffers are 1-14 MB
before = libc.mallinfo2().hblkhd
first = libc.malloc(size)
first_mmapped = libc.mallinfo2().hblkhd - before
libc.free(first)  # glibc's dynamic threshold rises to 4 MB here
before = libc.mallinfo2().hblkhd
block = libc.malloc(size)
mmapped = libc.mallinfo2().hblkhd - before
libc.free(block)
kept = libc.mallinfo2().fordblks  # free bytes the arenas keep for the next block
print(json.dumps({"set": set_, "first_mmapped": first_mmapped, "mmapped": mmapped, "kept": kept}))
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


def test_default_threshold_keeps_large_temporaries_mmapped() -> None:
    default = _child("default")
    fixed = _child("configure")
    assert isinstance(default["first_mmapped"], int) and default["first_mmapped"] >= 4 << 20
    assert (
        default["mmapped"] == 0
    )  # glibc's dynamic threshold: from the second 4 MB block on, the heap (kept)
    assert (
        isinstance(fixed["mmapped"], int) and fixed["mmapped"] >= 4 << 20
    )  # every block mmap'ed, freed to the OS
    assert fixed["set"] == {
        "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD,
        "MALLOC_TRIM_THRESHOLD_": 2 * MMAP_THRESHOLD,
    }  # serve-local's default: arenas as glibc has them


def test_entry_threshold_reuses_large_temporaries_from_the_heap() -> None:
    entry = _child("configure", "", str(ENTRY_MMAP_THRESHOLD))
    assert entry["first_mmapped"] == 0 and entry["mmapped"] == 0  # from the first block on
    assert isinstance(entry["kept"], int) and entry["kept"] >= 4 << 20  # freed, kept for the next request
    assert entry["set"] == {
        "MALLOC_MMAP_THRESHOLD_": ENTRY_MMAP_THRESHOLD,
        "MALLOC_TRIM_THRESHOLD_": 2 * ENTRY_MMAP_THRESHOLD,
    }
    assert _child("configure", "", "0")["set"] == {}  # 0: glibc's dynamic thresholds
    with pytest.raises(ValueError, match="mmap_threshold must be >= 0 bytes, got -1"):
        configure_malloc({}, mmap_threshold=-1)


def test_environment_settings_win() -> None:
    # a deployment's own MALLOC_MMAP_THRESHOLD_ (here glibc's dynamic default is approximated by a large one) stays
    kept = _child("configure", str(ARENA_MAX), MALLOC_MMAP_THRESHOLD_=str(64 << 20))
    assert kept["mmapped"] == 0
    assert kept["set"] == {"MALLOC_TRIM_THRESHOLD_": 2 * MMAP_THRESHOLD, "MALLOC_ARENA_MAX": ARENA_MAX}
    environ = {"MALLOC_MMAP_THRESHOLD_": "1", "MALLOC_TRIM_THRESHOLD_": "1", "MALLOC_ARENA_MAX": "1"}
    assert configure_malloc(environ, arena_max=ARENA_MAX) == {}


_TRIM_CHILD = r"""
import ctypes, json, sys
from embedgate.localserve.memory import configure_malloc, trim_malloc
if sys.argv[1] == "configure":
    configure_malloc()
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


@pytest.mark.parametrize("mode", ["default", "configure"])
def test_trim_returns_the_free_pages_inside_the_heap(mode: str) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _TRIM_CHILD, mode],
        capture_output=True,
        text=True,
        env={**environ, "PYTHONPATH": str(REPO)},
        check=True,
        timeout=120,
    )
    got = json.loads(out.stdout)
    assert got["released"] is True
    assert got["held"] - got["after"] > 100 << 20  # most of the 128 MB freed inside the heap went back

"""The /proc readers the benchmarks report resources with (tests/support/stack.py): a process tree's CPU time and
resident memory, with and without its descendants."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.stack import cpu_seconds, rss_bytes

# A parent that starts a child; the child burns 0.3 s of its own CPU time, says so on stdout, and waits for stdin.
_CHILD = (
    "import sys, time\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.3: pass\n"
    "print('burnt', flush=True); sys.stdin.read()\n"
)
_PARENT = (
    "import subprocess, sys\n"
    f"c = subprocess.Popen([sys.executable, '-c', {_CHILD!r}], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)\n"
    "print(c.pid, c.stdout.readline().strip(), flush=True); sys.stdin.read(); c.stdin.close(); c.wait()\n"
)


@pytest.fixture
def tree() -> Iterator[tuple[int, int]]:
    """(parent pid, child pid) of a two-process tree whose child has used at least 0.3 s of CPU."""
    with subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None and parent.stdin is not None
        child, burnt = parent.stdout.readline().split()
        assert burnt == "burnt"
        try:
            yield parent.pid, int(child)
        finally:
            parent.stdin.close()
            parent.wait(timeout=60)


def test_cpu_seconds_counts_descendants_only_with_tree(tree: tuple[int, int]) -> None:
    parent, child = tree
    own = cpu_seconds(parent, tree=False)
    assert cpu_seconds(child) >= 0.3
    assert cpu_seconds(parent) >= own + 0.3
    assert own < cpu_seconds(parent)


def test_rss_bytes_adds_descendants_with_tree(tree: tuple[int, int]) -> None:
    parent, child = tree
    assert rss_bytes(child) > 0
    assert rss_bytes(parent) >= rss_bytes(parent, tree=False) + rss_bytes(child) // 2


def test_a_process_that_is_gone_counts_zero() -> None:
    gone = (1 << 22) + 1  # above the kernel's largest pid_max: never a live pid
    assert cpu_seconds(gone) == 0.0
    assert rss_bytes(gone) == 0


def test_thread_cpu_names_each_thread_and_charges_the_one_that_burnt() -> None:
    import ctypes
    import threading
    import time

    from benchmarks.gateway_perf_profile import _threads_line, thread_cpu

    def burn() -> None:
        libc = ctypes.CDLL(None)
        libc.prctl(15, b"burner", 0, 0, 0)  # PR_SET_NAME: the thread's comm
        t = time.thread_time()
        while time.thread_time() - t < 0.3:
            pass
        done.wait()

    done = threading.Event()
    worker = threading.Thread(target=burn)
    before = thread_cpu(os.getpid())
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            after = thread_cpu(os.getpid())
            burnt = [v - before.get(k, 0.0) for k, v in after.items() if k[1] == "burner"]
            if burnt and burnt[0] >= 0.25:
                break
            time.sleep(0.05)
        assert burnt and burnt[0] >= 0.25, after
        line = _threads_line(before, after, 10)
        assert line.startswith("per thread, ms per request: burner ")  # the busiest first, CPU / 10 requests
        assert float(line.split("burner ")[1].split(",")[0]) >= 25.0
    finally:
        done.set()
        worker.join()

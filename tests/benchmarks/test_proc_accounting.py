"""The /proc readers the benchmarks report resources with (tests/support/stack.py): a process tree's CPU time and
resident memory, with and without its descendants."""

from __future__ import annotations

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

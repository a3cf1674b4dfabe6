"""An environment switch set for a block (``EMBEDGATE_NATIVE`` and the like), for tests and benchmarks that compare a
native or direct path with its reference."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from gateway import native

__all__ = ["env_set", "native_mode"]


@contextmanager
def env_set(name: str, value: str) -> Iterator[None]:
    """The environment variable ``name`` set to ``value`` inside the block, restored after (no fixture: hypothesis
    runs a test's body many times, and a benchmark switches modes between interleaved rounds)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def native_mode(mode: str) -> AbstractContextManager[None]:
    """``EMBEDGATE_NATIVE`` set to ``mode`` inside the block, restored after."""
    return env_set(native.ENV, mode)

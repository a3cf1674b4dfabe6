"""``EMBEDGATE_NATIVE`` set for a block, for tests and benchmarks that compare the native path with the reference."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from gateway import native

__all__ = ["native_mode"]


@contextmanager
def native_mode(mode: str) -> Iterator[None]:
    """``EMBEDGATE_NATIVE`` set to ``mode`` inside the block, restored after (no fixture: hypothesis runs a test's
    body many times, and a benchmark switches modes between interleaved rounds)."""
    before = os.environ.get(native.ENV)
    os.environ[native.ENV] = mode
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(native.ENV, None)
        else:
            os.environ[native.ENV] = before

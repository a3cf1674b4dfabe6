"""A gate a test holds a parse worker at: the worker writes its pid to ``<gate>/started`` and waits for the test to
create ``<gate>/go``; the test awaits ``started`` meanwhile. Both waits are bounded (``wait_s``)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

WAIT_S = 60.0  # never reached when the gateway behaves


def hold(gate: str, wait_s: float = WAIT_S) -> None:
    """In the worker: record this process's pid, then block until ``<gate>/go`` exists (TimeoutError past
    ``wait_s``)."""
    d = Path(gate)
    (d / "started").write_text(str(os.getpid()), encoding="utf-8")
    end = time.monotonic() + wait_s
    while not (d / "go").exists():
        if time.monotonic() > end:
            raise TimeoutError("the test never released the parse worker")
        time.sleep(0.01)


async def reached(path: Path, what: str, wait_s: float = WAIT_S) -> str:
    """In the test: the text of ``path`` once it is written (an assertion naming ``what`` past ``wait_s``)."""
    end = time.monotonic() + wait_s
    while not path.exists() or not path.read_text(encoding="utf-8"):
        assert time.monotonic() < end, f"{path.name} never appeared: {what} did not reach the parse worker"
        await asyncio.sleep(0.01)
    return path.read_text(encoding="utf-8")

"""A gateway killed with SIGKILL leaves no parse-pool process behind (forkserver and workers exit by themselves)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.ports import free_port

_REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live ``pid``; None when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every live process below ``root``."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            parents.setdefault(st[0], []).append(int(entry.name))
            starts[int(entry.name)] = st[1]
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            out[child] = starts[child]
            todo.append(child)
    return out


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == start  # same pid and start time: not a reused pid


def _wait(what: str, cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def test_sigkilled_gateway_leaves_no_parse_process(tmp_path: Path) -> None:
    workers = 2
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "models": [{"kind": "passthrough", "name": "m", "target": "127.0.0.1:1"}],
                "limits": {"parse_processes": workers},
            }
        )
    )
    port = free_port()
    python = _REPO / ".venv" / "bin" / "python"
    cmd = [str(python if python.exists() else sys.executable), "-m", "embedgate", "gateway"]
    cmd += ["--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)]
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=_REPO, stdout=out, stderr=subprocess.STDOUT)
    children: dict[int, int] = {}
    try:

        def healthy() -> bool:
            assert proc.poll() is None, f"gateway exited with {proc.returncode}:\n{log.read_text()}"
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        _wait("the gateway's /healthz", healthy, 60)

        def pool_started() -> bool:
            children.clear()
            children.update(_descendants(proc.pid))
            return len(children) >= workers + 1  # the forkserver and its workers

        _wait(f"a forkserver and {workers} parse workers under the gateway", pool_started, 30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        _wait(
            "every process the gateway had to exit after its SIGKILL",
            lambda: not [p for p, start in children.items() if _alive(p, start)],
            30,
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for pid, start in children.items():  # only if the test failed: do not leave them behind
            if _alive(pid, start):
                os.kill(pid, signal.SIGKILL)

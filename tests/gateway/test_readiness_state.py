"""gateway.readiness with a fake gateway (one seam): the state /readyz and gRPC Health answer from, its listeners,
and a poller that survives a failing poll."""

from __future__ import annotations

import asyncio

import pytest

from gateway.readiness import Readiness, poll_readiness


class _FakeGateway:
    """``Gateway.ready`` answering ``answer``; ``fail`` makes the next poll raise."""

    def __init__(self) -> None:
        self.answer = {"a": "ok", "b": "ok"}
        self.calls = 0
        self.fail = False

    async def ready(self, deadline: float) -> dict[str, str]:
        self.calls += 1
        if self.fail:
            self.fail = False
            raise RuntimeError("a bug in one poll")
        return dict(self.answer)


async def test_state_follows_the_last_poll_and_tells_listeners() -> None:
    gw, state = _FakeGateway(), Readiness()
    assert not state.ready and state.polls == 0 and state.models == {}  # not ready before the first poll
    seen: list[bool] = []

    async def listener(s: Readiness) -> None:
        seen.append(s.ready)

    state.subscribe(listener)
    await state.poll(gw, 1.0)  # type: ignore[arg-type]
    assert state.ready and seen == [True]
    gw.answer["b"] = "UNAVAILABLE: down"
    await state.poll(gw, 1.0)  # type: ignore[arg-type]
    assert not state.ready and state.models["b"].startswith("UNAVAILABLE") and seen == [True, False]
    state.unsubscribe(listener)
    await state.poll(gw, 1.0)  # type: ignore[arg-type]
    assert seen == [True, False] and state.polls == 3 == gw.calls


async def test_the_poller_survives_a_failing_poll(caplog: pytest.LogCaptureFixture) -> None:
    gw, state = _FakeGateway(), Readiness()
    gw.fail = True
    task = asyncio.create_task(poll_readiness(state, gw, 0.01, 1.0))  # type: ignore[arg-type]
    try:
        for _ in range(1000):  # bounded: until two polls after the failing one
            if state.polls >= 2:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert state.polls >= 2 and state.ready
    assert any("readiness poll failed" in r.getMessage() for r in caplog.records)
    assert gw.calls == state.polls + 1  # every call but the failing one ended a poll: no other probe

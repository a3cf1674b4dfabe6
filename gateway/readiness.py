"""The gateway's readiness, as its own poller last saw it: what ``/readyz`` and gRPC ``Health`` answer from.

One task (:func:`poll_readiness`, started by the lifespan) asks every backend once per ``health_poll_s``: the entry
and every PS replica of each embedding model, the target of each pass-through model, one ``GetModelStatus`` each
(:meth:`gateway.core.Gateway.ready`). Probes never run per request, so a flood of ``/readyz`` or ``Health.Check``
costs the backends nothing and cannot make the gateway look unready. Ownership: the lifespan owns the task; the fronts
only read :class:`Readiness` (and the gRPC front subscribes to its changes). Task safety: one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from gateway.core import Gateway

__all__ = ["PROBE_TIMEOUT_S", "Readiness", "poll_readiness"]

log = logging.getLogger("embedgate.gateway")

PROBE_TIMEOUT_S: Final = (
    2.0  # one poll waits at most this long for every backend (or request_timeout_s if shorter)
)

Listener = Callable[["Readiness"], Awaitable[None]]


class Readiness:
    """Per model ``"ok"`` or why it is not ready, from the last poll; empty until the first poll ended.

    ``ready`` is True when the last poll found every model ready. ``polls`` counts the polls that ended (each made
    at most one probe per backend servable). Listeners (async callables taking this object) run after every poll.
    """

    def __init__(self) -> None:
        self.models: dict[str, str] = {}
        self.polls = 0
        self.polled_at: float | None = None  # time.monotonic() when the last poll ended; None: never
        self._listeners: list[Listener] = []

    @property
    def ready(self) -> bool:
        return self.polls > 0 and all(v == "ok" for v in self.models.values())

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def poll(self, gateway: Gateway, timeout_s: float) -> None:
        """Probe every backend once (within ``timeout_s``), keep the result, then tell the listeners."""
        models = await gateway.ready(time.monotonic() + timeout_s)
        was = self.ready if self.polls else None
        self.models = models
        self.polls += 1
        self.polled_at = time.monotonic()
        if was is not None and was != self.ready:  # not ready: WARNING with the reasons; ready again: INFO
            log.log(
                logging.INFO if self.ready else logging.WARNING,
                "readiness changed",
                extra={"ready": self.ready, "models": {k: v for k, v in models.items() if v != "ok"}},
            )
        for listener in list(self._listeners):
            await listener(self)


async def poll_readiness(
    readiness: Readiness, gateway: Gateway, every_s: float, timeout_s: float, *, first_done: bool = False
) -> None:
    """Poll forever: ``every_s`` seconds after each poll ended (so at most one probe per backend per ``every_s``).

    ``first_done``: the caller already ran the first poll. An unexpected error is logged and the next poll retries
    (the state stays as the last poll left it). Ends only when cancelled."""
    if first_done:
        await asyncio.sleep(every_s)
    while True:
        try:
            await readiness.poll(gateway, timeout_s)
        except Exception:  # never let one bad poll end the poller
            log.exception("readiness poll failed")
        await asyncio.sleep(every_s)

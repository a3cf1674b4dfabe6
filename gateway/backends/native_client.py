"""Backend ``Predict`` calls through the native gRPC client (``native/src/client.rs``) instead of ``grpc.aio``.

One :class:`NativeCalls` per gateway loop: a call hands the serialized request to the client's own thread and awaits
a future; finished calls are announced on a socket the loop watches (``loop.add_reader``), and :meth:`_drain`
settles their futures on the loop. A cancelled await (deadline, client gone) resets the call's stream. Failures are
the same :class:`~gateway.errors.GatewayError` a ``grpc.aio`` call would raise
(:func:`gateway.backends.errors.error_for_status`, which ``error_from_rpc`` uses too). Used for plaintext
backends only (``grpc.native_client``; TLS backends keep ``grpc.aio``): docs/gateway.md "Backend calls".
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from gateway.backends.errors import error_for_status
from gateway.errors import Code

if TYPE_CHECKING:
    from embedgate_native import GrpcClient

__all__ = ["NativeCalls"]


class NativeCalls:
    """Unary calls on ``client`` whose outcomes are settled on ``loop`` (the running loop when made); requests
    longer than ``max_send`` bytes are refused RESOURCE_EXHAUSTED before they are sent."""

    def __init__(
        self, client: GrpcClient, loop: asyncio.AbstractEventLoop | None = None, max_send: int = 2**31 - 1
    ) -> None:
        self._client = client
        self._max_send = max_send
        self._loop = loop or asyncio.get_running_loop()
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._fd = client.fileno()
        self._loop.add_reader(self._fd, self._drain)
        self._closed = False

    def _drain(self) -> None:
        for token, code, details, body in self._client.drain():
            fut = self._pending.pop(token, None)
            if fut is None or fut.done():
                continue
            if code == 0 and body is not None:
                fut.set_result(body)
            else:
                fut.set_exception(error_for_status(code, details))

    async def unary(self, target: str, path: str, message: bytes, seconds: float) -> bytes:
        """The answer's message of ``path`` on ``target`` (``host:port``) for ``message``, within ``seconds``."""
        if self._closed:
            raise error_for_status(int(Code.UNAVAILABLE), "the gateway's backend client is closed")
        if len(message) > self._max_send:  # grpc.aio's check (grpc.max_send_message_bytes), in its words
            raise error_for_status(
                int(Code.RESOURCE_EXHAUSTED),
                f"Sent message larger than max ({len(message)} vs. {self._max_send})",
            )
        token = self._client.call(target, path, message, seconds)
        fut: asyncio.Future[bytes] = self._loop.create_future()
        self._pending[token] = fut
        try:
            return await fut
        except asyncio.CancelledError:
            self._pending.pop(token, None)
            self._client.cancel(token)
            raise

    @property
    def running(self) -> int:
        """Calls started and not yet settled."""
        return len(self._pending)

    def close(self) -> None:
        """Stop watching and stop the client; calls still awaited end UNAVAILABLE."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._client.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(
                    error_for_status(int(Code.UNAVAILABLE), "the gateway's backend client is closed")
                )
        self._pending.clear()

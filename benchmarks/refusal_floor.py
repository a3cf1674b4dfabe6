"""The least a 429 can cost a Python asyncio HTTP/1.1 server: the floor under the gateway's REST refusals.

    .venv/bin/python -m benchmarks.refusal_floor PORT

Listens on 127.0.0.1:PORT and answers every request with one fixed 429 (the header set and size of the gateway's
refusal), keeping the connection: an ``asyncio.Protocol`` that finds each request's end (``\\r\\n\\r\\n`` and its
``Content-Length``) and writes the answer; no HTTP parser callbacks, no ASGI, no admission, no metrics, no timers.
What it costs per request is asyncio's own work (the selector, the transport's read and write, the callbacks) plus
the kernel's: no Python server refuses for less. ``benchmarks.refusal_bench --floor`` measures it beside the gateway.
Development use only: it trusts its client (``Content-Length`` as sent, no limits).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Final

__all__ = ["RefuseAll", "main"]

_BODY: Final = (
    b'{\n    "error": "Too many requests in flight: 1 at the concurrency limit of 1 (max_in_flight=1), 0 waiting '
    b'(admission.max_queue); retry later"\n}'
)
_ANSWER: Final = (
    b"HTTP/1.1 429 Too Many Requests\r\ndate: Sat, 28 Nov 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-type: application/json\r\ncontent-length: %d\r\nretry-after: 1\r\n\r\n" % len(_BODY)
) + _BODY


class RefuseAll(asyncio.Protocol):
    """Answers each complete request on the connection with :data:`_ANSWER`."""

    def __init__(self) -> None:
        self._buf = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        out = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end].lower()
            size = 0
            at = head.find(b"content-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at)
                size = int(head[at + 15 : stop if stop >= 0 else len(head)])
            if len(buf) < end + 4 + size:
                break
            buf = buf[end + 4 + size :]
            out.append(_ANSWER)
        self._buf = buf
        if out and self._transport is not None:
            self._transport.write(b"".join(out))


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(RefuseAll, "127.0.0.1", port, backlog=2048)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m benchmarks.refusal_floor PORT", file=sys.stderr)
        return 2
    asyncio.run(_serve(int(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

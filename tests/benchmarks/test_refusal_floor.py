"""benchmarks.refusal_floor: one fixed 429 per complete request, whatever the reads' boundaries."""

from __future__ import annotations

import asyncio

from benchmarks.refusal_floor import _ANSWER, RefuseAll


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))


def _request(body: bytes) -> bytes:
    return (b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


def test_answers_each_complete_request_once_across_split_and_pipelined_reads() -> None:
    proto, tr = RefuseAll(), _Transport()
    proto.connection_made(tr)
    one, two = _request(b'{"instances": [1]}'), _request(b"")
    proto.data_received(one[:10])
    proto.data_received(one[10:-3])
    assert tr.written == []  # the body is not complete yet
    proto.data_received(one[-3:] + two + two[:5])
    assert b"".join(tr.written) == _ANSWER * 2
    proto.data_received(two[5:])
    assert b"".join(tr.written) == _ANSWER * 3


def test_serves_a_real_client_on_loopback() -> None:
    async def run() -> bytes:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(RefuseAll, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request(b"{}") * 2)
            data = await asyncio.wait_for(reader.readexactly(2 * len(_ANSWER)), 30)
            writer.close()
            return data
        finally:
            server.close()

    assert asyncio.run(run()) == _ANSWER * 2

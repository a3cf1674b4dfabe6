"""The native REST gate (``native/src/rest_gate.rs``, ``rest_front: gate``): refusals without Python, every other
request relayed byte for byte to the HTTP server behind it, anything it does not judge tunnelled.

The first tests put the gate in front of a real uvicorn on a Unix socket (an echo app) and speak raw HTTP/1.1 to it
over 127.0.0.1; the last runs a whole gateway with ``rest_front: gate``."""

from __future__ import annotations

import contextlib
import json
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway import native

pytestmark = pytest.mark.skipif(not native.available(), reason="embedgate_native is not built")

_T = 30.0  # every socket read's timeout


_ABANDONED = threading.Event()  # set by the echo app when a /wait request's client went away


async def _echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers what it got: method, path, the body's length and its first bytes; ``/stream`` answers chunked;
    ``/wait`` and ``/v1/wait`` answer nothing until their client goes away, then sets :data:`_ABANDONED`."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    if scope["path"] in ("/wait", "/v1/wait"):
        if (await receive())["type"] == "http.disconnect":
            _ABANDONED.set()
        return
    out = json.dumps(
        {"method": scope["method"], "path": scope["path"], "n": len(body), "head": body[:20].decode()}
    )
    if scope["path"] == "/stream":  # no length: uvicorn frames it chunked
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"part1,", "more_body": True})
        await send({"type": "http.response.body", "body": b"part2"})
        return
    data = out.encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


@contextlib.contextmanager
def _echo_server() -> Iterator[str]:
    """uvicorn serving :func:`_echo` on a Unix socket in a thread; yields the socket's path."""
    import uvicorn

    with tempfile.TemporaryDirectory(prefix="rest-gate-") as tmp:
        path = f"{tmp}/up.sock"
        server = uvicorn.Server(
            uvicorn.Config(_echo, uds=path, log_config=None, access_log=False, lifespan="off")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        end = time.monotonic() + _T
        while not server.started:
            assert time.monotonic() < end, "uvicorn did not start"
            time.sleep(0.01)
        try:
            yield path
        finally:
            server.should_exit = True
            thread.join(_T)


@contextlib.contextmanager
def _gate(upstream: str, capacity: int = 100) -> Iterator[Any]:
    from embedgate_native import RestGate

    gate = RestGate("127.0.0.1", 0, upstream, capacity, 8, "0.25", 429, 1, 5.0, False)
    try:
        yield gate
    finally:
        gate.close(5.0)


def _read_answer(sock: socket.socket, buf: bytearray) -> tuple[bytes, bytes]:
    """One answer (head, body) framed by Content-Length or chunked; ``buf`` keeps what followed it."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {bytes(buf)!r}"
        buf += chunk
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end])
    del buf[:end]
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
    fields = {k.lower(): v for k, v in fields.items()}
    if fields.get(b"transfer-encoding") == b"chunked":
        while not buf.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, "closed inside a chunked body"
            buf += chunk
        body = bytes(buf)
        buf.clear()
        return head, body
    n = int(fields.get(b"content-length", b"0"))
    while len(buf) < n:
        chunk = sock.recv(65536)
        assert chunk, "closed inside a body"
        buf += chunk
    body = bytes(buf[:n])
    del buf[:n]
    return head, body


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def _connect(gate: Any) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", gate.port), timeout=_T)
    s.settimeout(_T)
    return s


def test_relays_requests_in_order_on_one_connection_and_pipelined() -> None:
    with _echo_server() as up, _gate(up) as gate, _connect(gate) as s:
        buf = bytearray()
        for i in range(3):
            s.sendall(_post(f"/v1/models/m{i}:predict", b'{"instances": [%d]}' % i))
            head, body = _read_answer(s, buf)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
            assert json.loads(body) == {
                "method": "POST",
                "path": f"/v1/models/m{i}:predict",
                "n": 18,
                "head": f'{{"instances": [{i}]}}',
            }
        # two requests in one write, the second's body split off: answered in order
        both = _post("/a", b"x" * 5) + _post("/b", b"y" * 70_000)
        s.sendall(both[:100])
        time.sleep(0.05)
        s.sendall(both[100:])
        assert json.loads(_read_answer(s, buf)[1])["path"] == "/a"
        second = json.loads(_read_answer(s, buf)[1])
        assert second["path"] == "/b" and second["n"] == 70_000
        # a HEAD answer has no body; a GET none sent
        s.sendall(b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\n\r\n")
        assert json.loads(_read_answer(s, buf)[1])["method"] == "GET"
        assert gate.relayed == 0


def test_refuses_v1_requests_while_admission_refuses_and_skips_their_bodies() -> None:
    with _echo_server() as up, _gate(up) as gate, _connect(gate) as s:
        buf = bytearray()
        gate.set_state(1, 8, 8, 3, 0, 100)  # queue full
        s.sendall(_post("/v1/models/m:predict", b"z" * 1000))
        head, body = _read_answer(s, buf)
        assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\ndate: "), head
        assert head.endswith(
            b"GMT\r\nserver: uvicorn\r\ncontent-type: application/json\r\ncontent-length: %d\r\nretry-after: 1\r\n\r\n"
            % len(body)
        ), head
        assert json.loads(body) == {
            "error": "Too many requests in flight: 8 at the concurrency limit of 8 (max_in_flight=8), 3 waiting "
            "(admission.max_queue); retry later"
        }
        # paths other than /v1/ are relayed all the same
        s.sendall(_post("/healthz", b""))
        assert json.loads(_read_answer(s, buf)[1])["path"] == "/healthz"
        gate.set_state(2, 8, 8, 0, 412, 100)  # the loop lagging
        s.sendall(_post("/v1/x", b"1"))
        assert b"412 ms behind" in _read_answer(s, buf)[1]
        gate.set_state(
            0, 0, 8, 0, 0, 100
        )  # admits again: the same connection relays (the bodies were skipped)
        s.sendall(_post("/v1/after", b"ok"))
        assert json.loads(_read_answer(s, buf)[1]) == {
            "method": "POST",
            "path": "/v1/after",
            "n": 2,
            "head": "ok",
        }
        gate.set_state(0, 0, 8, 0, 0, 0)  # no relay room: refused by the gate's own bound
        s.sendall(_post("/v1/bound", b""))
        assert (
            b"Too many requests in flight at the REST front: 0 at its limit of 0" in _read_answer(s, buf)[1]
        )
        assert gate.take_refused() == (1, 1, 1)
        assert gate.take_refused() == (0, 0, 0)
        # Connection: close: refused, then closed
        gate.set_state(1, 8, 8, 0, 0, 100)
        s.sendall(_post("/v1/x", b"", "Connection: close\r\n"))
        head, _ = _read_answer(s, buf)
        assert b"\r\nconnection: close\r\n" in head
        assert s.recv(10) == b""


def test_requests_on_their_way_to_admission_fill_its_room() -> None:
    """A ``/v1/`` request relayed counts as on its way to admission until the server reports it judged (``seen``,
    which the gateway's Shedder calls); while admission's holdings plus those fill its room (its limit plus its queue
    room, the state's last number) the gate refuses, as admission would on their arrival. Once nothing relayed is
    unanswered, nothing counts as on its way, reported or not."""

    def until_unseen(gate: Any, n: int) -> None:
        end = time.monotonic() + _T
        while gate.unseen != n:
            assert time.monotonic() < end, gate.unseen
            time.sleep(0.01)

    with _echo_server() as up, _gate(up) as gate, _connect(gate) as b:
        buf = bytearray()
        gate.set_state(0, 1, 2, 1, 0, 100, 3)  # admission holds 1 + 1 of its room of 3
        with _connect(gate) as a:
            a.sendall(_post("/v1/wait", b""))  # relayed; the echo server never reports it
            until_unseen(gate, 1)
            b.sendall(_post("/v1/x", b""))
            head, body = _read_answer(b, buf)
            assert head.startswith(b"HTTP/1.1 429 "), head
            assert json.loads(body) == {
                "error": "Too many requests in flight: 1 at the concurrency limit of 2 (max_in_flight=8), 1 "
                "waiting (admission.max_queue) and 1 on their way; retry later"
            }
            assert gate.take_refused() == (0, 0, 1)  # counted as the gate's own (rest_gate)
            b.sendall(_post("/healthz", b""))  # other paths are never refused
            assert json.loads(_read_answer(b, buf)[1])["path"] == "/healthz"
        until_unseen(gate, 0)  # its client went away: nothing relayed is unanswered, so nothing is on its way
        b.sendall(_post("/v1/x", b"1"))
        assert json.loads(_read_answer(b, buf)[1])["path"] == "/v1/x"
        with _connect(gate) as c:
            c.sendall(_post("/v1/wait", b""))
            until_unseen(gate, 1)
            gate.seen()  # the server judged it: room again
            gate.seen()  # more reports than requests relayed (a tunnelled one): never below 0
            assert gate.unseen == 0
            b.sendall(_post("/v1/y", b""))
            assert json.loads(_read_answer(b, buf)[1])["path"] == "/v1/y"


def test_what_it_does_not_judge_is_tunnelled_to_the_server() -> None:
    with _echo_server() as up, _gate(up) as gate:
        gate.set_state(1, 8, 8, 0, 0, 100)  # refusing: a tunnelled request still reaches the server
        with _connect(gate) as s:
            buf = bytearray()
            s.sendall(
                b"POST /v1/chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            )
            assert json.loads(_read_answer(s, buf)[1]) == {
                "method": "POST",
                "path": "/v1/chunked",
                "n": 5,
                "head": "abcde",
            }
            s.sendall(_post("/v1/next", b""))  # the connection stays a tunnel: the server answers
            assert json.loads(_read_answer(s, buf)[1])["path"] == "/v1/next"
        gate.set_state(0, 0, 8, 0, 0, 100)
        with _connect(gate) as s:
            buf = bytearray()
            s.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")  # a chunked answer: tunnelled too
            head, body = _read_answer(s, buf)
            assert b"transfer-encoding: chunked" in head.lower() and b"part1," in body and b"part2" in body
        with _connect(gate) as s:  # a head split across writes goes to the server as it comes
            buf = bytearray()
            s.sendall(b"POST /v1/split HTTP/1.1\r\nHost: x\r\n")
            time.sleep(0.05)
            s.sendall(b"Content-Length: 2\r\n\r\nhi")
            assert json.loads(_read_answer(s, buf)[1])["head"] == "hi"
        with _connect(gate) as s:  # Expect: 100-continue: the server's interim answer comes through
            buf = bytearray()
            s.sendall(
                b"POST /v1/expect HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
            )
            s.sendall(b"abc")
            head, body = _read_answer(s, buf)
            if head.startswith(b"HTTP/1.1 100"):
                head, body = _read_answer(s, buf)
            assert json.loads(body)["head"] == "abc"


def test_a_client_that_goes_away_abandons_its_request_and_slow_senders_hold_no_slot() -> None:
    with _echo_server() as up, _gate(up, capacity=1) as gate:
        _ABANDONED.clear()
        with _connect(gate) as s:
            s.sendall(_post("/wait", b"{}"))
            end = time.monotonic() + _T
            while gate.relayed != 1:  # its body is up: it holds the one relay slot
                assert time.monotonic() < end
                time.sleep(0.01)
        assert _ABANDONED.wait(_T), "the server never saw the client go away"
        end = time.monotonic() + _T
        while gate.relayed != 0:
            assert time.monotonic() < end
            time.sleep(0.01)
        # a client trickling its body holds no slot: another one is relayed meanwhile
        with _connect(gate) as slow, _connect(gate) as other:
            slow.sendall(_post("/v1/slow", b"0123456789")[:-5])
            time.sleep(0.1)
            buf = bytearray()
            other.sendall(_post("/v1/other", b"x"))
            assert json.loads(_read_answer(other, buf)[1])["path"] == "/v1/other"
            slow.sendall(b"56789")
            assert json.loads(_read_answer(slow, bytearray())[1]) == {
                "method": "POST",
                "path": "/v1/slow",
                "n": 10,
                "head": "0123456789",
            }
        assert gate.take_refused() == (0, 0, 0)


def test_without_the_server_it_answers_503_and_closes() -> None:
    with tempfile.TemporaryDirectory() as tmp, _gate(f"{tmp}/nobody.sock") as gate, _connect(gate) as s:
        s.sendall(_post("/v1/x", b"1"))
        buf = bytearray()
        head, body = _read_answer(s, buf)
        assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), head
        assert b"not reachable" in body
        assert s.recv(10) == b""


def test_a_gateway_with_rest_front_gate_relays_and_refuses(tmp_path: Path) -> None:
    from tests.gateway.fake_backend import fake_backend
    from tests.support.gateway import run_gateway

    with fake_backend() as backend:
        cfg = tmp_path / "gateway.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "models": [{"kind": "passthrough", "name": "m", "target": backend.target}],
                    "rest_front": "gate",
                    "max_in_flight": 1,
                    "admission": {"adaptive": False, "queue_timeout_s": 0},
                }
            )
        )
        with run_gateway(cfg, ready_timeout=60) as gw:
            url = f"{gw.url}/v1/models/m:predict"
            body = json.dumps({"instances": [[1.0, 2.0, 3.0, 4.0]]})
            backend.hold_metadata = True
            held = threading.Thread(
                target=lambda: httpx.post(url, content=body, timeout=_T), daemon=True
            )  # takes the one slot and holds it at the backend
            held.start()
            assert backend.metadata_started.wait(_T)
            with httpx.Client(timeout=_T) as c:
                refused = c.post(url, content=body)
                assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
                assert (
                    "Too many requests in flight: 1 at the concurrency limit of 1" in refused.json()["error"]
                )
                assert "x-request-id" not in refused.headers  # written before any middleware
                assert c.get(f"{gw.url}/healthz").status_code == 200  # relayed while refusing
                backend.release.set()
                held.join(_T)
                ok = c.post(url, content=body)
                assert ok.status_code == 200 and ok.json() == {"predictions": [1.0]}, ok.text
                bad = c.post(url, content=b'{"instances": [1,')
                assert bad.status_code == 400 and "error" in bad.json()
                text = c.get(f"{gw.url}/metrics").text
            assert 'embedgate_admission_shed_total{reason="queue_full"} 1.0' in text
            assert '"msg": "rest started", "rest_front": "gate"' in gw.log_path.read_text()

"""Error texts cost linear time and stay bounded (issue 21 item 2).

Unit tests of :func:`gateway.errors.clip` and :func:`gateway.errors.public_message` (cut, addresses hidden across the
cut), and the whole error path on 1 MB pathological strings (public_message, the scrubber itself, REST through
TestClient, gRPC through the in-process front) in a subprocess with a generous timeout: the quadratic regex this
replaces needed about 32 s for 100 KB, i.e. hours for 1 MB, so the timeout only catches a catastrophe.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.errors import CLIENT_TEXT_CHARS, MAX_MESSAGE_CHARS, clip, public_message

_REPO = Path(__file__).resolve().parents[2]
_GENEROUS_TIMEOUT_S = 600  # linear: about a second here; the old regex: hours


def test_clip_keeps_short_texts_and_cuts_long_ones_with_their_length() -> None:
    assert clip("") == ""
    assert clip("a" * CLIENT_TEXT_CHARS) == "a" * CLIENT_TEXT_CHARS
    long = "b" * (CLIENT_TEXT_CHARS + 1)
    assert clip(long) == "b" * CLIENT_TEXT_CHARS + f"... ({CLIENT_TEXT_CHARS + 1} chars)"
    assert clip("xyz" * 10, limit=4) == "xyzx... (30 chars)"


def test_long_messages_are_cut_with_the_original_length() -> None:
    message = "Serving signature name: " + "a" * 40_000
    out = public_message(message)
    assert out.endswith(f"... (message cut: {len(message)} chars)")
    assert out.startswith("Serving signature name:") and len(out) <= MAX_MESSAGE_CHARS + 64
    assert public_message("x" * MAX_MESSAGE_CHARS) == "x" * MAX_MESSAGE_CHARS  # at the bound: unchanged


@pytest.mark.parametrize("shift", range(-20, 21, 4))
def test_an_address_across_the_cut_is_not_left_half_visible(shift: int) -> None:
    address = "ipv4:10.123.45.67:8500"
    pad = "word " * (MAX_MESSAGE_CHARS // 5)
    message = pad[: MAX_MESSAGE_CHARS + shift - len(address) // 2] + address + " and more" * 100
    out = public_message(message, ["ps-0:8500"])
    assert "10.123" not in out and "45.67" not in out and ".67:8500" not in out


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("peer dns:///serving.ns.svc:8500 refused", "peer <backend> refused"),
        ("[::1]:8500 and ipv6:[fe80::1%eth0]:8500", "<backend> and <backend>"),
        ("at 10.0.0.1. then (10.0.0.2:80)", "at <backend>. then (<backend>)"),
        ("unix-abstract:tfs-socket gone", "<backend> gone"),
        ("version 1.2.3 and v1.2 and a.b and key:1", "version 1.2.3 and v1.2 and a.b and key:1"),
        ("list [2] and [1, 2] and a.b.c", "list [2] and [1, 2] and a.b.c"),
    ],
)
def test_address_forms(message: str, expected: str) -> None:
    assert public_message(message, ["ps-0:8500"]) == expected


_PATHOLOGICAL = r"""
import json, sys
from typing import Any
import grpc
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.errors import MAX_MESSAGE_CHARS, _scrub, public_message
from schemas.gateway_settings import GatewaySettings
from schemas.proto import tfs_pb2
from tests.gateway.fake_backend import fake_backend
from tests.support.ports import free_port

MB = 1 << 20
shapes = {
    "dots": "a." * (MB // 2),
    "dotted-quads": "1.1.1.1:1" * (MB // 9),
    "brackets": "[:" * (MB // 2),
    "open-bracket": "[" + "a" * MB,
    "schemes": "ipv4:" * (MB // 5),
    "host-colons": "a.a.a.a:" * (MB // 8),
    "words": "a " * (MB // 2),
}
for name, text in shapes.items():
    out = public_message(text, ["ps-0:8500", "serving-entry:8500"])
    assert len(out) <= MAX_MESSAGE_CHARS + 64, (name, len(out))
    _scrub(text, ["ps-0:8500", "serving-entry:8500"])  # the scrubber alone, over the whole megabyte

evil = shapes["dots"]
with fake_backend() as fb:
    port = free_port()
    settings = GatewaySettings(models=[{"kind": "passthrough", "name": "m", "target": fb.target}], grpc_port=port)
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/models/m:predict", content=json.dumps({"signature_name": evil, "instances": [1.0]}))
        assert r.status_code == 400, r.text
        assert r.json()["error"].startswith(f"signature_name is {len(evil):,} bytes long; at most 4,096"), r.text
        sig = evil[:4000]  # within the bound: echoed, clipped
        r = client.post("/v1/models/m:predict", content=json.dumps({"signature_name": sig, "instances": [1.0]}))
        assert r.json()["error"] == f'Serving signature name: "{sig[:256]}... ({len(sig)} chars)" not found in signature def'
        r = client.post("/v1/models/m:predict", content=json.dumps({"instances": [{evil: 1.0}]}))
        assert r.status_code == 400 and f"({len(evil)} chars)" in r.json()["error"] and len(r.text) < 2000, r.text
        name = evil[:12000]  # the longest model name the request-line bound lets through
        r = client.post(f"/v1/models/{name}:predict", content=b'{"instances": [1.0]}')
        assert r.status_code == 404 and r.json()["error"] == f"Servable not found for request: Latest({name[:256]}... (12000 chars))", r.text
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            def call(method: str, req: Any, resp: Any) -> None:
                stub = channel.unary_unary(
                    f"/tensorflow.serving.PredictionService/{method}",
                    request_serializer=type(req).SerializeToString,
                    response_deserializer=resp.FromString,
                )
                try:
                    stub(req, timeout=60)
                except grpc.RpcError as exc:
                    assert exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), exc
                    sized = (f"({len(evil)} chars)", f"is {len(evil.encode()):,} bytes long")  # echoed clipped / a spec string refused unread
                    assert any(s in exc.details() for s in sized) and len(exc.details()) < 2000, exc.details()[:500]
                else:
                    raise AssertionError(f"{method}: answered")

            for spec, filters in (({"name": evil}, []), ({"name": "m"}, [evil])):
                req = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(**spec), output_filter=filters)
                req.inputs["x"].dtype = tfs_pb2.DataType.DT_FLOAT
                req.inputs["x"].float_val.append(1.0)
                call("Predict", req, tfs_pb2.PredictResponse)
            meta = tfs_pb2.GetModelMetadataRequest(model_spec=tfs_pb2.ModelSpec(name="m"), metadata_field=[evil])
            call("GetModelMetadata", meta, tfs_pb2.GetModelMetadataResponse)
print("ok")
"""


def test_the_error_path_on_1_mb_pathological_strings_is_not_catastrophic() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PATHOLOGICAL],
        cwd=_REPO,
        env={**__import__("os").environ, "PYTHONPATH": str(_REPO)},
        capture_output=True,
        text=True,
        timeout=_GENEROUS_TIMEOUT_S,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]

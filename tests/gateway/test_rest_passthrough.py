"""TF Serving REST behaviour of pass-through models, against serve-local (real SavedModels, real gRPC)."""

from __future__ import annotations

import asyncio
import base64
import json
import math
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration


async def post(gw: httpx.AsyncClient, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await gw.post(path, content=content)


def err(r: httpx.Response) -> str:
    assert r.headers["content-type"] == "application/json"
    doc = r.json()
    assert set(doc) == {"error"}
    return str(doc["error"])


async def test_predict_row_and_columnar(gw: httpx.AsyncClient) -> None:
    r = await post(gw, "/v1/models/half:predict", {"instances": [1.0, 2, 3.5]})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [3.5, 4.0, 4.75]}  # latest = v2 (+3)
    r = await post(gw, "/v1/models/half:predict", {"inputs": [1.0, 2]})
    assert r.json() == {"outputs": [3.5, 4.0]}


async def test_nan_and_infinity_in_and_out(gw: httpx.AsyncClient) -> None:
    r = await post(gw, "/v1/models/half:predict", b'{"instances": [NaN, Infinity, -Inf, -NaN]}')
    assert r.status_code == 200, r.text
    assert b"NaN" in r.content and b"-Infinity" in r.content
    vals = json.loads(r.content)["predictions"]
    assert math.isnan(vals[0]) and vals[1] == math.inf and vals[2] == -math.inf and math.isnan(vals[3])


async def test_versions_and_labels(gw: httpx.AsyncClient) -> None:
    body = {"instances": [2.0]}
    assert (await post(gw, "/v1/models/half/versions/1:predict", body)).json() == {"predictions": [3.0]}
    assert (await post(gw, "/v1/models/half/versions/2:predict", body)).json() == {"predictions": [4.0]}
    assert (await post(gw, "/v1/models/half/labels/stable:predict", body)).json() == {"predictions": [3.0]}
    assert (await post(gw, "/v1/models/half/labels/canary:predict", body)).json() == {"predictions": [4.0]}
    r = await post(gw, "/v1/models/half/labels/nope:predict", body)
    assert r.status_code == 400 and err(r) == "Unrecognized servable version label: nope"
    r = await post(gw, "/v1/models/half/versions/9:predict", body)
    assert r.status_code == 404 and "half" in err(r)
    r = await post(gw, "/v1/models/half/versions/99999999999999999999:predict", body)
    assert r.status_code == 400 and err(r) == "Failed to convert version: 99999999999999999999 to numeric."


async def test_signature_name(gw: httpx.AsyncClient) -> None:
    r = await post(gw, "/v1/models/half:predict", {"signature_name": "double", "instances": [2.0]})
    assert r.json() == {"predictions": [4.0]}
    r = await post(gw, "/v1/models/half:predict", {"signature_name": "nope", "instances": [2.0]})
    assert r.status_code == 400 and err(r) == 'Serving signature name: "nope" not found in signature def'
    r = await post(gw, "/v1/models/half:predict", {"signature_name": 3, "instances": [2.0]})
    assert r.status_code == 400 and "'signature_name' key must be a string value." in err(r)


async def test_multi_input_row_b64_and_bytes_output(gw: httpx.AsyncClient) -> None:
    inst = [
        {"a": [1, 2.5], "n": 3, "s": {"b64": base64.b64encode(b"\x00\xffab").decode()}},
        {"a": [0, 0], "n": -1, "s": "xyz"},
    ]
    r = await post(gw, "/v1/models/multi:predict", {"instances": inst})
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    assert preds[0] == {"sum": 6.5, "len": 4, "s_bytes": {"b64": base64.b64encode(b"\x00\xffab").decode()}}
    assert preds[1] == {"sum": -1.0, "len": 3, "s_bytes": {"b64": base64.b64encode(b"xyz").decode()}}


async def test_multi_input_columnar(gw: httpx.AsyncClient) -> None:
    r = await post(
        gw, "/v1/models/multi:predict", {"inputs": {"a": [[1, 2]], "n": [1], "s": ["q"], "extra": 1}}
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"outputs": {"sum": [4.0], "len": [1], "s_bytes": [{"b64": "cQ=="}]}}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"", 400, "JSON Parse error: The document is empty"),
        (b"{", 400, "JSON Parse error: "),
        (b"[1]", 400, "Is not object"),
        (
            b'{"instances": [1], "inputs": [1]}',
            400,
            "expecting only one of 'inputs' or 'instances' keys to exist",
        ),
        (b'{"foo": 1}', 400, "Missing 'inputs' or 'instances' key"),
        (b'{"instances": 1}', 400, "Expecting 'instances' to be an list/array"),
        (b'{"instances": []}', 400, "No values in 'instances' array"),
        (b'{"instances": [[1, 2], [3]]}', 400, "Expecting tensor size: 2 but got: 1"),
        (b'{"instances": ["a"]}', 400, 'JSON Value: "a" Type: String is not of expected type: float'),
        (
            b'{"inputs": [[1, 2], [3]]}',
            400,
            "Encountered list at unexpected size: 1 at level: 1 expected size: 2",
        ),
        (b'{"instances": [{"x": 1, "z": 2}]}', 400, "does not have named input: z"),
        (b'{"instances": [{"b64": "!!"}]}', 400, "Type: Object is not of expected type: float"),
    ],
)
async def test_bad_input(gw: httpx.AsyncClient, body: bytes, status: int, message: str) -> None:
    r = await post(gw, "/v1/models/half:predict", body)
    assert r.status_code == status
    assert message in err(r)


async def test_multi_bad_input(gw: httpx.AsyncClient) -> None:
    r = await post(gw, "/v1/models/multi:predict", {"instances": [[1, 2]]})
    assert r.status_code == 400 and "instances is a plain list, but expecting list of objects" in err(r)
    r = await post(gw, "/v1/models/multi:predict", {"instances": [{"a": [1, 2], "n": 1}]})
    assert r.status_code == 400 and "keys must be equal to: a,n,s" in err(r)
    r = await post(gw, "/v1/models/multi:predict", {"instances": [{"a": [1, 2], "n": 1.5, "s": "x"}]})
    assert r.status_code == 400 and "Type: Number is not of expected type: int64" in err(r)
    r = await post(gw, "/v1/models/multi:predict", {"instances": [{"a": [1, 2], "n": 2**63, "s": "x"}]})
    assert r.status_code == 400 and "is not of expected type: int64" in err(r)
    r = await post(gw, "/v1/models/multi:predict", {"inputs": {"a": [[1, 2]], "n": [1]}})
    assert r.status_code == 400 and err(r) == "Missing named input: s in 'inputs' object."
    r = await post(
        gw, "/v1/models/multi:predict", {"inputs": {"a": [[1, 2]], "n": [1], "s": [{"b64": "%%"}]}}
    )
    assert r.status_code == 400 and err(r) == "Unable to base64 decode"


async def test_unknown_model_and_malformed_paths(gw: httpx.AsyncClient) -> None:
    r = await post(gw, "/v1/models/nope:predict", {"instances": [1.0]})
    assert r.status_code == 404 and err(r) == "Servable not found for request: Latest(nope)"
    r = await post(gw, "/v1/models/nope/versions/3:predict", {"instances": [1.0]})
    assert r.status_code == 404 and err(r) == "Servable not found for request: Specific(nope, 3)"
    r = await gw.get("/v1/models/nope")
    assert r.status_code == 404 and err(r) == "Could not find any versions of model nope"
    r = await gw.get("/v1/models")
    assert r.status_code == 400 and err(r) == "Missing model name in request."
    r = await post(gw, "/v1/models/half:explode", {"instances": [1.0]})
    assert r.status_code == 400 and err(r) == "Malformed request: POST /v1/models/half:explode"
    r = await gw.put("/v1/models/half:predict", content=b"{}")
    assert r.status_code == 400 and err(r) == "Malformed request: PUT /v1/models/half:predict"
    r = await gw.get("/v1/models/half:predict")
    assert r.status_code == 400 and err(r).startswith("Malformed request: GET")
    r = await post(gw, "/v1/models/half/versions/1/labels/x:predict", {"instances": [1.0]})
    assert r.status_code == 400 and err(r).startswith("Malformed request")


async def test_paths_are_case_insensitive_and_other_paths_404(gw: httpx.AsyncClient) -> None:
    r = await post(gw, "/V1/MODELS/half:predict", {"instances": [2.0]})
    assert r.status_code == 200 and r.json() == {"predictions": [4.0]}
    r = await post(gw, "/v1/models/half:PREDICT", {"instances": [2.0]})
    assert r.status_code == 400 and err(r).startswith("Malformed request")
    r = await post(gw, "/v1/models/half:predict?x=1", {"instances": [2.0]})
    assert r.status_code == 400 and err(r) == "Malformed request: POST /v1/models/half:predict?x=1"
    r = await post(gw, "/v1/models/h%61lf:predict", {"instances": [2.0]})
    assert r.status_code == 200
    assert (await gw.options("/v1/models/half:predict", headers={"origin": "http://x"})).status_code == 200
    assert (await gw.options("/v1/models/half:predict")).status_code == 400
    assert (await gw.get("/v2/models/half")).status_code == 404
    assert (await gw.get("/nothing")).status_code == 404


async def test_status(gw: httpx.AsyncClient) -> None:
    r = await gw.get("/v1/models/half")
    assert r.status_code == 200
    versions = {s["version"]: s for s in r.json()["model_version_status"]}
    assert set(versions) == {"1", "2"}
    assert versions["2"] == {
        "version": "2",
        "state": "AVAILABLE",
        "status": {"error_code": "OK", "error_message": ""},
    }
    r = await gw.get("/v1/models/half/versions/1")
    assert [s["version"] for s in r.json()["model_version_status"]] == ["1"]
    r = await gw.get("/v1/models/half/labels/whatever")  # TF Serving ignores labels on the status path
    assert r.status_code == 200 and len(r.json()["model_version_status"]) == 2
    r = await gw.get("/v1/models/half/versions/5")
    assert r.status_code == 404 and err(r) == "Could not find version 5 of model half"


async def test_metadata(gw: httpx.AsyncClient) -> None:
    r = await gw.get("/v1/models/half/metadata")
    assert r.status_code == 200
    doc = r.json()
    assert doc["model_spec"] == {"name": "half", "version": "2", "signature_name": ""}
    sigs = doc["metadata"]["signature_def"]["signature_def"]
    assert set(sigs) - {"__saved_model_init_op"} == {"serving_default", "double"}  # "lookup" is hidden
    x = sigs["serving_default"]["inputs"]["x"]
    assert x["dtype"] == "DT_FLOAT"
    assert x["tensor_shape"] == {"dim": [{"size": "-1", "name": ""}], "unknown_rank": False}
    r = await gw.get("/v1/models/half/labels/stable/metadata")
    assert r.json()["model_spec"]["version"] == "1"


async def test_backend_name_is_hidden(gw: httpx.AsyncClient) -> None:
    r = await post(gw, "/v1/models/renamed:predict", {"instances": [2.0]})
    assert r.json() == {"predictions": [4.0]}
    r = await post(gw, "/v1/models/renamed/versions/8:predict", {"instances": [2.0]})
    assert r.status_code == 404 and "renamed" in err(r) and "half" not in err(r)
    r = await gw.get("/v1/models/renamed/metadata")
    assert r.json()["model_spec"]["name"] == "renamed"


async def test_classify_and_regress(gw: httpx.AsyncClient) -> None:
    r = await post(gw, "/v1/models/cr:regress", {"examples": [{"x": 1.5}, {"x": [0.5]}]})
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [4.0, 2.0]}
    r = await post(gw, "/v1/models/cr:classify", {"signature_name": "classify", "examples": [{"x": 0.25}]})
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [[["", 0.25], ["", 0.75]]]}
    r = await post(gw, "/v1/models/cr:regress", {"context": {"x": 1.0}, "examples": [{}]})
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [3.0]}
    r = await post(gw, "/v1/models/cr:regress", {"instances": [1]})
    assert r.status_code == 400 and "key 'examples' is expected and was not found" in err(r)
    r = await post(gw, "/v1/models/cr:classify", {"examples": [{"x": 0.25}], "signature_name": "regress"})
    assert r.status_code == 400
    r = await post(gw, "/v1/models/cr:regress", {"examples": [{"x": 0.25}], "signature_name": "upsert_t"})
    assert r.status_code == 404


async def test_tensor_content_responses_decode(tf_models: dict[str, Any]) -> None:
    """serve-local with --enable_serialization_as_tensor_content: outputs arrive in tensor_content."""
    from tests.gateway.conftest import app_client
    from tests.support.servers import serve_local

    with serve_local(
        {"half": tf_models["half"]}, extra_args=["--enable_serialization_as_tensor_content"]
    ) as srv:
        async with app_client(
            models=[{"kind": "passthrough", "name": "half", "target": srv.target}]
        ) as client:
            r = await post(client, "/v1/models/half:predict", {"instances": [1.0, 0.2]})
            assert r.status_code == 200, r.text
            assert r.json() == {"predictions": [3.5, 3.1]}


async def test_deadline_gives_504(make_client: Any) -> None:
    # 400k loop steps take about 3 s in TensorFlow, a step about 1 s less than the deadline on a loaded machine
    async with make_client(request_timeout_s=1.0) as client:
        r = await post(client, "/v1/models/slow:predict", {"instances": [1]})
        assert r.status_code == 200, r.text
        r = await post(client, "/v1/models/slow:predict", {"instances": [400_000]})
        assert r.status_code == 504
        assert err(r)


async def _wait_in_flight(client: httpx.AsyncClient) -> None:
    for _ in range(200):
        if "embedgate_requests_in_flight 1.0" in (await client.get("/metrics")).text:
            return
        await asyncio.sleep(0.005)
    pytest.fail("the slow request never got in flight")


async def test_overload_gives_429_with_retry_after(make_client: Any) -> None:
    async with make_client(max_in_flight=1, retry_after_s=2, request_timeout_s=5) as client:
        slow = asyncio.create_task(post(client, "/v1/models/slow:predict", {"instances": [150_000]}))
        await _wait_in_flight(client)
        r = await post(client, "/v1/models/half:predict", {"instances": [1.0]})
        assert r.status_code == 429
        assert r.headers["retry-after"] == "2"
        assert "max_in_flight" in err(r)
        assert (await slow).status_code in (200, 504)
        r = await post(client, "/v1/models/half:predict", {"instances": [1.0]})
        assert r.status_code == 200


async def test_overload_503_when_configured(make_client: Any) -> None:
    async with make_client(max_in_flight=1, overload_status=503, request_timeout_s=5) as client:
        slow = asyncio.create_task(post(client, "/v1/models/slow:predict", {"instances": [150_000]}))
        await _wait_in_flight(client)
        r = await post(client, "/v1/models/half:predict", {"instances": [1.0]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        await slow


async def test_body_limit_and_gzip(make_client: Any) -> None:
    import gzip

    async with make_client(max_body_bytes=100) as client:
        r = await post(client, "/v1/models/half:predict", {"instances": [1.0] * 100})
        assert r.status_code == 400 and "max_body_bytes" in err(r)
        small = json.dumps({"instances": [1.0]}).encode()
        r = await client.post(
            "/v1/models/half:predict", content=gzip.compress(small), headers={"content-encoding": "gzip"}
        )
        assert r.status_code == 200 and r.json() == {"predictions": [3.5]}
        bomb = gzip.compress(json.dumps({"instances": [1.0] * 1000}).encode())
        assert len(bomb) < 100
        r = await client.post("/v1/models/half:predict", content=bomb, headers={"content-encoding": "gzip"})
        assert r.status_code == 413 and "max_body_bytes" in err(r)


async def test_ops_endpoints_and_metrics(gw: httpx.AsyncClient) -> None:
    assert (await gw.get("/healthz")).status_code == 200
    r = await gw.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"
    r = await post(gw, "/v1/models/half:predict", {"instances": [1.0]})
    assert r.headers["x-request-id"]
    r = await gw.post(
        "/v1/models/half:predict", content=b'{"instances": [1.0]}', headers={"x-request-id": "abc-1"}
    )
    assert r.headers["x-request-id"] == "abc-1"
    await post(gw, "/v1/models/nope:predict", {"instances": [1.0]})
    text = (await gw.get("/metrics")).text
    assert 'embedgate_requests_total{api="predict",model="half",outcome="OK",version="2"} 2.0' in text
    assert 'model="_other",outcome="NOT_FOUND"' in text
    assert "embedgate_request_duration_seconds_bucket" in text
    assert 'embedgate_backend_call_duration_seconds_count{method="Predict"' in text
    assert "healthz" not in text and "readyz" not in text


async def test_readyz_fails_when_a_backend_is_down(passthrough_backend: Any) -> None:
    from tests.gateway.conftest import app_client
    from tests.support.ports import free_port

    models = [
        {"kind": "passthrough", "name": "half", "target": passthrough_backend.target},
        {"kind": "passthrough", "name": "gone", "target": f"127.0.0.1:{free_port()}"},
    ]
    async with app_client(models=models) as client:
        r = await client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["models"]["half"] == "ok" and r.json()["models"]["gone"].startswith("UNAVAILABLE")
        r = await post(client, "/v1/models/gone:predict", {"instances": [1.0]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"


async def test_openapi_docs(gw: httpx.AsyncClient) -> None:
    assert (await gw.get("/docs")).status_code == 200
    spec = (await gw.get("/openapi.json")).json()
    op = spec["paths"]["/v1/models/half:predict"]["post"]  # one operation per model: see test_openapi.py
    assert op["requestBody"]["content"]["application/json"]["examples"]
    assert "/v1/models/half/labels/{label}/metadata" in spec["paths"]

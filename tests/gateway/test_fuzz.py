"""Fuzzing against a real gateway (uvicorn subprocess, serve-local backends, pass-through and embedding models).

* schemathesis generates requests from the gateway's own ``/openapi.json`` (valid and invalid: path parameters,
  bodies, headers) for every documented operation;
* hypothesis sends hostile JSON bodies (lone surrogates, deep nesting, huge numbers, NaN, odd shapes) to every POST
  route of every model.

Bounded: at most ``_EXAMPLES`` cases per operation and generation mode, no hypothesis deadline, no example database.
Asserted for every answer: no 5xx, and every 4xx body is exactly ``{"error": <string>}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import passthrough_models
from tests.gateway.test_rest_embedding import embedding_model
from tests.support.gateway import GatewayProc, run_gateway

pytestmark = pytest.mark.integration

_EXAMPLES = 20  # per operation (x its strategies); derandomized, so every run sends the same requests
_SETTINGS = settings(
    max_examples=_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)


@pytest.fixture(scope="module")
def fuzz_gateway(
    tmp_path_factory: pytest.TempPathFactory,
    passthrough_backend: Any,
    demo_artifacts: Any,
    demo_backends: Any,
) -> Iterator[tuple[GatewayProc, list[str]]]:
    # "slow" sleeps as long as its input says: a fuzzer would only measure request_timeout_s there.
    models = [m for m in passthrough_models(passthrough_backend.target) if m["name"] != "slow"]
    models.append(embedding_model(demo_artifacts, demo_backends.target))
    config = {"models": models, "request_timeout_s": 20, "log": {"access": False}}
    path = tmp_path_factory.mktemp("fuzz") / "gateway.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    with run_gateway(path) as gw:
        yield gw, [m["name"] for m in models]


def _check(r: httpx.Response, what: str) -> None:
    assert r.status_code < 500, f"{what}: {r.status_code} {r.text[:500]}"
    if r.status_code >= 400:
        assert r.headers.get("content-type") == "application/json", f"{what}: {r.status_code} {r.text[:300]}"
        doc = r.json()
        assert isinstance(doc, dict) and set(doc) == {"error"} and isinstance(doc["error"], str), (what, doc)


# ---- schemathesis -------------------------------------------------------------------------------------------------


def _operations(gw: GatewayProc) -> list[Any]:
    import schemathesis

    raw = httpx.get(f"{gw.url}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(raw)
    return [op.ok() for op in schema.get_all_operations()]


def _fuzz_operation(client: httpx.Client, base_url: str, label: str, strategies: list[Any]) -> None:
    @_SETTINGS
    @given(case=st.one_of(strategies))
    def run(case: Any) -> None:
        kwargs = case.as_transport_kwargs(base_url=base_url)
        kwargs.pop("cookies", None)
        kwargs["headers"] = {k: v for k, v in (kwargs.get("headers") or {}).items() if k != "Connection"}
        payload = kwargs.pop("json", None)
        if payload is not None:
            kwargs["content"] = json.dumps(payload).encode()
        data = kwargs.pop("data", None)
        if isinstance(data, bytes | str):
            kwargs["content"] = data
        elif data is not None:
            kwargs["data"] = data
        try:
            r = client.request(**kwargs)
        except (httpx.InvalidURL, httpx.LocalProtocolError, UnicodeEncodeError):
            return  # the client cannot even send this case
        _check(r, f"{label} {kwargs['method']} {kwargs['url']!r}"[:400])

    run()


def test_schemathesis_every_operation(fuzz_gateway: tuple[GatewayProc, list[str]]) -> None:
    from schemathesis import GenerationMode

    gw, names = fuzz_gateway
    ops = _operations(gw)
    assert len(ops) >= 15, [op.label for op in ops]
    with httpx.Client(timeout=60) as client:
        for op in ops:
            strategies = [
                op.as_strategy(generation_mode=m) for m in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
            ]
            if any(p.name == "model_name" for p in op.iter_parameters()):
                strategies.extend(op.as_strategy(path_parameters={"model_name": n}) for n in names)
            _fuzz_operation(client, gw.url, op.label, strategies)


# ---- hostile bodies -----------------------------------------------------------------------------------------------

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=8),
    st.sampled_from(["\ud800", "\udc00x", "a\udfff", {"b64": "AAAA"}, {"b64": "!!"}]),
)
_json = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["a", "x", "b64", "ids"]), inner)
    ),
    max_leaves=30,
)


@st.composite
def _body(draw: Any, features: list[str]) -> bytes:
    kind = draw(st.sampled_from(["instances", "inputs", "examples", "raw", "deep", "features"]))
    if kind == "raw":
        return draw(st.binary(max_size=64))
    if kind == "deep":
        depth = draw(st.integers(min_value=1, max_value=3000))
        key = draw(st.sampled_from(["instances", "inputs", "examples"]))
        return ('{"' + key + '": ' + "[" * depth + "1" + "]" * depth + "}").encode()
    if kind == "features":
        inst = draw(
            st.lists(st.dictionaries(st.sampled_from(features), _json, max_size=len(features)), max_size=3)
        )
        value: Any = {"instances": inst}
    else:
        value = {kind: draw(_json)}
    if draw(st.booleans()):
        value["signature_name"] = draw(_json)
    return json.dumps(value, allow_nan=True).encode()  # lone surrogates become \udXXX escapes


@pytest.mark.parametrize("verb", ["predict", "classify", "regress"])
def test_hostile_bodies_on_every_post_route(
    fuzz_gateway: tuple[GatewayProc, list[str]], demo_artifacts: Any, verb: str
) -> None:
    gw, names = fuzz_gateway
    man = demo_artifacts.manifest
    features = [f.name for f in man.sparse_features] + [f.weights for f in man.sparse_features if f.weights]
    features += [f.name for f in man.dense_features] + ["x", "y"]
    with httpx.Client(base_url=gw.url, timeout=60) as client:

        @_SETTINGS
        @given(name=st.sampled_from(names), body=_body(features), suffix=st.sampled_from(["", "/versions/1"]))
        def run(name: str, body: bytes, suffix: str) -> None:
            path = f"/v1/models/{name}{suffix}:{verb}"
            _check(client.post(path, content=body), f"{path} {body[:200]!r}")

        run()

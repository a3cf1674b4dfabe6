"""Public names of the gateway modules (a change here is an API change for the other teams)."""

from __future__ import annotations

import importlib

import pytest

SURFACE = {
    "gateway.app": ["create_app"],
    "gateway.core": [
        "ClassifyRequest",
        "ClassifyResult",
        "EmbeddingServable",
        "Gateway",
        "Inputs",
        "MetadataCache",
        "MetadataRequest",
        "MetadataResult",
        "PassthroughServable",
        "PredictRequest",
        "PredictResult",
        "RegressRequest",
        "RegressResult",
        "Request",
        "Servable",
        "StatusRequest",
        "VersionSpec",
        "is_hidden_signature",
    ],
    "gateway.grpc_front": ["GrpcFront", "TensorInputs", "batch_from_tensors", "generic_handlers"],
    "gateway.backends": [
        "BackendClient",
        "CallObserver",
        "ReplicaSet",
        "error_from_rpc",
        "map_grpc_errors",
        "open_channel",
    ],
    "gateway.codec.tensor": ["NP_DTYPES", "dtype_for", "from_ndarray", "to_ndarray"],
    "gateway.lifespan": ["Call", "InFlightLimiter", "Runtime", "lifespan"],
    "schemas.gateway_settings": [
        "AdmissionSettings",
        "AuthSettings",
        "GatewaySettings",
        "GrpcSettings",
        "LimitsSettings",
        "LogSettings",
        "is_loopback",
        "load_settings",
    ],
    "gateway.admission": [
        "JUDGED",
        "PENDING",
        "Admission",
        "GradientLimit",
        "Pending",
        "Phase",
        "ShedMiddleware",
        "Shedder",
        "settle",
    ],
    "gateway.auth": ["Authenticator", "TokenEntry", "exposure_problem", "parse_tokens"],
    "gateway.readiness": ["PROBE_TIMEOUT_S", "Readiness", "poll_readiness"],
    "gateway.limits": [
        "RATIO_FLOOR",
        "BufferedBytes",
        "ParsePool",
        "check_structure",
        "current_limits",
        "inflate",
        "json_depth",
        "offload",
        "parse_document",
        "parse_json",
        "parse_pool",
        "plain_scope",
        "read_body",
        "release_memory",
        "release_memory_soon",
        "request_scope",
    ],
    "gateway.servers": [
        "RestFront",
        "limit_options",
        "loop_factory",
        "rest_gate_unavailable",
        "run",
        "serve",
    ],
    "tests.support.gateway": ["GatewayProc", "run_gateway", "serve_exported"],
}


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_all_is_pinned(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(SURFACE[module])
    for name in mod.__all__:
        assert hasattr(mod, name), name


def test_json_tensor_exports_exist() -> None:
    mod = importlib.import_module("gateway.codec.json_tensor")
    for name in mod.__all__:
        assert hasattr(mod, name), name

"""Gateway test fixtures: small real SavedModels served by serve-local, and the gateway app in process.

``passthrough_backend`` serves half (versions 1 and 2), multi, slow and cr from one serve-local process.
``gateway_client`` is an httpx.AsyncClient on the ASGI app with its lifespan running (channels open).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.models import build_models


@pytest.fixture(scope="session")
def tf_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_models(tmp_path_factory.mktemp("gw_models"))


@pytest.fixture(scope="session")
def passthrough_backend(
    tf_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    from tests.support.servers import serve_local

    parts = []
    for name, base in tf_models.items():
        policy = "    model_version_policy { all {} }\n" if name == "half" else ""
        parts.append(
            f'  config {{\n    name: "{name}"\n    base_path: "{base}"\n    model_platform: "tensorflow"\n'
            f"{policy}  }}\n"
        )
    config = tmp_path_factory.mktemp("gw_cfg") / "models.config"
    config.write_text("model_config_list {\n" + "".join(parts) + "}\n", encoding="utf-8")
    with serve_local(config) as server:
        yield server


def passthrough_models(target: str) -> list[dict[str, Any]]:
    return [
        {
            "kind": "passthrough",
            "name": "half",
            "target": target,
            "version_labels": {"stable": 1, "canary": 2},
        },
        {"kind": "passthrough", "name": "multi", "target": target},
        {"kind": "passthrough", "name": "slow", "target": target},
        {"kind": "passthrough", "name": "cr", "target": target},
        {"kind": "passthrough", "name": "renamed", "target": target, "backend_name": "half"},
    ]


@asynccontextmanager
async def app_and_client(**settings: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """A fresh app built from ``settings`` (lifespan entered and left) and an AsyncClient on it."""
    from gateway.app import create_app
    from schemas.gateway_settings import GatewaySettings

    app = create_app(GatewaySettings(**settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield app, client


@asynccontextmanager
async def app_client(**settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An AsyncClient on a fresh app built from ``settings`` (lifespan entered and left)."""
    async with app_and_client(**settings) as (_, client):
        yield client


@pytest.fixture
def make_client(passthrough_backend: Any) -> Callable[..., Any]:
    def make(**overrides: Any) -> Any:
        settings: dict[str, Any] = {"models": passthrough_models(passthrough_backend.target), **overrides}
        return app_client(**settings)

    return make


@pytest.fixture
async def gw(make_client: Callable[..., Any]) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client() as client:
        yield client

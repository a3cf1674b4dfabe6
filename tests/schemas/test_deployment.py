"""Deployment entries: targets and served names."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from schemas.deployment import DeployedModel, EmbeddingModel

_adapter: TypeAdapter[object] = TypeAdapter(DeployedModel)


def test_embedding_model_served_names() -> None:
    m = _adapter.validate_python(
        {
            "kind": "embedding",
            "name": "demo",
            "manifest": "models/demo",
            "entry": "127.0.0.1:8500",
            "shards": [{"replicas": ["127.0.0.1:8500"]}, {"replicas": ["127.0.0.1:8500", "127.0.0.1:8600"]}],
        }
    )
    assert isinstance(m, EmbeddingModel)
    assert m.served_entry_name == "demo_entry"
    assert m.served_ps_name(1) == "demo_ps_1"


@pytest.mark.parametrize("target", ["localhost", "127.0.0.1:", "http://x:1", "a b:1"])
def test_bad_targets_rejected(target: str) -> None:
    with pytest.raises(ValidationError, match="target"):
        _adapter.validate_python({"kind": "passthrough", "name": "m", "target": target})

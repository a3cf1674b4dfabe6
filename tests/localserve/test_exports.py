"""Every name in each localserve module's ``__all__`` exists (the public surface is deliberate)."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "cli",
    "errors",
    "manager",
    "model_config",
    "policy",
    "servable",
    "server",
    "service",
    "source",
    "tensors",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(f"embedgate.localserve.{name}")
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == []


def test_cli_module_is_import_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, embedgate.localserve.cli; "
        "print(any(m.startswith(('tensorflow', 'grpc')) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"

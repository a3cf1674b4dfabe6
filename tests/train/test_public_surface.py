"""embedgate.train's public names are pinned; the publisher side imports no TensorFlow (a PyTorch trainer uses it)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

SURFACE = {
    "embedgate.train": {
        "ModelMismatchError",
        "PublishError",
        "PublisherState",
        "PublisherStats",
        "RowPublisher",
        "StreamRows",
        "TrainerMetrics",
        "changed_rows",
        "export_with_cut",
        "refresh_entry",
    },
    "embedgate.train.publisher": {"PublishError", "PublisherState", "PublisherStats", "RowPublisher"},
    "embedgate.train.diff": {"changed_rows"},
    "embedgate.train.binding": {"ModelMismatchError", "TableBinding", "bind_model"},
    "embedgate.train.callback": {"StreamRows"},
    "embedgate.train.export": {"export_with_cut", "refresh_entry"},
    "embedgate.train.metrics": {"TrainerMetrics"},
    "embedgate.train.demo": {"drifting_examples", "main"},
    "embedgate.export.entry_refresh": {"export_entry"},
}


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_public_names(module: str) -> None:
    mod = importlib.import_module(module)
    assert set(mod.__all__) == SURFACE[module]
    for name in mod.__all__:
        assert getattr(mod, name) is not None


def test_publisher_side_imports_no_tensorflow() -> None:
    code = (
        "import sys, embedgate.train as t; t.RowPublisher; t.changed_rows; t.TrainerMetrics;"
        "sys.exit(1 if 'tensorflow' in sys.modules or 'keras' in sys.modules else 0)"
    )
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=root, check=False, timeout=120).returncode == 0

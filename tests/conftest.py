"""Session fixtures shared by every test package: a small exported demo model and serve-local serving it."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def demo_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The small demo model (entry + 2 PS shards + manifest + whole Keras model), built once per session."""
    from embedgate.export.demo import build_demo

    return build_demo(tmp_path_factory.mktemp("demo"), small=True)


@pytest.fixture(scope="session")
def demo_backends(demo_artifacts: Any) -> Iterator[Any]:
    """serve-local serving demo_entry, demo_ps_0 and demo_ps_1 from the small demo's artifacts."""
    from schemas.manifest import entry_model_name, ps_dir_name, ps_model_name
    from tests.support.servers import serve_local

    model_dir: Path = demo_artifacts.model_dir
    name = demo_artifacts.manifest.model_name
    models = {entry_model_name(name): model_dir / "entry"}
    for i in range(demo_artifacts.manifest.num_shards):
        models[ps_model_name(name, i)] = model_dir / ps_dir_name(i)
    with serve_local(models) as server:
        yield server


@pytest.fixture(autouse=True)
def _process_globals_restored() -> Iterator[None]:
    """A gateway started in this process (its gRPC front) freezes the garbage collector's heap and shortens the
    interpreter's switch interval, for the process's lifetime. Undone after each test, so that the tests after it
    run with the collector and the switch interval they would have had alone (a frozen heap makes later full
    collections far more frequent, which moves when another test's garbage is collected)."""
    switch = sys.getswitchinterval()
    yield
    if gc.get_freeze_count():
        gc.unfreeze()
    sys.setswitchinterval(switch)

"""Session fixtures shared by every test package: a small exported demo model and serve-local serving it."""

from __future__ import annotations

import functools
import gc
import inspect
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings

# No wall-clock limits in tests (the machines are shared and noisy): hypothesis' per-example deadline is off for
# every test; a test that sets its own settings keeps them.
settings.register_profile("embedgate", deadline=None)
settings.load_profile("embedgate")


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


@functools.cache
def _talks_to_kafka(module: ModuleType) -> bool:
    """Whether a test module starts Kafka clients (its source names Kafka)."""
    return "kafka" in inspect.getsource(module).lower()


def _collect_leaked_kafka_connections(where: str) -> None:
    """A cyclic collection now, so that what the test just finished left unreachable is finalized here and not during
    whichever test runs when the collector next runs. aiokafka sometimes leaves a broker connection of a stopped client
    unclosed (aio-libs/aiokafka#1019); its finalizer warns (ResourceWarning, an error under this suite's filters) from
    inside a later, unrelated test, which then fails at random. Those warnings are logged here; any other exception
    raised by a finalizer goes to pytest's hook as before."""
    hook = sys.unraisablehook
    leaked: list[str] = []

    def keep(u: Any) -> None:
        if isinstance(u.exc_value, ResourceWarning):
            leaked.append(str(u.exc_value))
        else:
            hook(u)

    sys.unraisablehook = keep
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook
    for text in leaked:
        logging.getLogger("tests").info("finalized after %s: %s", where, text)


@pytest.fixture(autouse=True)
def _process_globals_restored(request: pytest.FixtureRequest) -> Iterator[None]:
    """A gateway started in this process (its gRPC front) freezes the garbage collector's heap and shortens the
    interpreter's switch interval, for the process's lifetime. Undone after each test, so that the tests after it
    run with the collector and the switch interval they would have had alone (a frozen heap makes later full
    collections far more frequent, which moves when another test's garbage is collected)."""
    switch = sys.getswitchinterval()
    yield
    froze = gc.get_freeze_count() > 0
    if froze:
        gc.unfreeze()  # first: a frozen object is never collected, so a leak frozen with the heap would outlive the test
    if froze or (request.module is not None and _talks_to_kafka(request.module)):
        _collect_leaked_kafka_connections(request.node.nodeid)
    sys.setswitchinterval(switch)

"""Session fixtures shared by every test package: a small exported demo model and serve-local serving it."""

from __future__ import annotations

import fcntl
import gc
import json
import logging
import os
import pickle
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# No wall-clock limits in tests (the machines are shared and noisy): hypothesis' per-example deadline is off for
# every test; a test that sets its own settings keeps them.
settings.register_profile("embedgate", deadline=None)
settings.load_profile("embedgate")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest test files first, by the seconds per file of a measured run (``tests/module_seconds.json``,
    rewritten by :mod:`tests.support.module_seconds`; a file not listed counts as short). With ``--dist loadfile
    --no-loadscope-reorder`` (``make test``) pytest-xdist hands whole files to its workers in this order, so a run
    ends on short files on both workers rather than on one long file while the other worker waits (its default
    order, the files with the most tests first, put the long integration files last). Within a file the order is
    kept (the sort is stable)."""
    from tests.support.module_seconds import PATH

    try:
        seconds: dict[str, float] = json.loads(PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: -seconds.get(item.nodeid.partition("::")[0], 0.0))


@pytest.fixture(scope="session")
def demo_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The small demo model (entry + 2 PS shards + manifest + whole Keras model), built once per run: under
    pytest-xdist the first worker to need it builds it in the run's directory shared by the workers, holding a lock,
    and the others load what it wrote (tests only read these artifacts; each copies what it changes)."""
    from embedgate.export.demo import build_demo

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return build_demo(tmp_path_factory.mktemp("demo"), small=True)
    shared = tmp_path_factory.getbasetemp().parent  # the run's own directory, above each worker's
    built = shared / "demo.pickle"
    with open(shared / "demo.lock", "wb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built.exists():
            import embedgate.export.layers  # noqa: F401 - registers the whole Keras model's layers, as building does

            return pickle.loads(built.read_bytes())  # noqa: S301 - written just before by this run
        artifacts = build_demo(shared / "demo", small=True)
        built.write_bytes(pickle.dumps(artifacts))
        return artifacts


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


_kafka_connections: weakref.WeakSet[Any] = weakref.WeakSet()
"""The aiokafka broker connections of this process not yet finalized (every producer, consumer and admin client opens
its connections as ``aiokafka.conn.AIOKafkaConnection``): a test's teardown collects garbage only while there is one."""


@pytest.fixture(scope="session", autouse=True)
def _kafka_connections_tracked() -> Iterator[None]:
    from aiokafka.conn import AIOKafkaConnection

    init = AIOKafkaConnection.__init__

    def tracked(self: AIOKafkaConnection, *args: Any, **kwargs: Any) -> None:
        _kafka_connections.add(self)
        init(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AIOKafkaConnection, "__init__", tracked)
        yield


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
    if len(_kafka_connections):  # a full collection costs about a second once TensorFlow is loaded: only then
        _collect_leaked_kafka_connections(request.node.nodeid)
    sys.setswitchinterval(switch)

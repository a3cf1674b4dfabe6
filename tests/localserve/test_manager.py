"""manager.py with a fake loader (the one seam): pins, load-before-unload, failures, labels, status."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from embedgate.localserve.errors import InvalidArgumentError, NotFoundError
from embedgate.localserve.manager import Manager, VersionState
from embedgate.localserve.model_config import ModelEntry, PolicyKind, VersionPolicy


class FakeServable:
    def __init__(self, name: str, version: int, path: Path) -> None:
        self.name, self.version, self.path = name, version, path
        self.closed = False

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


class FakeLoader:
    def __init__(self) -> None:
        self.loaded: list[FakeServable] = []
        self.fail: set[int] = set()
        self.events: list[str] = []

    def __call__(self, name: str, version: int, path: Path) -> FakeServable:
        if version in self.fail:
            raise RuntimeError(f"broken version {version}")
        s = FakeServable(name, version, path)
        self.loaded.append(s)
        self.events.append(f"load {version}")
        return s


def _version(base: Path, v: int) -> None:
    d = base / str(v)
    d.mkdir(parents=True)
    (d / "saved_model.pb").write_bytes(b"")


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Manager, FakeLoader, Path]:
    loader = FakeLoader()
    manager = Manager(loader)
    base = tmp_path / "m"
    _version(base, 1)
    manager.set_models([ModelEntry("m", base, labels={"stable": 1, "next": 2})])
    manager.reconcile()
    return manager, loader, base


def _served(manager: Manager, **kw: object) -> int:
    with manager.handle("m", **kw) as h:  # type: ignore[arg-type]
        return h.version


def test_latest_swap_loads_new_before_retiring_old(setup: tuple[Manager, FakeLoader, Path]) -> None:
    manager, loader, base = setup
    assert _served(manager) == 1
    _version(base, 2)
    manager.reconcile()
    assert _served(manager) == 2
    v1 = loader.loaded[0]
    assert v1.closed
    states = {s.version: s.state for s in manager.status("m")}
    assert states == {2: VersionState.AVAILABLE, 1: VersionState.END}


def test_pinned_version_closes_only_when_released(setup: tuple[Manager, FakeLoader, Path]) -> None:
    manager, loader, base = setup
    with manager.handle("m") as h:
        _version(base, 2)
        manager.reconcile()
        assert h.version == 1 and not h.servable.closed  # type: ignore[attr-defined]
        assert manager.status("m", 1)[0].state is VersionState.UNLOADING
        assert _served(manager) == 2
    assert loader.loaded[0].closed
    assert manager.status("m", 1)[0].state is VersionState.END


def test_removed_version_is_unloaded_and_older_one_returns(setup: tuple[Manager, FakeLoader, Path]) -> None:
    manager, loader, base = setup
    _version(base, 2)
    manager.reconcile()
    shutil.rmtree(base / "2")
    manager.reconcile()
    assert _served(manager) == 1
    assert loader.events == ["load 1", "load 2", "load 1"]
    assert [s.closed for s in loader.loaded] == [True, True, False]


def test_failed_load_keeps_old_version_and_is_not_retried(setup: tuple[Manager, FakeLoader, Path]) -> None:
    manager, loader, base = setup
    loader.fail.add(2)
    _version(base, 2)
    manager.reconcile()
    manager.reconcile()
    assert _served(manager) == 1
    (failed,) = manager.status("m", 2)
    assert failed.state is VersionState.END and "broken version 2" in failed.error
    assert loader.events == ["load 1"]


def test_specific_version_and_labels(setup: tuple[Manager, FakeLoader, Path]) -> None:
    manager, _, base = setup
    manager.set_models(
        [ModelEntry("m", base, VersionPolicy(PolicyKind.ALL), labels={"stable": 1, "next": 3})]
    )
    _version(base, 2)
    manager.reconcile()
    assert _served(manager) == 2
    assert _served(manager, version=1) == 1
    assert _served(manager, label="stable") == 1
    with pytest.raises(NotFoundError, match=r"^Servable not found for request: Specific\(m, 7\)$"):
        _served(manager, version=7)
    with pytest.raises(NotFoundError, match=r"Specific\(m, 3\)"):
        _served(manager, label="next")  # label of a version that is not loaded
    with pytest.raises(InvalidArgumentError, match="^Unrecognized servable version label: nope$"):
        _served(manager, label="nope")


def test_unknown_model(setup: tuple[Manager, FakeLoader, Path]) -> None:
    manager, _, _ = setup
    with (
        pytest.raises(NotFoundError, match=r"^Servable not found for request: Latest\(x\)$"),
        manager.handle("x"),
    ):
        pass
    with pytest.raises(NotFoundError, match="^Could not find any versions of model x$"):
        manager.status("x")
    with pytest.raises(NotFoundError, match="^Could not find version 9 of model m$"):
        manager.status("m", 9)


def test_config_change_unloads_removed_model(setup: tuple[Manager, FakeLoader, Path], tmp_path: Path) -> None:
    manager, loader, _ = setup
    other = tmp_path / "o"
    _version(other, 5)
    manager.set_models([ModelEntry("o", other)])
    manager.reconcile()
    assert manager.model_names() == ["o"]
    assert loader.loaded[0].closed
    with manager.handle("o") as h:
        assert h.version == 5


def test_concurrent_handles_during_swaps(setup: tuple[Manager, FakeLoader, Path]) -> None:
    manager, loader, base = setup
    stop = threading.Event()
    errors: list[BaseException] = []

    def worker() -> None:
        while not stop.is_set():
            try:
                with manager.handle("m") as h:
                    assert not h.servable.closed  # type: ignore[attr-defined]
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                return

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for v in range(2, 12):
        _version(base, v)
        manager.reconcile()
    stop.set()
    for t in threads:
        t.join(10)
    assert errors == []
    assert _served(manager) == 11
    assert sum(not s.closed for s in loader.loaded) == 1

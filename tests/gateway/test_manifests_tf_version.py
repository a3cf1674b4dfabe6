"""gateway.core.manifests.ManifestStore reports the TensorFlow a model was exported with (``Manifest.tensorflow_version``):
TF Serving's API reports no version of its own, so the gateway logs the recorded one at startup and warns when a newly
published version was exported with another TensorFlow than the one before it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.core.manifests import ManifestStore
from schemas.manifest import MANIFEST_FILE, Manifest
from tests.gateway.test_features_lookups import _manifest


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    logger = logging.getLogger("embedgate.gateway")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _publish(d: Path, version: int, tf_version: str | None) -> None:
    m = _manifest().model_copy(update={"version": version, "tensorflow_version": tf_version})
    tmp = d / "manifest.tmp"
    tmp.write_text(m.dumps())
    tmp.replace(d / MANIFEST_FILE)


def _tf(records: list[logging.LogRecord]) -> list[tuple[int, int, str | None, str | None]]:
    return [
        (r.levelno, r.version, r.tensorflow_version, getattr(r, "previous_tensorflow_version", None))  # type: ignore[attr-defined]
        for r in records
        if hasattr(r, "tensorflow_version")
    ]


def test_the_recorded_tensorflow_is_logged_and_a_change_is_a_warning(
    tmp_path: Path, records: list[logging.LogRecord]
) -> None:
    _publish(tmp_path, 1, "2.21.0")
    store = ManifestStore("m", Manifest.load(tmp_path), tmp_path / MANIFEST_FILE)
    assert _tf(records) == [(logging.INFO, 1, "2.21.0", None)]
    _publish(tmp_path, 2, "2.21.0")
    assert store.poll()
    assert len(_tf(records)) == 1  # same TensorFlow: nothing to say
    _publish(tmp_path, 3, "2.22.0")
    assert store.poll()
    assert _tf(records)[1:] == [(logging.WARNING, 3, "2.22.0", "2.21.0")]
    assert "TF Serving does not report its version" in records[-2].getMessage()


def test_a_manifest_without_the_field_is_logged_as_not_recorded(
    tmp_path: Path, records: list[logging.LogRecord]
) -> None:
    _publish(tmp_path, 1, None)
    ManifestStore("m", Manifest.load(tmp_path), tmp_path / MANIFEST_FILE)
    assert _tf(records) == [(logging.INFO, 1, None, None)]

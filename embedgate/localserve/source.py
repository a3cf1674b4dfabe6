"""The filesystem source: complete numeric version directories under a model's base path.

Like TF Serving's ``FileSystemStoragePathSource``, child directories whose name parses as a non-negative integer are
versions (``007`` is 7); others are ignored. A version directory is complete (and reported) only once it holds
``saved_model.pb`` or ``saved_model.pbtxt``; exporters write into a temp dir and rename, so that is the whole model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["Poller", "scan_versions"]

_log = logging.getLogger(__name__)
_MARKERS = ("saved_model.pb", "saved_model.pbtxt")


def scan_versions(base_path: Path) -> dict[int, Path]:
    """Complete version dirs under ``base_path`` (version -> dir); empty when the base path is missing."""
    found: dict[int, Path] = {}
    try:
        children = list(base_path.iterdir())
    except OSError:
        return found
    for child in children:
        name = child.name
        if not name.isdigit() or not name.isascii():
            continue
        if not child.is_dir() or not any((child / m).is_file() for m in _MARKERS):
            continue
        version = int(name)
        if version in found and child.name > found[version].name:  # "7" and "007": keep the smaller name
            continue
        found[version] = child
    return found


class Poller:
    """Calls ``tick()`` every ``interval`` seconds on a daemon thread until :meth:`stop`.

    ``interval <= 0`` means never (TF Serving: 0 = once at startup, which the caller does itself). Exceptions from
    ``tick`` are logged and the loop continues; the next tick retries.
    """

    def __init__(self, name: str, interval: float, tick: Callable[[], None]) -> None:
        self._interval = interval
        self._tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        if self._interval > 0:
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - a poll failure must not kill the server; logged, retried next tick
                _log.exception("%s: poll failed", self._thread.name)

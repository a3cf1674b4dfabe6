"""From a training loop to the served model: stream the rows training changes, refresh the dense weights.

* :class:`RowPublisher` — synchronous, thread-backed, bounded publisher of embedding rows (any training loop);
* :func:`changed_rows` — which rows of a table changed, bit for bit (numpy; any framework);
* :class:`StreamRows` — a Keras callback publishing exactly the rows that changed, for every table of the manifest;
* :func:`export_with_cut` / :func:`refresh_entry` — exports a trainer makes: with the stream cut, or entry only.

``RowPublisher`` and ``changed_rows`` import no TensorFlow; ``StreamRows`` and the export helpers import Keras when
first used. See docs/training.md.
"""

from __future__ import annotations

from typing import Any

from embedgate.train.diff import changed_rows
from embedgate.train.metrics import TrainerMetrics
from embedgate.train.publisher import PublishError, PublisherState, PublisherStats, RowPublisher

__all__ = [
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
]

_LAZY = {
    "StreamRows": "embedgate.train.callback",
    "ModelMismatchError": "embedgate.train.binding",
    "export_with_cut": "embedgate.train.export",
    "refresh_entry": "embedgate.train.export",
}


def __getattr__(name: str) -> Any:
    """Keras-side names are imported on first use, so ``RowPublisher`` stays TensorFlow-free."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'embedgate.train' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)

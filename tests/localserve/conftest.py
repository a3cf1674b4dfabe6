"""One serve-local process for the integration tests, serving small SavedModels built here (module docs in
tests/localserve/models.py). Models:

* ``half``        versions 1 and 2, policy ``all``, labels stable -> 1, canary -> 2
* ``half_pinned`` the same base path, policy ``specific { versions: 1 }``
* ``store``       stateful MutableHashTable (insert / lookup)
* ``clf``         TF1 graph with classification / regression / predict signatures
* ``swap``        latest policy; the hot-swap test adds and removes versions
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.localserve.models import write_classifier, write_half_plus, write_stateful
from tests.support.servers import LocalServer, serve_local

_CONFIG = """
model_config_list {{
  config {{
    name: "half" base_path: "{root}/half" model_platform: "tensorflow"
    model_version_policy {{ all {{}} }}
    version_labels {{ key: "stable" value: 1 }}
    version_labels {{ key: "canary" value: 2 }}
  }}
  config {{
    name: "half_pinned" base_path: "{root}/half"
    model_version_policy {{ specific {{ versions: 1 }} }}
  }}
  config {{ name: "store" base_path: "{root}/store" }}
  config {{ name: "clf" base_path: "{root}/clf" }}
  config {{ name: "swap" base_path: "{root}/swap" }}
}}
"""


@pytest.fixture(scope="session")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("localserve-models")
    write_half_plus(root / "half", 1)
    write_half_plus(root / "half", 2)
    write_stateful(root / "store", 1)
    write_classifier(root / "clf", 1)
    write_half_plus(root / "swap", 1, offset=100.0)
    (root / "models.config").write_text(_CONFIG.format(root=root), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def server(model_root: Path) -> Iterator[LocalServer]:
    with serve_local(model_root / "models.config", poll_seconds=0.3) as srv:
        yield srv


@pytest.fixture(scope="session")
def channel(server: LocalServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(
        server.target, options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    ) as ch:
        yield ch

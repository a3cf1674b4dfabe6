"""The demo's online trainer: publishes the rows it trains to Kafka and refreshes the entry on its own; ``demo run
--no-trainer`` turns it off (benchmarks and tests need a PS only they write to)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedgate.cli import build_parser
from embedgate.demo_stack import DemoStack
from schemas.deltas import delta_topic
from schemas.manifest import Manifest
from tests.support.kafka import kafka_broker

_REPO = Path(__file__).resolve().parents[2]


def test_no_trainer_flag() -> None:
    assert build_parser().parse_args(["demo", "run", "--no-trainer"]).trainer is False
    assert build_parser().parse_args(["demo", "run"]).trainer is True
    stack = DemoStack(workdir=Path("/nonexistent"), trainer=False)
    stack.start_trainer("127.0.0.1:1")  # asked not to: starts nothing
    assert stack.children == []


def test_drifting_stream_moves_the_clicks() -> None:
    from embedgate.export.demo import _group
    from embedgate.train.demo import drifting_examples

    rates = []
    for t in (0.0, 130.0):
        inst, labels = drifting_examples(4000, 1000, 1, t, drift_period_s=120)
        items = np.asarray([i["item_id"] for i in inst])
        rates.append([float(labels[_group(items) == g].mean()) for g in range(5)])
    assert int(np.argmax(rates[0])) == 0 and int(np.argmax(rates[1])) == 1


@pytest.mark.integration
def test_trainer_streams_rows_and_refreshes_the_entry(demo_artifacts: Any, tmp_path: Path) -> None:
    models = tmp_path / "models"
    shutil.copytree(demo_artifacts.root, models, symlinks=True)
    name = demo_artifacts.manifest.model_name
    with kafka_broker(tmp_path / "kafka") as broker:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "embedgate.train.demo",
                "--models",
                str(models),
                "--name",
                name,
                "--bootstrap",
                broker.bootstrap,
                "--max-seconds",
                "8",
                "--entry-every-s",
                "2",
            ],
            cwd=_REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        from embedgate.export.streamcut import kafka_stream_cut

        cut, missing = kafka_stream_cut(broker.bootstrap, [delta_topic(name)])
    assert not missing and sum(cut.values()) > 0  # rows were published
    m = Manifest.load(models / name)
    assert m.ps_version == demo_artifacts.manifest.version and m.version > m.ps_version  # entry refreshed
    assert (models / name / "entry" / str(m.version)).is_dir()

"""`embedgate` lists every command, and building the parser stays light (no TensorFlow, no servers)."""

from __future__ import annotations

import subprocess
import sys

from embedgate.cli import build_parser

COMMANDS = {
    "export",
    "demo-model",
    "tables",
    "placement",
    "helm-values",
    "deploy",
    "serve-local",
    "gateway",
    "updater",
    "publish",
    "kafka",
    "demo",
}


def test_every_command_is_registered() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == COMMANDS  # type: ignore[union-attr]


def test_help_does_not_import_tensorflow() -> None:
    code = (
        "import sys\n"
        "from embedgate.cli import build_parser\n"
        "build_parser()\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr

"""Rewrites ``tests/module_seconds.json`` (seconds per test file, longest first) from the output of a run with
``--durations=0``, e.g. ``make test PYTEST_ARGS=--durations=0 | tee run.log`` then
``python -m tests.support.module_seconds run.log``. ``tests/conftest.py`` starts the longest files first, so that
pytest-xdist's workers end on short files; refresh it when the suite's shape changes (a file not listed runs last)."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

PATH = Path(__file__).resolve().parents[1] / "module_seconds.json"
_LINE = re.compile(r"([\d.]+)s (setup|call|teardown)\s+(tests/\S+?\.py)::")


def module_seconds(log: str, at_least: float = 5.0) -> dict[str, int]:
    """Seconds per test file in a ``--durations=0`` report (files under ``at_least`` seconds left out)."""
    per: Counter[str] = Counter()
    for line in log.splitlines():
        if m := _LINE.match(line):
            per[m.group(3)] += float(m.group(1))
    return {f: round(t) for f, t in per.most_common() if t >= at_least}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.support.module_seconds RUN_LOG", file=sys.stderr)
        return 2
    seconds = module_seconds(Path(argv[0]).read_text(encoding="utf-8", errors="replace"))
    PATH.write_text(json.dumps(seconds, indent=1) + "\n", encoding="utf-8")
    print(f"{PATH}: {len(seconds)} files, {sum(seconds.values())} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

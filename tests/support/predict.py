"""What the served-model tests send and read as a TF Serving client would: a REST predict call, its predictions as
one flat array, and one instance as a base64 ``tf.Example``."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import numpy as np

__all__ = ["Answer", "Kind", "PredictLoop", "example_b64", "post_predict", "predictions"]

Kind = Literal["bytes", "int64", "float"]


def post_predict(url: str, model: str, body: Mapping[str, Any], *, timeout: float = 60) -> httpx.Response:
    """``POST {url}/v1/models/{model}:predict`` with ``body`` as JSON; the response as it came."""
    return httpx.post(f"{url}/v1/models/{model}:predict", content=json.dumps(body), timeout=timeout)


def predictions(r: httpx.Response, output: str | None = None) -> np.ndarray:
    """The response's predictions (row format) or outputs (columnar) as one flat float64 array; ``output`` picks one
    named output of each row's object. Fails the test, showing the body, unless the status is 200."""
    assert r.status_code == 200, r.text
    doc = r.json()
    preds = doc["predictions"] if "predictions" in doc else doc["outputs"]
    if output is not None:
        preds = [p[output] if isinstance(p, dict) else p for p in preds]
    return np.asarray(preds, np.float64).reshape(-1)


def example_b64(inst: Mapping[str, Any], kinds: Mapping[str, Kind] | None = None) -> str:
    """``inst`` as a client writes it into a base64 ``tf.Example``. A feature named in ``kinds`` takes that list kind;
    otherwise strings go to ``bytes_list``, ints to ``int64_list`` and floats to ``float_list``, a list taking the kind
    of its first value. An empty list not named in ``kinds`` has no kind, so it is refused (ValueError), not guessed."""
    from schemas.proto import tfs_pb2

    ex = tfs_pb2.Example()
    for name, value in inst.items():
        values = value if isinstance(value, list) else [value]
        kind = (kinds or {}).get(name) or _kind_of(name, values)
        feature = ex.features.feature[name]
        if kind == "bytes":
            feature.bytes_list.value.extend(v.encode() for v in values)
        elif kind == "float":
            feature.float_list.value.extend(values)
        else:
            feature.int64_list.value.extend(values)
    return base64.b64encode(ex.SerializeToString()).decode()


def _kind_of(name: str, values: list[Any]) -> Kind:
    if not values:
        raise ValueError(f"feature {name!r}: an empty list has no kind; name it in kinds")
    if isinstance(values[0], str):
        return "bytes"
    return "float" if isinstance(values[0], float) else "int64"


@dataclass(frozen=True)
class Answer:
    """One predict answer as a client saw it."""

    status: int
    degraded: str | None  # the X-Embedgate-Degraded header
    preds: np.ndarray | None  # the predictions, flat float64, of a 200
    error: str  # the error text of anything else ("" for a 200)


@dataclass
class PredictLoop:
    """Posts ``body`` to ``model``'s REST predict in a loop bounded by ``max_requests`` (per ``run``) and ``max_seconds``, until
    ``stop`` is set; every answer is recorded in order. Run it from one thread or several (``run`` is the target)."""

    url: str
    model: str
    body: bytes
    max_requests: int
    max_seconds: float
    answers: list[Answer] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        end = time.monotonic() + self.max_seconds
        with httpx.Client(timeout=60.0) as client:
            for _ in range(self.max_requests):
                if self.stop.is_set() or time.monotonic() > end:
                    return
                answer = _answer(client.post(f"{self.url}/v1/models/{self.model}:predict", content=self.body))
                with self._lock:
                    self.answers.append(answer)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.answers)

    def since(self, start: int) -> list[Answer]:
        """The answers recorded from index ``start`` on (a copy)."""
        with self._lock:
            return self.answers[start:]

    def wait_until(self, what: str, done: Callable[[], bool], timeout: float) -> None:
        """Polls ``done`` until it holds; AssertionError naming ``what`` and the last answers after ``timeout`` s."""
        end = time.monotonic() + timeout
        while not done():
            if time.monotonic() > end:
                tail = [(a.status, a.degraded, a.error[:200]) for a in self.since(max(self.count - 10, 0))]
                raise AssertionError(f"{what}: not within {timeout} s; last answers {tail}")
            time.sleep(0.05)


def _answer(r: httpx.Response) -> Answer:
    degraded = r.headers.get("X-Embedgate-Degraded")
    if r.status_code == 200:
        return Answer(200, degraded, predictions(r), "")
    try:
        error = str(r.json().get("error", r.text))
    except ValueError:
        error = r.text
    return Answer(r.status_code, degraded, None, error)

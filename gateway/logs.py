"""Logging: JSON lines (or plain text) with the current request id."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time

__all__ = ["REQUEST_ID", "configure_logging"]

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")

_STD = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = REQUEST_ID.get()
        if rid:
            doc["request_id"] = rid
        for k, v in vars(record).items():
            if k not in _STD and not k.startswith("_"):
                doc[k] = v
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        rid = REQUEST_ID.get()
        base = super().format(record)
        return f"{base} request_id={rid}" if rid else base


def configure_logging(fmt: str, level: str) -> None:
    """Root logger to stderr in ``fmt`` ("json" | "text"); uvicorn's loggers propagate to it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonFormatter()
        if fmt == "json"
        else _TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # our access log carries the request id

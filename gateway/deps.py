"""Annotated dependency aliases: handlers get the app's Runtime (owned by the lifespan) as typed state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.lifespan import Runtime

__all__ = ["RuntimeDep", "get_runtime"]


def get_runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]

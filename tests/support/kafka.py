"""A real single-node Kafka broker for tests (``embedgate.devkafka``): ``with kafka_broker(workdir) as b: b.bootstrap``.

``secure=SecureListener(...)`` adds an SSL or SASL_SSL listener at ``b.secure_bootstrap`` (certificates from
:mod:`tests.support.certs`). ``with restartable_broker(workdir) as b`` gives a broker that fault tests can
``b.kill()`` (SIGKILL) and ``b.restart()`` on its data, same ports and cluster id."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from embedgate.devkafka import BrokerError, KafkaBroker, SecureListener
from tests.support.ports import free_port

__all__ = ["Broker", "RestartableBroker", "SecureListener", "kafka_broker", "restartable_broker"]

Broker = KafkaBroker
_BIND_ATTEMPTS = 5


@contextmanager
def kafka_broker(
    workdir: Path, *, timeout_s: float = 90.0, secure: SecureListener | None = None
) -> Iterator[KafkaBroker]:
    """Start a broker with fresh storage in ``workdir`` on free ports; stop exactly its process on exit."""
    broker = KafkaBroker(workdir, secure=secure)
    broker.start(timeout_s=timeout_s)
    try:
        yield broker
    finally:
        broker.stop()


class RestartableBroker:
    """One broker's life across crashes: ``kill()`` SIGKILLs its process group (no shutdown, no flush: what a
    crash or the OOM killer does), ``restart()`` starts a new broker process on the same data directory, ports and
    cluster id. ``bootstrap`` stays valid across restarts; ``broker`` is the current process's
    :class:`~embedgate.devkafka.KafkaBroker`. Not thread-safe."""

    def __init__(self, workdir: Path, *, timeout_s: float = 90.0) -> None:
        self.workdir = Path(workdir)
        self.timeout_s = timeout_s
        self.broker = KafkaBroker(self.workdir)
        self.restarts = 0

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    @property
    def cluster_id(self) -> str | None:
        return self.broker.cluster_id

    def start(self) -> None:
        self.broker.start(timeout_s=self.timeout_s)

    def kill(self) -> int:
        """SIGKILL the running broker's process group and reap it; returns its exit status (``-SIGKILL``)."""
        proc = self.broker.proc
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"the broker in {self.workdir} is not running")
        os.killpg(proc.pid, signal.SIGKILL)  # devkafka starts it in its own session: pgid == pid
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"broker pid {proc.pid} still alive 30 s after SIGKILL") from exc
        self.broker.stop()  # bookkeeping only (pid file, state): the process is gone
        return code

    def restart(self) -> None:
        """Start a new broker process on the data of the previous one (which must be stopped or killed); raises
        ``RuntimeError`` if the storage was not reused (a new cluster id would mean the data is gone)."""
        old = self.broker
        if old.proc is not None and old.proc.poll() is None:
            raise RuntimeError("restart() while the broker still runs: kill() or stop() it first")
        for attempt in range(_BIND_ATTEMPTS):
            # The clients' port stays; the controller port (used by this broker alone) is a new free one each time:
            # a port freed by the crash can be taken meanwhile (e.g. as the local port of a client reconnecting).
            new = KafkaBroker(
                self.workdir,
                port=old.port,
                controller_port=free_port(),
                heap_mb=old.heap_mb,
                cache_dir=old.cache_dir,
                partitions=old.partitions,
                fresh=False,
            )
            self.broker = new
            try:
                new.start(timeout_s=self.timeout_s)
                break
            except BrokerError as exc:
                if "Address already in use" not in str(exc) or attempt == _BIND_ATTEMPTS - 1:
                    raise
                time.sleep(1.0)
        if not new.reused or new.cluster_id != old.cluster_id:
            raise RuntimeError(
                f"restarted broker did not reuse its data: cluster id {old.cluster_id} -> {new.cluster_id}"
            )
        self.restarts += 1

    def stop(self) -> None:
        if self.broker.proc is not None:
            self.broker.stop()


@contextmanager
def restartable_broker(workdir: Path, *, timeout_s: float = 90.0) -> Iterator[RestartableBroker]:
    """A fresh broker in ``workdir`` on free ports that can be killed and restarted on its data; stopped on exit."""
    broker = RestartableBroker(workdir, timeout_s=timeout_s)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()

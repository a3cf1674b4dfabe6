"""Two replicas of every PS shard, kept fresh by the updater: the stack that the soak and the hostile audit start.

Kafka, serve-local A (the entry and every PS shard) and serve-local B (the PS shards only) on 127.0.0.1, and the
updater writing both; B can be SIGKILLed and started again on the same export and port.
"""

from __future__ import annotations

import signal
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedgate.devkafka import KafkaBroker
from tests.support.kafka import kafka_broker
from tests.support.ports import free_port
from tests.support.servers import LocalServer, serve_local
from tests.support.stack import UpdaterProc, embedding_model, exported_backends, run_updater

__all__ = ["TwoReplicas", "start_two_replicas"]


@dataclass
class TwoReplicas:
    """The running parts; ``model`` is the updater's (and a gateway's) model entry naming A and B for every shard."""

    stack: ExitStack
    model_dir: Path
    broker: KafkaBroker
    a: LocalServer
    b: LocalServer
    b_port: int
    model: dict[str, Any]
    updater: UpdaterProc

    def kill_b(self) -> None:
        """SIGKILL replica B and wait for it to be gone."""
        self.b.proc.send_signal(signal.SIGKILL)
        self.b.proc.wait(30)

    def start_b(self) -> LocalServer:
        """Start replica B again on the same export and port (bounded waits in serve_local); the new B, also kept in
        ``b``. It stops with ``stack``."""
        self.b = self.stack.enter_context(
            serve_local(exported_backends(self.model_dir, entry=False), port=self.b_port)
        )
        return self.b


def start_two_replicas(stack: ExitStack, work: Path, model_dir: Path, num_shards: int) -> TwoReplicas:
    """Start Kafka (under ``work``/kafka), A, B and the updater (its files under ``work``), each stopped by ``stack``."""
    broker = stack.enter_context(kafka_broker(work / "kafka"))
    a = stack.enter_context(serve_local(exported_backends(model_dir)))
    b_port = free_port()
    b = stack.enter_context(serve_local(exported_backends(model_dir, entry=False), port=b_port))
    replicas = [a.target, f"127.0.0.1:{b_port}"]
    model = embedding_model(model_dir, entry=a.target, shards=[replicas] * num_shards)
    updater = stack.enter_context(
        run_updater({"models": [model], "bootstrap_servers": broker.bootstrap}, work, tag="updater")
    )
    return TwoReplicas(stack, model_dir, broker, a, b, b_port, model, updater)

"""embedgate's streaming update path (never imports TensorFlow).

Modules: :mod:`updater.consumer` (the ``embedgate updater`` process: builds the clients, runs the loop),
:mod:`updater.loop` (the consumer loop over injected seams), :mod:`updater.kafka_client` (what the loop uses of
Kafka), :mod:`updater.ingest` (decode, validate, group), :mod:`updater.scheduler` (which writes are due, backoff,
pauses), :mod:`updater.deadletter` (the dead-letter topic), :mod:`updater.ledger` (safe commit offsets),
:mod:`updater.apply` (PS writes), :mod:`updater.batch` (shard split + newest-wins coalescing),
:mod:`updater.replicas` (replica stream positions), :mod:`updater.catchup` (replaying one replica that fell
behind), :mod:`updater.producer` (trainer-side publisher), :mod:`updater.errors` (gRPC and Kafka error tables),
:mod:`updater.resume` (where a never-committed partition starts),
:mod:`updater.membership` (refusing a group in use by another model list), :mod:`updater.metrics`, :mod:`updater.cli`. Nothing is imported here, so ``embedgate``'s command parser stays light.
"""

__all__: list[str] = []

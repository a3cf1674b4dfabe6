"""The demo's online trainer: ``python -m embedgate.train.demo`` (started by ``embedgate demo run``).

It keeps training the demo model (``<models>/demo.keras``, the model ``embedgate demo-model`` exported) on a
synthetic click stream whose preferences drift: every ``drift_period_s`` seconds another fifth of the items (one
"taste group") is in fashion, and clicks on it become likely. Every batch it publishes the rows that changed with
:class:`~embedgate.train.StreamRows` (Kafka -> updater -> PS), and every ``entry_every_s`` seconds it writes a new
entry version with the current dense weights (entry-only export). So a prediction through the gateway moves without
anyone touching the server.

It trains ``examples_per_s`` examples per second (default 256, in batches of 128) on one TensorFlow thread: light
enough to leave the machine to the serving side. SIGTERM or SIGINT stops it after the current batch, with every row
it trained acknowledged by Kafka.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["drifting_examples", "main"]

log = logging.getLogger("embedgate.train.demo")
_GROUPS = 5


def drifting_examples(
    n: int, vocab: int, seed: int, t_s: float, drift_period_s: float
) -> tuple[list[dict[str, Any]], npt.NDArray[np.float32]]:
    """``n`` demo examples at stream time ``t_s``: the demo's planted signal, plus the items of the taste group in
    fashion at ``t_s`` (group ``(t_s // drift_period_s) % 5``) clicked with probability 0.85."""
    from embedgate.export.demo import _group, make_examples

    instances, labels = make_examples(n, vocab, seed)
    fashion = int(t_s // drift_period_s) % _GROUPS
    items = np.asarray([i["item_id"] for i in instances], np.int64)
    rng = np.random.default_rng(seed + 1)
    hot = _group(items) == fashion
    labels = np.where(hot, (rng.uniform(size=n) < 0.85).astype(np.float32), labels)
    return instances, labels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m embedgate.train.demo", description=__doc__.splitlines()[0])
    p.add_argument("--models", type=Path, required=True, help="directory holding demo/ and demo.keras")
    p.add_argument("--name", default="demo")
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--examples-per-s", type=float, default=256.0)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--entry-every-s", type=float, default=60.0)
    p.add_argument("--drift-period-s", type=float, default=120.0)
    p.add_argument("--learning-rate", type=float, default=0.05)
    p.add_argument(
        "--max-seconds", type=float, default=0.0, help="stop after this long (0: run until signalled)"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    stopping = False

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    import keras
    import tensorflow as tf

    import embedgate.export.layers  # noqa: F401  (registers EmbeddingPooling for loading the .keras file)
    from embedgate.export.demo import demo_declaration
    from embedgate.export.instances import to_keras_inputs
    from embedgate.train import StreamRows
    from schemas.manifest import Manifest

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    model_dir = args.models / args.name
    manifest = Manifest.load(model_dir)
    vocab = manifest.table("user_emb").rows
    decl = demo_declaration(args.name)
    model = keras.saving.load_model(args.models / f"{args.name}.keras")
    model.compile(optimizer=keras.optimizers.Adagrad(args.learning_rate), loss="binary_crossentropy")
    shapes = {t.name: tuple(t.shape) for t in model.inputs}
    stream = StreamRows(
        model_dir,
        args.bootstrap,
        model=model,
        every_n_batches=1,
        entry_every_s=args.entry_every_s,
        declaration=decl,
        export_root=args.models,
        log_every=20,
        producer_id="demo-trainer",
    )
    started = time.monotonic()
    step = 0
    chunk = max(args.batch, int(args.examples_per_s))
    with stream:
        log.info("online trainer started", extra={"model": args.name, "examples_per_s": args.examples_per_s})
        while not stopping and not (args.max_seconds and time.monotonic() - started > args.max_seconds):
            t0 = time.monotonic()
            instances, labels = drifting_examples(
                chunk, vocab, 10_000 + step, t0 - started, args.drift_period_s
            )
            x = to_keras_inputs(instances, decl, shapes)
            model.fit(x, labels, batch_size=args.batch, epochs=1, verbose=0, callbacks=[stream])
            step += 1
            if step % 10 == 0:
                st = stream.publisher.stats()
                print(
                    f"trained {step * chunk} examples; published {st.rows} rows in {st.messages} messages; "
                    f"entry versions {stream.entry_versions[-3:]}",
                    flush=True,
                )
            time.sleep(max(0.0, chunk / args.examples_per_s - (time.monotonic() - t0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

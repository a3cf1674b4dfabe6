"""Training-step time of the demo model with and without ``StreamRows`` (issue 18's target: overhead <= 10 %).

``python -m benchmarks.stream_rows_bench [--rounds 3] [--steps 20] [--batch 1024] [--vocab 100000]``

Builds the demo model (untrained, ``vocab`` ids in the user and item tables, dim 16), exports it, starts a real Kafka
broker on 127.0.0.1, then alternates, ``rounds`` times: ``steps`` training steps of ``model.fit`` at ``batch``
without a callback, and ``steps`` steps with ``StreamRows(every_n_batches=N)`` publishing every changed row (Adam:
every row that ever had a gradient keeps moving). Prints the time per step of each, the ratio per round, its median
and spread, and the rows published. Everything runs in one process on the same cores (the publisher's thread
included), as in a trainer.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _fit_time(model: Any, x: Any, y: Any, batch: int, callbacks: list[Any]) -> float:
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=100_000)
    p.add_argument("--every-n-batches", type=int, default=None, help="publish every N batches")
    p.add_argument(
        "--every-s",
        type=float,
        default=None,
        help="publish every S seconds (neither flag: the callback's default)",
    )
    args = p.parse_args(argv)

    import keras

    from embedgate.devkafka import KafkaBroker
    from embedgate.export.demo import _build_model, demo_declaration, make_examples
    from embedgate.export.exporter import export_model
    from embedgate.export.instances import to_keras_inputs
    from embedgate.train import StreamRows

    with tempfile.TemporaryDirectory(prefix="stream-rows-bench-") as tmp:
        root = Path(tmp)
        decl = demo_declaration("bench")
        model = _build_model(args.vocab, 0)
        export_model(model, decl, root / "models", num_shards=2, self_check=False)
        shapes = {t.name: tuple(t.shape) for t in model.inputs}
        n = args.steps * args.batch
        inst, y = make_examples(n, args.vocab, 1)
        x = to_keras_inputs(inst, decl, shapes)
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
        _fit_time(model, x, y, args.batch, [])  # warm-up: tracing, optimizer slots
        broker = KafkaBroker(root / "kafka")
        broker.start()
        try:
            stream = StreamRows(
                root / "models" / "bench",
                broker.bootstrap,
                model=model,
                every_n_batches=args.every_n_batches,
                every_s=args.every_s,
                log_every=0,
            )
            with stream:
                _fit_time(model, x, y, args.batch, [stream])  # warm-up with the callback (topic creation)
                ratios = []
                for r in range(args.rounds):
                    base = _fit_time(model, x, y, args.batch, []) / args.steps
                    rows_before = stream.rows_published
                    withcb = _fit_time(model, x, y, args.batch, [stream]) / args.steps
                    rows = stream.rows_published - rows_before
                    ratios.append(withcb / base)
                    print(
                        f"round {r}: step {base * 1000:.1f} ms without, {withcb * 1000:.1f} ms with StreamRows "
                        f"(x{withcb / base:.3f}); {rows / args.steps:.0f} rows published per step",
                        flush=True,
                    )
                st = stream.publisher.stats()
        finally:
            broker.stop()
    print(
        f"StreamRows overhead at batch {args.batch}, vocab {args.vocab}, publishing {_cadence(args)}: "
        f"median x{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}); "
        f"publisher blocked {st.blocked_s:.2f} s in total, {st.rows} rows in {st.messages} messages"
    )
    return 0


def _cadence(args: argparse.Namespace) -> str:
    parts = []
    if args.every_n_batches is not None:
        parts.append(f"every {args.every_n_batches} batch(es)")
    if args.every_s is not None:
        parts.append(f"every {args.every_s:g} s")
    return " and ".join(parts) or "at the callback's default cadence (every second)"


if __name__ == "__main__":
    raise SystemExit(main())

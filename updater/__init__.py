"""embedgate's streaming update path (never imports TensorFlow).

Modules: :mod:`updater.consumer` (the ``embedgate updater`` loop), :mod:`updater.apply` (PS writes),
:mod:`updater.batch` (shard split + last-wins coalescing), :mod:`updater.producer` (trainer-side publisher),
:mod:`updater.errors`, :mod:`updater.metrics`, :mod:`updater.cli`. Nothing is imported here, so ``embedgate``'s
command parser stays light.
"""

__all__: list[str] = []

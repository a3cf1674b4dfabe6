"""Exporter: Keras model -> ``entry`` + sharded ``ps_<i>`` SavedModels + manifest; HPS table files; demo; placement.

Submodules are imported on use (TensorFlow is heavy): ``embedgate.export.exporter``, ``.ps``, ``.tables``,
``.declaration``, ``.layers``, ``.pooling``, ``.instances``, ``.demo``, ``.placement``, ``.streamcut``
(the Kafka stream cut a snapshot contains), ``.cli``.
"""

__all__: list[str] = []

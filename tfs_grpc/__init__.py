"""TF Serving over gRPC, shared by the gateway and the updater (never imports TensorFlow, FastAPI or aiokafka).

:mod:`tfs_grpc.channels` is the one channel/stub factory both sides use (``schemas/`` holds the pure contracts and
stays free of gRPC); each side maps gRPC's errors to its own tree at its boundary.
"""

__all__: list[str] = []

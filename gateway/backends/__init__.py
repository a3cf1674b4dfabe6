"""gRPC backends: channels (one per target), clients with deadlines, replica failover, grpc error translation."""

from gateway.backends.channels import open_channel
from gateway.backends.client import BackendClient, CallObserver, ReplicaSet
from gateway.backends.errors import error_from_rpc, map_grpc_errors

__all__ = ["BackendClient", "CallObserver", "ReplicaSet", "error_from_rpc", "map_grpc_errors", "open_channel"]
